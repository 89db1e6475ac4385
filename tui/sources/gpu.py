"""GPU sampler: NVIDIA over NVML (nvidia-ml-py's `pynvml`), AMD and Intel from the kernel's sysfs
(tui.sources.sysfs_gpu), one GpuReport for all of them, NVML's GPUs first. Never raises: what a GPU cannot
say is None. The energy counter (NVML's total energy since the driver loaded, in mJ; hwmon's energy1_input,
in µJ) is reported in joules as `energy_j`; the store turns its change into energy over a window.

Error policy follows nvitop's `nvmlQuery`: NotSupported / NoPermission / other NVML errors make that one
field None; FunctionNotFound (driver older than the binding) makes the field None, is logged once and the
function is not called again; GpuIsLost turns that GPU's sample into an error while the others continue.

Unified memory (DGX Spark's GB10, Jetson): NVML answers NotSupported for the GPU's memory while everything
else answers. Such a GPU is said `unified_memory` (also by its name), its VRAM figures stay None (the host's
RAM is its memory) and its processes' memory is None where NVML gives none, never 0.

NVML lists processes by their host PID. One that no watched engine's tree holds is looked up in /proc: the
container it runs in, if any (tui.sources.container_of), once per PID per sample.
"""

from __future__ import annotations

import ctypes
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from tui.model.samples import (
    REAL_THROTTLE_MASK,
    THROTTLE_REASON_WORDS,
    GpuProcess,
    GpuReport,
    GpuSample,
)
from tui.sources.container_of import container_of
from tui.sources.sysfs_gpu import SysfsGpus

log = logging.getLogger(__name__)

# A missing driver does not appear while the dashboard runs, so probing for it every sample is waste.
INIT_RETRY_S = 30.0

SOURCE_GPM = "gpm"
SOURCE_UTIL = "util.memory x peak"

_KNOWN_REASON_BITS = sum(THROTTLE_REASON_WORDS)  # distinct single bits, so the sum is their OR

# Names of GPUs whose memory is the host's (as llmtop reads them): said unified even where NVML answers.
# Whole words: "GB10" is not "GB100"
UNIFIED_NAMES = re.compile(r"\b(GB10|Jetson|Orin|Thor|Xavier|Tegra)\b", re.IGNORECASE)


NO_LIBRARY = "NVML Shared Library Not Found"  # pynvml's words for NVML_ERROR_LIBRARY_NOT_FOUND


def nvml_library_loads() -> bool:
    """Whether NVML's library loads here, as pynvml loads it on Linux (libnvidia-ml.so.1); elsewhere pynvml
    is asked (it looks in the places Windows drivers put nvml.dll)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


class _Lost(Exception):
    """The GPU under a handle answered NVML_ERROR_GPU_IS_LOST."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class _Device:
    """Per-GPU state kept between samples: static facts and the previous GPM sample."""

    handle: Any = None
    static_done: bool = False
    name: str | None = None
    uuid: str | None = None
    peak_bw_gbps: float | None = None
    gpm_supported: bool | None = None
    gpm_prev: Any = None  # the last c_nvmlGpmSample_t, baseline for the next DRAM_BW_UTIL reading


def throttle_words(mask: int) -> tuple[str, ...]:
    """Every active clock event reason in words; unknown bits as hex so nothing is silently dropped."""
    words = [word for bit, word in THROTTLE_REASON_WORDS.items() if mask & bit]
    unknown = mask & ~_KNOWN_REASON_BITS
    if unknown:
        words.append(f"other reason bits {unknown:#x}")
    return tuple(words)


def peak_bandwidth_gbps(max_mem_clock_mhz: float | None, bus_width_bits: float | None) -> float | None:
    """Theoretical DRAM bandwidth in GB/s: max memory clock x 2 (double data rate) x bus width / 8."""
    if not max_mem_clock_mhz or not bus_width_bits:
        return None
    return max_mem_clock_mhz * 1e6 * 2 * bus_width_bits / 8 / 1e9


