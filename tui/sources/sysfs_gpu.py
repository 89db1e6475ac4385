"""AMD and Intel GPUs from the kernel's sysfs, without root (what nvtop and vllmstat read): the same GpuSample
as NVML's, so the GPU panel, the store and everything after them never know where a figure came from.

Layouts read (the kernel's own documentation; a file that is not there leaves its figure None):

- every card: `/sys/class/drm/cardN/device/{vendor,device,uevent}` (vendor 0x1002 AMD, 0x8086 Intel; uevent
  names the DRIVER and the PCI_SLOT_NAME), its hwmon at `device/hwmon/hwmonM/` (Documentation/hwmon/
  sysfs-interface.rst: power in microwatts, energy in microjoules, temperature in millidegrees, fan in RPM,
  frequency in Hz).
- amdgpu (Documentation/gpu/amdgpu/thermal.rst, driver-misc.rst): `device/gpu_busy_percent`,
  `mem_busy_percent`, `mem_info_vram_total`/`_used` (bytes), `product_name` where the board has one; hwmon
  `power1_input` (newer: instantaneous) or `power1_average`, `power1_cap`, `temp1_input` (edge; the label
  file says which), `freq1_input` (sclk), `freq2_input` (mclk), `fan1_input`, `energy1_input` where present
  (most amdgpu boards have none: then `amd-smi`, when on PATH, gives the energy counter, each card's matched
  by its PCI address). Throttling: the binary `device/gpu_metrics` table, read only in its v1.3 layout
  (kgd_pp_interface.h `gpu_metrics_v1_3`, dGPUs of the RDNA2/CDNA2 era), whose `indep_throttle_status` is
  ASIC-independent: bits 0-15 power limits, 16-31 current limits, 32-47 temperatures (amdgpu_smu.h
  SMU_THROTTLER_*). Other revisions lay the table out differently and are not read: no throttle words then.
- xe (Intel Arc B-series and later): `device/tile0/gt0/gtidle/idle_residency_ms` (utilisation is 1 - its
  change over the time between two reads), `device/tile0/gt0/freq0/act_freq` (MHz), throttle reasons in
  `device/tile0/gt0/freq0/throttle/{status,reason_*}`, hwmon `energy1_input` (the card; µJ), `power1_max`,
  `device/tile0/physical_vram_size_bytes` **(uncertain: the xe tile attribute as I know it; VRAM used has no
  sysfs file in xe: None)**.
- i915 (Arc A-series, iGPUs): `cardN/gt/gt0/rc6_residency_ms` (idle; older kernels `cardN/power/
  rc6_residency_ms`), `gt/gt0/rps_act_freq_mhz` (or `cardN/gt_act_freq_mhz`), throttle reasons
  `gt/gt0/throttle_reason_{status,pl1,pl2,pl4,thermal,prochot,ratl,vr_thermalert,vr_tdc}`, hwmon
  `energy1_input`, `power1_max`, and `cardN/lmem_total_bytes`/`lmem_avail_bytes` for VRAM **(uncertain)**.

Intel's hwmon has no power reading: power is the energy counter's change between two reads. Which engine
holds which of these GPUs: the engines' own processes' DRM file descriptors (`/proc/PID/fdinfo/FD`,
Documentation/gpu/drm-usage-stats.rst: `drm-pdev`, `drm-client-id`, `drm-memory-vram` on amdgpu,
`drm-resident-vram0` on xe, `drm-resident-local0` on i915). Processes enginetop does not watch are not looked
at, so another program on an AMD or Intel GPU is never seen: "alone on it" is never claimed there
(tui.sources.energy.lists_every_process), the figure is the whole GPU's and says so.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tui.base.paths import sysfs_root
from tui.model.samples import GpuProcess, GpuSample
from tui.sources.amd_smi import amd_smi_energy
from tui.sources.sysfs_files import read_text

log = logging.getLogger(__name__)

VENDORS = {"0x1002": "AMD", "0x8086": "Intel"}  # NVIDIA (0x10de) is read through NVML
_CARD = re.compile(r"^card(\d+)$")
FD_RESCAN_S = 10.0  # an engine's DRM file descriptors are listed again this often
AMD_SMI_EVERY_S = 5.0  # amd-smi is a Python CLI: run at most this often, only for what sysfs lacks
# Intel's utilisation and power are rates between two reads of a counter: reads closer than this keep the
# last rate (a counter that moves in steps reads as 0 or 100 % over a few milliseconds)
MIN_RATE_S = 0.5

# amdgpu_smu.h SMU_THROTTLER_*_BIT, the ASIC-independent status (gpu_metrics v1.3 indep_throttle_status)
AMD_THROTTLE_BITS: dict[int, str] = {
    0: "power limit (PPT0)", 1: "power limit (PPT1)", 2: "power limit (PPT2)", 3: "power limit (PPT3)",
    4: "power limit (SPL)", 5: "power limit (FPPT)", 6: "power limit (SPPT)", 7: "power limit (SPPT APU)",
    16: "current limit (TDC GFX)", 17: "current limit (TDC SOC)", 18: "current limit (TDC MEM)",
    19: "current limit (TDC VDD)", 20: "current limit (TDC CVIP)", 21: "current limit (EDC CPU)",
    22: "current limit (EDC GFX)", 23: "current limit (APCC)",
    32: "thermal (GPU)", 33: "thermal (core)", 34: "thermal (memory)", 35: "thermal (edge)",
    36: "thermal (hotspot)", 37: "thermal (SOC)", 38: "thermal (VR GFX)", 39: "thermal (VR SOC)",
    40: "thermal (VR MEM0)", 41: "thermal (VR MEM1)", 42: "thermal (liquid 0)", 43: "thermal (liquid 1)",
    44: "VR hot (0)", 45: "VR hot (1)", 46: "PROCHOT (CPU)", 47: "PROCHOT (GFX)",
    56: "power (PPM)", 57: "reliability (FIT)",
}
_GPU_METRICS_V1_3_INDEP = 112  # byte offset of indep_throttle_status in gpu_metrics_v1_3 (120 bytes)

INTEL_THROTTLE_WORDS = {
    "pl1": "power limit PL1", "pl2": "power limit PL2", "pl4": "current limit PL4 / Iccmax",
    "thermal": "thermal", "prochot": "PROCHOT", "ratl": "thermal (RATL)",
    "vr_thermalert": "VR thermal alert", "vr_tdc": "VR current (TDC)",
}


def amd_throttle_words(mask: int) -> tuple[str, ...]:
    words = [word for bit, word in AMD_THROTTLE_BITS.items() if mask >> bit & 1]
    unknown = mask & ~sum(1 << bit for bit in AMD_THROTTLE_BITS)
    if unknown:
        words.append(f"other throttle bits {unknown:#x}")
    return tuple(words)


def parse_gpu_metrics(data: bytes) -> int | None:
    """indep_throttle_status from a gpu_metrics v1.3 table; None for any other revision or a short table."""
    if len(data) < 4:
        return None
    size, fmt, content = struct.unpack_from("<HBB", data, 0)
    end = _GPU_METRICS_V1_3_INDEP + 8
    if (fmt, content) != (1, 3) or size < end or len(data) < end:
        return None
    (mask,) = struct.unpack_from("<Q", data, _GPU_METRICS_V1_3_INDEP)
    return int(mask)


@dataclass
class _Card:
    number: int
    path: Path  # /sys/class/drm/cardN
    vendor: str
    driver: str
    pci: str | None
    device_id: str | None
    hwmon: Path | None
    name: str
    prev_idle: tuple[float, float] | None = None  # (t, idle ms) for Intel's utilisation
    prev_energy: tuple[float, float] | None = None  # (t, J) for Intel's power
    util: float | None = None  # the last rates computed from them
    power: float | None = None
    amd_smi_at: float = float("-inf")


@dataclass
class _Fds:
    """One process's DRM file descriptors, listed every FD_RESCAN_S."""

    at: float
    fds: list[str] = field(default_factory=list)


