"""Scriptable stand-in for `pynvml` at its function boundary, for machines without an NVIDIA GPU.

Shaped like nvidia-ml-py 13: the NVMLError classes, constants and ctypes structs ARE the real pynvml
ones (pynvml imports without a driver; only nvmlInit fails), results are the same ctypes structs /
friendly objects the real functions return, and errors are raised the way pynvml raises them
(`NVMLError(code)` maps to the subclass, e.g. NVMLError_NotSupported, str "Not Supported").

    nvml = FakeNvml([h200(), rtx4090()])
    sampler = GpuSampler(nvml)
    nvml.set_vram_used(0, 40 << 30); nvml.gpus[1].lost = True; ...

Anything not written here but present in pynvml (constants, struct classes, error classes) is taken from
the real module; a real pynvml *function* that is not faked raises AttributeError so that a test never
reaches the real library by accident.

Misuse is recorded in `misuse` (and, where NVML would, also raised): a GPM sample freed twice or used after
its free, and two threads inside NVML calls at once (each call holds its thread "inside" for
`call_delay_s`, so a race a test wants to provoke has a window to happen in).
"""

from __future__ import annotations

import ctypes
import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NoReturn

import pynvml
from pynvml import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_GPM_METRIC_DRAM_BW_UTIL,
    NVML_GPM_METRIC_MAX,
    NVML_GPM_METRICS_GET_VERSION,
    NVML_GPM_SUPPORT_VERSION,
    NVML_SUCCESS,
    NVML_TEMPERATURE_GPU,
    NVML_VALUE_NOT_AVAILABLE_ulonglong,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotSupported,
)

__all__ = [
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "FakeGpu",
    "FakeHandle",
    "FakeNvml",
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_FunctionNotFound",
    "NVMLError_GpuIsLost",
    "NVMLError_LibraryNotFound",
    "NVMLError_NoPermission",
    "NVMLError_NotSupported",
    "h200",
    "rtx4090",
]

GiB = 1 << 30
MiB = 1 << 20


@dataclass
class FakeGpu:
    """One scripted GPU. Change any field between samples; the next NVML call sees the new value."""

    name: str
    uuid: str
    vram_total: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    bus_width_bits: int
    power_limit_mw: int
    gpm_supported: bool = False
    util_gpu: int = 0
    util_mem: int = 0
    power_mw: int = 70_000
    temp_c: int = 31
    sm_clock_mhz: int = 345
    mem_clock_mhz: int | None = None  # None: the max memory clock
    vram_used: int = 512 * MiB
    clock_event_mask: int = pynvml.nvmlClocksEventReasonGpuIdle
    compute_procs: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes or None)
    graphics_procs: list[tuple[int, int | None]] = field(default_factory=list)
    dram_bw_util_pct: float = 0.0  # what GPM DRAM_BW_UTIL reports over the interval ending at a sample
    # nvmlDeviceGetTotalEnergyConsumption: mJ since the driver loaded (an unsigned long long); advance()
    # adds power x time, as the real counter does (it moves every 20-100 ms on real GPUs)
    energy_mj: int = 123_456_789
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    not_supported: set[str] = field(default_factory=set)  # function names raising NVMLError_NotSupported
    no_permission: set[str] = field(default_factory=set)  # function names raising NVMLError_NoPermission


def h200(**changes: Any) -> FakeGpu:
    """An H200-like GPU: HBM3e, 6144-bit bus, GPM supported (Hopper)."""
    values: dict[str, Any] = dict(
        name="NVIDIA H200",
        uuid="GPU-5c4a1f3e-0000-4000-8000-000000000200",
        vram_total=143_771 * MiB,
        max_sm_clock_mhz=1980,
        max_mem_clock_mhz=3201,
        bus_width_bits=6144,
        power_limit_mw=700_000,
        gpm_supported=True,
    )
    values.update(changes)
    return FakeGpu(**values)