class GpuSampler:
    """Samples every NVIDIA GPU. Thread-safe: the dashboard's polling loop and a switch's drain step sample
    the same sampler at once, and each sample frees the previous GPM buffer, so `sample()` and `close()`
    run one at a time (a lock) or a buffer would be freed twice.

    `nvml` is the `pynvml` module (default) or a stand-in exposing the same names (tests).
    `clock` is injectable so the init-retry interval can be checked without sleeping.
    `sysfs`: the AMD and Intel reader (default: under ENGINETOP_SYSFS_ROOT or /sys); False reads none.
    `proc_root`: where the containers of processes no engine owns are looked up (/proc, or a tree like it).
    """

    def __init__(
        self, nvml: ModuleType | Any | None = None, clock: Callable[[], float] = time.monotonic,
        sysfs: SysfsGpus | bool = True, proc_root: str = "/proc",
    ) -> None:
        self._nvml: Any = nvml  # pynvml, or a stand-in with the same names: duck-typed
        self._clock = clock
        self._sysfs: SysfsGpus | None = (SysfsGpus(clock=clock) if sysfs is True else sysfs or None)
        self._initialized = False
        self._unavailable: str | None = None
        self._next_init_try = float("-inf")
        self._driver_version: str | None = None
        self._devices: list[_Device] = []
        self._missing: set[str] = set()  # functions the driver lacks (FunctionNotFound)
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._proc_root = proc_root
        self._containers: dict[int, str | None] = {}  # this sample's: PID -> "runtime short-id" or None

    # ---- public -------------------------------------------------------------------------------------

    def sample(self, engine_pids: dict[str, set[int]] | None = None) -> GpuReport:
        """All GPUs now. `engine_pids`: engine name -> its process-tree PIDs (host.engine_tree_pids)."""
        with self._lock:
            return self._sample(engine_pids)

    def close(self) -> None:
        """Free the GPM samples held between calls and shut NVML down. Safe to call more than once."""
        with self._lock:
            self._close()

    # ---- under the lock -----------------------------------------------------------------------------

    def _sample(self, engine_pids: dict[str, set[int]] | None) -> GpuReport:
        now = self._clock()
        pids = engine_pids or {}
        self._containers = {}  # a PID's container is read once per sample (a PID may be reused after)
        try:
            nvidia: tuple[GpuSample, ...] = ()
            if self._ensure_init(now):
                nvidia = tuple(self._sample_device(i, dev, pids) for i, dev in enumerate(self._devices))
        except Exception as exc:  # never let a binding surprise take the dashboard down
            log.exception("GPU sampling failed")
            self._unavailable = f"GPU sampling failed ({type(exc).__name__}: {exc}): GPU panel off"
            nvidia = ()
        others = self._sample_sysfs(pids, len(nvidia))
        if not nvidia and not others:
            return GpuReport(t=now, unavailable=self._none_found())
        return GpuReport(t=now, gpus=nvidia + others, driver_version=self._driver_version if nvidia else None)

    def _none_found(self) -> str:
        """NVML's reason, and that no AMD or Intel GPU was found either, in one line."""
        reason = self._unavailable or "no NVIDIA GPU: GPU panel off"
        if self._sysfs is None:
            return reason
        where = self._sysfs.root / "class" / "drm"
        return reason.replace(": GPU panel off", f"; no AMD or Intel GPU in {where}: GPU panel off")

    def _sample_sysfs(self, pids: dict[str, set[int]], first: int) -> tuple[GpuSample, ...]:
        if self._sysfs is None:
            return ()
        try:
            return tuple(self._sysfs.sample(pids, first))
        except Exception:  # a surprise in sysfs: the NVIDIA GPUs are still shown
            log.exception("sysfs GPU sampling failed")
            return ()

    def _close(self) -> None:
        if not self._initialized:
            return
        for dev in self._devices:
            self._drop_gpm(dev)
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)
        self._initialized = False
        self._devices = []
        self._next_init_try = float("-inf")

    # ---- init ---------------------------------------------------------------------------------------

    def _ensure_init(self, now: float) -> bool:
        if self._initialized:
            return True
        if now < self._next_init_try:
            return False
        self._next_init_try = now + INIT_RETRY_S
        if self._nvml is None:
            if not nvml_library_loads():
                # pynvml's own words for it, without importing pynvml (1.7 MiB held for the whole session)
                self._unavailable = f"no NVIDIA driver found (NVML: {NO_LIBRARY}): GPU panel off"
                return False
            try:
                import pynvml
            except ImportError as exc:
                self._unavailable = f"nvidia-ml-py is not installed ({exc}): GPU panel off"
                return False
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as exc:
            self._unavailable = f"no NVIDIA driver found (NVML: {exc}): GPU panel off"
            return False
        except nvml.NVMLError as exc:
            self._unavailable = f"NVIDIA driver unusable (NVML: {exc}): GPU panel off"
            return False
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown_quietly()
            self._unavailable = f"cannot count GPUs (NVML: {exc}): GPU panel off"
            return False
        if count == 0:
            self._shutdown_quietly()
            self._unavailable = "no NVIDIA GPU found (NVML sees 0 devices): GPU panel off"
            return False
        self._initialized = True
        self._unavailable = None
        self._devices = [_Device() for _ in range(count)]
        try:
            self._driver_version = _text(self._query("nvmlSystemGetDriverVersion"))
        except _Lost:
            self._driver_version = None
        return True

    def _shutdown_quietly(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    # ---- one query, nvitop-style ----------------------------------------------------------------------

    def _query(self, fn_name: str, *args: Any) -> Any:
        """nvml.<fn_name>(*args), or None when the GPU or driver cannot answer. GpuIsLost -> _Lost."""
        return self._query_why(fn_name, *args)[0]

    def _query_why(self, fn_name: str, *args: Any) -> tuple[Any, Exception | None]:
        """(nvml.<fn_name>(*args), None), or (None, the NVML error that stood for the answer)."""
        if fn_name in self._missing:
            return None, None
        nvml = self._nvml
        fn = getattr(nvml, fn_name, None)
        if fn is None:  # the binding itself is older than the call
            self._missing.add(fn_name)
            log.warning("nvidia-ml-py has no %s; that field stays n/a", fn_name)
            return None, None
        try:
            return fn(*args), None
        except nvml.NVMLError_GpuIsLost as exc:
            raise _Lost(exc) from exc
        except nvml.NVMLError_FunctionNotFound as exc:
            self._missing.add(fn_name)
            log.warning(
                "NVML driver lacks %s (driver older than nvidia-ml-py); that field stays n/a", fn_name
            )
            return None, exc
        except nvml.NVMLError as exc:
            key = (fn_name, type(exc).__name__)
            if key not in self._logged:  # NotSupported / NoPermission are normal on many GPUs
                self._logged.add(key)
                log.info("NVML %s: %s; that field stays n/a", fn_name, exc)
            return None, exc

    def _query_first(self, *calls: tuple[Any, ...]) -> Any:
        """The first call whose function exists in the driver; later ones only after FunctionNotFound."""
        for fn_name, *args in calls:
            value = self._query(fn_name, *args)
            if value is not None or fn_name not in self._missing:
                return value
        return None

    # ---- one GPU ------------------------------------------------------------------------------------

    def _sample_device(self, index: int, dev: _Device, engine_pids: dict[str, set[int]]) -> GpuSample:
        t = self._clock()
        try:
            return self._read_device(index, dev, engine_pids, t)
        except _Lost as lost:
            self._drop_gpm(dev)
            dev.handle = None  # a reset GPU may come back under a new handle
            return GpuSample(index=index, t=t, name=dev.name, uuid=dev.uuid, error=f"GPU lost (NVML: {lost})",
                             vendor="NVIDIA", driver="nvml")
        except Exception as exc:
            log.exception("GPU %d sampling failed", index)
            return GpuSample(index=index, t=t, name=dev.name, uuid=dev.uuid,
                             error=f"GPU sampling failed ({type(exc).__name__}: {exc})", vendor="NVIDIA",
                             driver="nvml")

    def _read_device(self, index: int, dev: _Device, engine_pids: dict[str, set[int]], t: float) -> GpuSample:
        nvml = self._nvml
        if dev.handle is None:
            try:
                dev.handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError_GpuIsLost as exc:
                raise _Lost(exc) from exc
            except nvml.NVMLError as exc:
                return GpuSample(index=index, t=t, error=f"no handle for this GPU (NVML: {exc})")
        h = dev.handle
        if not dev.static_done:
            self._read_static(dev)

        util = self._query("nvmlDeviceGetUtilizationRates", h)
        util_gpu = float(util.gpu) if util is not None else None
        util_mem = float(util.memory) if util is not None else None
        power_mw = self._query("nvmlDeviceGetPowerUsage", h)
        energy_mj = self._query("nvmlDeviceGetTotalEnergyConsumption", h)  # mJ since driver load; Volta+
        limit_mw = self._query("nvmlDeviceGetEnforcedPowerLimit", h)
        temp = self._query_first(
            ("nvmlDeviceGetTemperatureV", h, nvml.NVML_TEMPERATURE_GPU),
            ("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
        )
        sm_clock = self._query("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)
        mem_clock = self._query("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM)
        mem, mem_error = self._query_why("nvmlDeviceGetMemoryInfo", h)
        unified = isinstance(mem_error, nvml.NVMLError_NotSupported) or is_unified_name(dev.name)
        mask = self._query_first(
            ("nvmlDeviceGetCurrentClocksEventReasons", h),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", h),
        )
        gpm_pct = self._gpm_dram_bw_pct(dev)
        if gpm_pct is not None:
            bw_pct, source = gpm_pct, SOURCE_GPM
        elif util_mem is not None:
            bw_pct, source = util_mem, SOURCE_UTIL
        else:
            bw_pct, source = None, None
        bw_gbps = bw_pct / 100 * dev.peak_bw_gbps if bw_pct is not None and dev.peak_bw_gbps else None

        return GpuSample(
            index=index,
            t=t,
            name=dev.name,
            uuid=dev.uuid,
            util_gpu_pct=util_gpu,
            util_mem_pct=util_mem,
            mem_bw_gbps=bw_gbps,
            mem_bw_pct=bw_pct,
            mem_bw_source=source,
            peak_bw_gbps=dev.peak_bw_gbps,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(sm_clock) if sm_clock is not None else None,
            mem_clock_mhz=float(mem_clock) if mem_clock is not None else None,
            vram_used_bytes=_bytes(mem.used) if mem is not None else None,
            vram_total_bytes=_bytes(mem.total) if mem is not None else None,
            clock_event_mask=mask,
            throttle_reasons=throttle_words(mask) if mask else (),
            throttled=bool(mask and mask & REAL_THROTTLE_MASK),
            processes=self._processes(h, engine_pids, unified),
            vendor="NVIDIA",
            driver="nvml",
            energy_j=energy_mj / 1000 if energy_mj is not None else None,
            unified_memory=unified,
        )

    def _read_static(self, dev: _Device) -> None:
        """Facts that never change while the driver is loaded; a GpuIsLost here leaves them unread."""
        nvml, h = self._nvml, dev.handle
        name = _text(self._query("nvmlDeviceGetName", h))
        uuid = _text(self._query("nvmlDeviceGetUUID", h))
        max_mem_clock = self._query("nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_MEM)
        bus_width = self._query("nvmlDeviceGetMemoryBusWidth", h)
        support = self._query("nvmlGpmQueryDeviceSupport", h)
        dev.name, dev.uuid = name, uuid
        dev.peak_bw_gbps = peak_bandwidth_gbps(max_mem_clock, bus_width)
        dev.gpm_supported = bool(support is not None and support.isSupportedDevice)
        dev.static_done = True

    def _processes(self, h: Any, engine_pids: dict[str, set[int]], unified: bool = False
                   ) -> tuple[GpuProcess, ...]:
        """Every process NVML lists on the GPU. On a unified-memory GPU, whose processes NVML gives no memory,
        each one's share is its resident memory on the host (as llmtop takes it): the same pages."""
        seen: dict[int, GpuProcess] = {}
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for info in self._query(fn_name, h) or ():
                pid = int(info.pid)
                # None when NVML says NVML_VALUE_NOT_AVAILABLE (a unified-memory GPU's processes, under MIG)
                used = _bytes(getattr(info, "usedGpuMemory", None))
                from_host = unified and used is None
                if from_host:
                    used = _rss(pid)
                if pid in seen and (used is None or seen[pid].used_bytes is not None):
                    continue  # a process in both lists: keep the entry that knows its memory
                engine = next((name for name, pids in engine_pids.items() if pid in pids), None)
                graphics = fn_name == "nvmlDeviceGetGraphicsRunningProcesses" and pid not in seen
                seen[pid] = GpuProcess(pid=pid, used_bytes=used, engine=engine, graphics=graphics,
                                       container=None if engine else self._container(pid),
                                       host_memory=from_host and used is not None)
        return tuple(seen.values())

    def _container(self, pid: int) -> str | None:
        """"runtime short-id" of the container PID runs in, read once per sample; None on the host."""
        if pid not in self._containers:
            try:
                found = container_of(pid, self._proc_root)
            except Exception:  # a surprise in /proc: the process is still listed
                log.exception("reading the container of PID %d failed", pid)
                found = None
            self._containers[pid] = f"{found[0]} {found[1][:12]}" if found else None
        return self._containers[pid]

    # ---- GPM (Hopper+): DRAM bandwidth utilisation between this sample and the previous one -----------

    def _gpm_dram_bw_pct(self, dev: _Device) -> float | None:
        if not dev.gpm_supported:
            return None
        nvml = self._nvml
        current = self._query("nvmlGpmSampleAlloc")
        if current is None:
            return None
        try:
            got = self._query("nvmlGpmSampleGet", dev.handle, current)
        except _Lost:
            self._free(current)
            raise
        if got is None:  # e.g. NotSupported under MIG: stop trying GPM on this GPU
            self._free(current)
            self._drop_gpm(dev)
            dev.gpm_supported = False
            return None
        previous, dev.gpm_prev = dev.gpm_prev, current
        if previous is None:
            return None  # first sample is only a baseline
        try:
            mg = nvml.c_nvmlGpmMetricsGet_t()
            mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1 = previous  # baseline (older)
            mg.sample2 = current  # latest
            mg.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            if self._query("nvmlGpmMetricsGet", mg) is None:
                return None
            metric = mg.metrics[0]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                return None
            return float(metric.value)
        finally:
            self._free(previous)

    def _free(self, gpm_sample: Any) -> None:
        try:
            self._nvml.nvmlGpmSampleFree(gpm_sample)
        except Exception as exc:
            log.debug("nvmlGpmSampleFree failed: %s", exc)

    def _drop_gpm(self, dev: _Device) -> None:
        if dev.gpm_prev is not None:
            self._free(dev.gpm_prev)
            dev.gpm_prev = None


def _rss(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def is_unified_name(name: str | None) -> bool:
    """The GPU's name is one whose memory is the host's (GB10, Jetson's Orin, Thor, Xavier)."""
    return bool(name and UNIFIED_NAMES.search(name))


def _bytes(value: Any) -> int | None:
    """A byte count NVML gave, or None for none or its NVML_VALUE_NOT_AVAILABLE (2**64 - 1), never 0."""
    if value is None:
        return None
    n = int(value)
    return None if n < 0 or n >= 2**64 - 1 else n


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