class SysfsGpus:
    """Every AMD and Intel GPU under `root`/class/drm (default ENGINETOP_SYSFS_ROOT or /sys). Not thread-safe:
    the GpuSampler that owns it calls it under its lock."""

    def __init__(self, root: Path | None = None, proc_root: Path | None = None,
                 clock: Callable[[], float] = time.monotonic, amd_smi: str | None = "auto",
                 read_file: Callable[[Path], str] = read_text) -> None:
        self._root = root
        self._proc = proc_root or Path("/proc")
        self._clock = clock
        self._read = read_file
        self._amd_smi = shutil.which("amd-smi") if amd_smi == "auto" else amd_smi
        self._amd_energy: dict[str, float | None] = {}  # amd_smi_energy's, from its last run
        self._amd_smi_at = float("-inf")  # when amd-smi last ran (once for every AMD GPU)
        self._cards: list[_Card] | None = None
        self._fds: dict[int, _Fds] = {}

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else sysfs_root()

    # ---- discovery ------------------------------------------------------------------------------------

    def cards(self) -> list[_Card]:
        if self._cards is None:
            self._cards = self._discover()
        return self._cards

    def _discover(self) -> list[_Card]:
        base = self.root / "class" / "drm"
        try:
            entries = sorted(base.iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            return []
        cards = []
        for entry in entries:
            match = _CARD.match(entry.name)
            if not match:
                continue
            device = entry / "device"
            vendor = VENDORS.get((self._text(device / "vendor") or "").lower())
            if vendor is None:
                continue
            uevent = self._uevent(device / "uevent")
            driver = uevent.get("DRIVER") or self._link_name(device / "driver") or (
                "amdgpu" if vendor == "AMD" else "xe" if (device / "tile0").is_dir() else "i915")
            device_id = self._text(device / "device")
            hwmons = sorted((device / "hwmon").glob("hwmon*")) if (device / "hwmon").is_dir() else []
            name = self._text(device / "product_name") or f"{vendor} GPU {device_id or '?'}"
            cards.append(_Card(int(match.group(1)), entry, vendor, driver, uevent.get("PCI_SLOT_NAME"),
                               device_id, hwmons[0] if hwmons else None, name))
        if cards:
            log.info("sysfs GPUs: %s", ", ".join(f"card{c.number} {c.vendor} ({c.driver})" for c in cards))
        return cards

    def _uevent(self, path: Path) -> dict[str, str]:
        text = self._text(path) or ""
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    @staticmethod
    def _link_name(path: Path) -> str | None:
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    # ---- reading ---------------------------------------------------------------------------------------

    def _text(self, path: Path) -> str | None:
        try:
            return self._read(path).strip()
        except (OSError, UnicodeDecodeError):
            return None

    def _num(self, path: Path, scale: float = 1.0) -> float | None:
        text = self._text(path)
        if text is None:
            return None
        try:
            return float(text) * scale
        except ValueError:
            return None

    def _bytes(self, path: Path) -> int | None:
        """A size in bytes (VRAM), as the whole number the file holds."""
        value = self._num(path)
        return int(value) if value is not None else None

    def _hw(self, card: _Card, name: str, scale: float = 1.0) -> float | None:
        return self._num(card.hwmon / name, scale) if card.hwmon is not None else None

    def sample(self, engine_pids: dict[str, set[int]], first_index: int = 0) -> list[GpuSample]:
        cards = self.cards()
        if not cards:
            return []
        held = self._held(engine_pids) if engine_pids else {}
        out = []
        for i, card in enumerate(cards):
            t = self._clock()
            try:
                gpu = self._amd(card, t) if card.vendor == "AMD" else self._intel(card, t)
            except Exception as exc:  # a surprise in one card's files: that card says so, the others go on
                log.exception("reading card%d failed", card.number)
                gpu = GpuSample(index=0, t=t, name=card.name, error=f"sysfs read failed ({exc})")
            procs = tuple(GpuProcess(pid=pid, used_bytes=used, engine=engine)
                          for pid, (engine, used) in sorted(held.get(card.pci or "", {}).items()))
            out.append(dataclasses.replace(gpu, index=first_index + i, processes=procs))
        return out

    def _amd(self, card: _Card, t: float) -> GpuSample:
        dev = card.path / "device"
        temp = self._labelled_temp(card, "edge")
        power = self._hw(card, "power1_input", 1e-6)
        if power is None:
            power = self._hw(card, "power1_average", 1e-6)
        energy = self._hw(card, "energy1_input", 1e-6)
        if energy is None:
            energy = self._amd_smi_energy(card, t)
        mask = None
        try:
            with open(dev / "gpu_metrics", "rb") as f:
                mask = parse_gpu_metrics(f.read(256))
        except OSError:
            pass
        words = amd_throttle_words(mask) if mask else ()
        return GpuSample(
            index=0, t=t, name=card.name, uuid=card.pci, vendor="AMD", driver=card.driver,
            util_gpu_pct=self._num(dev / "gpu_busy_percent"),
            util_mem_pct=self._num(dev / "mem_busy_percent"),
            power_w=power, power_limit_w=self._hw(card, "power1_cap", 1e-6), temp_c=temp,
            sm_clock_mhz=self._hw(card, "freq1_input", 1e-6),
            mem_clock_mhz=self._hw(card, "freq2_input", 1e-6),
            vram_used_bytes=self._bytes(dev / "mem_info_vram_used"),
            vram_total_bytes=self._bytes(dev / "mem_info_vram_total"),
            throttle_reasons=words, throttled=bool(words), energy_j=energy,
            fan_rpm=self._hw(card, "fan1_input"))

    def _amd_smi_energy(self, card: _Card, t: float) -> float | None:
        """The card's energy counter from amd-smi, run at most every AMD_SMI_EVERY_S for every AMD GPU that
        asks (whichever card asks first), each card matched by its PCI address (by its place among the AMD
        cards where amd-smi names none); each run's value is given once per card, at the read that got it."""
        if self._amd_smi is None:
            return None
        if t - self._amd_smi_at >= AMD_SMI_EVERY_S:
            self._amd_smi_at = t
            try:
                self._amd_energy = amd_smi_energy(self._amd_smi)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                log.info("amd-smi gave no energy (%s); power x time stands in", exc)
                self._amd_smi = None
                return None
        if card.amd_smi_at == self._amd_smi_at:
            return None  # this run's value was given already: the next one comes with the next run
        card.amd_smi_at = self._amd_smi_at
        if card.pci and card.pci.lower() in self._amd_energy:
            return self._amd_energy[card.pci.lower()]
        amd = [c for c in self.cards() if c.vendor == "AMD"]
        return self._amd_energy.get(f"#{amd.index(card)}")  # amd-smi's ids in PCI order, as the cards

    def _labelled_temp(self, card: _Card, wanted: str) -> float | None:
        if card.hwmon is None:
            return None
        first = None
        for n in range(1, 8):
            value = self._hw(card, f"temp{n}_input", 1e-3)
            if value is None:
                continue
            if (self._text(card.hwmon / f"temp{n}_label") or "").lower() == wanted:
                return value
            first = first if first is not None else value
        return first

    def _intel(self, card: _Card, t: float) -> GpuSample:
        dev = card.path / "device"
        if card.driver == "xe":
            gt = dev / "tile0" / "gt0"
            idle = self._num(gt / "gtidle" / "idle_residency_ms")
            freq = self._num(gt / "freq0" / "act_freq")
            throttle = gt / "freq0" / "throttle"
            reasons = self._intel_reasons(throttle, "status", "reason_")
            total = self._bytes(dev / "tile0" / "physical_vram_size_bytes")
            used = None
        else:
            gt = card.path / "gt" / "gt0"
            idle = self._num(gt / "rc6_residency_ms")
            if idle is None:
                idle = self._num(card.path / "power" / "rc6_residency_ms")
            freq = self._num(gt / "rps_act_freq_mhz")
            if freq is None:
                freq = self._num(card.path / "gt_act_freq_mhz")
            reasons = self._intel_reasons(gt, "throttle_reason_status", "throttle_reason_")
            total = self._bytes(card.path / "lmem_total_bytes")
            avail = self._bytes(card.path / "lmem_avail_bytes")
            used = total - avail if total is not None and avail is not None else None
        if total is None:  # a driver that publishes amdgpu's names (none known today): take them
            total = self._bytes(dev / "mem_info_vram_total")
            used = self._bytes(dev / "mem_info_vram_used")
        prev = card.prev_idle
        if idle is not None and (prev is None or t - prev[0] >= MIN_RATE_S or idle < prev[1]):
            card.prev_idle = (t, idle)
            card.util = None
            if prev is not None and idle >= prev[1]:
                busy = 1.0 - (idle - prev[1]) / ((t - prev[0]) * 1000.0)
                card.util = 100.0 * min(1.0, max(0.0, busy))
        energy = self._hw(card, "energy1_input", 1e-6)
        power = self._hw(card, "power1_input", 1e-6)
        prev_e = card.prev_energy
        if power is None and energy is not None and (prev_e is None or t - prev_e[0] >= MIN_RATE_S
                                                     or energy < prev_e[1]):
            card.prev_energy = (t, energy)
            card.power = None
            if prev_e is not None and energy >= prev_e[1]:
                card.power = (energy - prev_e[1]) / (t - prev_e[0])
        util = card.util if idle is not None else None
        if power is None:
            power = card.power if energy is not None else None
        limit = self._hw(card, "power1_max", 1e-6)
        return GpuSample(
            index=0, t=t, name=card.name, uuid=card.pci, vendor="Intel", driver=card.driver,
            util_gpu_pct=util, power_w=power, power_limit_w=limit or None,
            temp_c=self._labelled_temp(card, "pkg"),
            sm_clock_mhz=freq, vram_used_bytes=used, vram_total_bytes=total, throttle_reasons=reasons,
            throttled=bool(reasons), energy_j=energy, fan_rpm=self._hw(card, "fan1_input"))

    def _intel_reasons(self, where: Path, status: str, prefix: str) -> tuple[str, ...]:
        if self._num(where / status) != 1:
            return ()
        words = []
        try:
            files = sorted(p.name for p in where.iterdir() if p.name.startswith(prefix) and p.name != status)
        except OSError:
            files = []
        for name in files:
            if self._num(where / name) == 1:
                key = name[len(prefix):]
                words.append(INTEL_THROTTLE_WORDS.get(key, key.replace("_", " ")))
        return tuple(words) or ("throttled (the driver gives no reason)",)

    # ---- which engine holds which GPU: its processes' DRM fdinfo ------------------------------------------

    def _held(self, engine_pids: dict[str, set[int]]) -> dict[str, dict[int, tuple[str, int | None]]]:
        """PCI slot -> pid -> (engine, VRAM bytes or None)."""
        now = self._clock()
        out: dict[str, dict[int, tuple[str, int | None]]] = {}
        alive: set[int] = set()
        for engine, pids in engine_pids.items():
            for pid in pids:
                alive.add(pid)
                for pdev, used in self._pid_devices(pid, now).items():
                    out.setdefault(pdev, {})[pid] = (engine, used)
        for gone in set(self._fds) - alive:
            del self._fds[gone]
        return out

    def _pid_devices(self, pid: int, now: float) -> dict[str, int | None]:
        known = self._fds.get(pid)
        if known is None or now - known.at >= FD_RESCAN_S:
            known = self._fds[pid] = _Fds(now, self._drm_fds(pid))
        devices: dict[str, int | None] = {}
        clients: set[tuple[str, str]] = set()
        for fd in known.fds:
            info = self._fdinfo(pid, fd)
            pdev = info.get("drm-pdev")
            if pdev is None:
                continue
            client = info.get("drm-client-id", fd)
            if (pdev, client) in clients:  # two descriptors of one DRM client: its memory counts once
                continue
            clients.add((pdev, client))
            used = _kib(info, ("drm-memory-vram", "drm-resident-vram0", "drm-resident-local0",
                               "drm-total-vram0"))
            before = devices.get(pdev)
            devices[pdev] = (before or 0) + used if used is not None else before
        return devices

    def _drm_fds(self, pid: int) -> list[str]:
        fd_dir = self._proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            return []
        fds = []
        for name in names:
            try:
                if os.readlink(fd_dir / name).startswith("/dev/dri/"):
                    fds.append(name)
            except OSError:
                continue
        return fds

    def _fdinfo(self, pid: int, fd: str) -> dict[str, str]:
        text = self._text(self._proc / str(pid) / "fdinfo" / fd) or ""
        out = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out


def _kib(info: dict[str, str], keys: tuple[str, ...]) -> int | None:
    """The first of `keys` present, as bytes (drm-usage-stats: "N [KiB|MiB]", no unit = bytes)."""
    for key in keys:
        value = info.get(key)
        if value is None:
            continue
        parts = value.split()
        try:
            number = int(parts[0])
        except (IndexError, ValueError):
            continue
        unit = parts[1] if len(parts) > 1 else ""
        return number * {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}.get(unit, 1)
    return None