def rtx4090(**changes: Any) -> FakeGpu:
    """A GeForce RTX 4090-like GPU: GDDR6X, 384-bit bus, no GPM."""
    values: dict[str, Any] = dict(
        name="NVIDIA GeForce RTX 4090",
        uuid="GPU-9d2b7c10-0000-4000-8000-000000004090",
        vram_total=24_564 * MiB,
        max_sm_clock_mhz=3120,
        max_mem_clock_mhz=10501,
        bus_width_bits=384,
        power_limit_mw=450_000,
        gpm_supported=False,
    )
    values.update(changes)
    return FakeGpu(**values)


@dataclass(frozen=True)
class FakeHandle:
    """Opaque like pynvml's c_nvmlDevice_t: callers only hand it back."""

    index: int


@dataclass
class _GpmSnapshot:
    gpu: int
    seq: int
    dram_bw_util_pct: float


def _raise(code: int) -> NoReturn:
    raise NVMLError(code)  # pynvml maps the code to its subclass in NVMLError.__new__


class FakeNvml:
    """The fake module. `gpus` is a list of FakeGpu; `missing_functions` are absent from the "driver"."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "570.172.08",
        init_error: int | None = None,
        missing_functions: set[str] | None = None,
        energy_clock: Any = None,
    ) -> None:
        self.gpus: list[FakeGpu] = list(gpus) if gpus is not None else [h200()]
        # With a clock (time.monotonic), the energy counter runs by itself at each GPU's power since this
        # fake was made, as the real one does while a test sleeps; without, only advance() moves it
        self.energy_clock = energy_clock
        self._energy_t0 = energy_clock() if energy_clock is not None else 0.0
        self.driver_version = driver_version
        self.init_error = init_error  # e.g. NVML_ERROR_LIBRARY_NOT_FOUND: no driver on this machine
        self.missing_functions: set[str] = set(missing_functions or ())
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self._gpm: dict[int, _GpmSnapshot | None] = {}  # live samples by address: None until filled
        self._gpm_buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._gpm_seq = 0
        self.call_delay_s = 0.0
        self.misuse: list[str] = []
        self._inside: int | None = None  # the thread inside a call (during its delay)
        self._inside_lock = threading.Lock()

    # ---- scripting helpers ----------------------------------------------------------------------------

    def set_vram_used(self, index: int, used_bytes: int) -> None:
        gpu = self.gpus[index]
        if not 0 <= used_bytes <= gpu.vram_total:
            raise ValueError(f"used {used_bytes} outside 0..{gpu.vram_total}")
        gpu.vram_used = used_bytes

    def set_clock_event_mask(self, index: int, mask: int) -> None:
        self.gpus[index].clock_event_mask = mask

    def lose_gpu(self, index: int) -> None:
        self.gpus[index].lost = True

    def advance(self, seconds: float) -> None:
        """Time passes at each GPU's current power draw: its energy counter moves by power x time (mW x s =
        mJ), rounded down to whole mJ as NVML's integer counter is."""
        for gpu in self.gpus:
            gpu.energy_mj += int(gpu.power_mw * seconds)

    def live_gpm_samples(self) -> int:
        """GPM samples allocated and not yet freed (a leak check)."""
        return len(self._gpm)

    # ---- anything else comes from the real module ----------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)  # AttributeError for names pynvml lacks, like the real module
        if inspect.isfunction(real):
            raise AttributeError(f"FakeNvml does not fake pynvml.{name}")
        return real

    # ---- plumbing ------------------------------------------------------------------------------------

    def _enter(self, fn_name: str) -> None:
        self.calls[fn_name] += 1
        if self.call_delay_s:
            self._hold(fn_name)
        if fn_name in self.missing_functions:
            _raise(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized:
            _raise(NVML_ERROR_UNINITIALIZED)

    def _hold(self, fn_name: str) -> None:
        me = threading.get_ident()
        with self._inside_lock:
            if self._inside not in (None, me):
                self.misuse.append(f"{fn_name} called while another thread was inside an NVML call")
            self._inside = me
        time.sleep(self.call_delay_s)
        with self._inside_lock:
            if self._inside == me:
                self._inside = None

    def _gpu(self, fn_name: str, handle: Any) -> FakeGpu:
        self._enter(fn_name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            _raise(NVML_ERROR_GPU_IS_LOST)
        if fn_name in gpu.not_supported:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        if fn_name in gpu.no_permission:
            _raise(NVML_ERROR_NO_PERMISSION)
        return gpu

    # ---- init / system -------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            _raise(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            _raise(NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    # ---- per device ----------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)
        if self.energy_clock is None:
            return gpu.energy_mj
        return gpu.energy_mj + int(gpu.power_mw * (self.energy_clock() - self._energy_t0))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int = pynvml.nvmlTemperature_v1
    ) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureV", handle)
        if version != pynvml.nvmlTemperature_v1:
            _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != NVML_TEMPERATURE_GPU:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type == NVML_CLOCK_SM:
            return gpu.sm_clock_mhz
        if type == NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz if gpu.mem_clock_mhz is not None else gpu.max_mem_clock_mhz
        _raise(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
        if type == NVML_CLOCK_SM:
            return gpu.max_sm_clock_mhz
        if type == NVML_CLOCK_MEM:
            return gpu.max_mem_clock_mhz
        _raise(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMemoryBusWidth(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMemoryBusWidth", handle).bus_width_bits

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> pynvml.c_nvmlMemory_t:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        if version:
            _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)  # only the v1 struct is faked
        return pynvml.c_nvmlMemory_t(total=gpu.vram_total, free=gpu.vram_total - gpu.vram_used,
                                     used=gpu.vram_used)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_mask

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return _process_objects(gpu.compute_procs)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return _process_objects(gpu.graphics_procs)

    # ---- GPM -----------------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> pynvml.c_nvmlGpmSupport_t:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm_supported else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        address = ctypes.addressof(buffer)
        self._gpm_buffers[address] = buffer
        self._gpm[address] = None
        return ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleGet(self, handle: Any, gpm_sample: Any) -> Any:
        gpu = self._gpu("nvmlGpmSampleGet", handle)
        address = self._live_address(gpm_sample, "nvmlGpmSampleGet")
        if not gpu.gpm_supported:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        self._gpm_seq += 1
        self._gpm[address] = _GpmSnapshot(handle.index, self._gpm_seq, gpu.dram_bw_util_pct)
        return gpm_sample

    def nvmlGpmSampleFree(self, gpm_sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        address = self._live_address(gpm_sample, "nvmlGpmSampleFree")
        del self._gpm[address]
        del self._gpm_buffers[address]

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if not isinstance(metrics_get, pynvml.c_nvmlGpmMetricsGet_t):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        if metrics_get.version != NVML_GPM_METRICS_GET_VERSION:
            _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not 1 <= metrics_get.numMetrics <= NVML_GPM_METRIC_MAX:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        first = self._gpm.get(self._live_address(metrics_get.sample1, "nvmlGpmMetricsGet"))
        second = self._gpm.get(self._live_address(metrics_get.sample2, "nvmlGpmMetricsGet"))
        # both filled, by the same GPU, sample1 the older one (NVML's baseline/latest convention)
        if first is None or second is None or first.gpu != second.gpu or first.seq >= second.seq:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[second.gpu].lost:
            _raise(NVML_ERROR_GPU_IS_LOST)
        for i in range(metrics_get.numMetrics):
            metric = metrics_get.metrics[i]
            if metric.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL:
                metric.value = second.dram_bw_util_pct
                metric.nvmlReturn = NVML_SUCCESS
            else:
                metric.value = 0.0
                metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return metrics_get

    def _live_address(self, gpm_sample: Any, fn_name: str) -> int:
        address = ctypes.cast(gpm_sample, ctypes.c_void_p).value
        if address is None or address not in self._gpm:
            self.misuse.append(f"{fn_name}: GPM sample {address} freed twice, never allocated, or NULL")
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return address


def _process_objects(procs: list[tuple[int, int | None]]) -> list[Any]:
    """Exactly what pynvml's _v3 process calls build: friendly objects from c_nvmlProcessInfo_v3_t."""
    out = []
    for pid, used in procs:
        raw = pynvml.c_nvmlProcessInfo_v3_t()
        raw.pid = pid
        raw.usedGpuMemory = NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
        obj = pynvml.nvmlStructToFriendlyObject(raw)
        if obj.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
            obj.usedGpuMemory = None
        out.append(obj)
    return out
