"""Sysfs trees in the kernel's documented layout, for tests (ENGINETOP_SYSFS_ROOT points at one): RAPL's
powercap zones, an amdgpu card, Intel xe and i915 cards, and the /proc fdinfo of a process holding a GPU.
Counters advance at known rates, by hand (`Counter.add`) or from a thread (`Ticker`), as the real ones do.

Layouts: Documentation/power/powercap/powercap.rst (RAPL), Documentation/gpu/amdgpu/thermal.rst and
driver-misc.rst (amdgpu), Documentation/hwmon/sysfs-interface.rst (hwmon units: µW, µJ, m°C, Hz, RPM), the
xe driver's gtidle / freq0 / throttle attributes, i915's gt/gt0 attributes,
Documentation/gpu/drm-usage-stats.rst (fdinfo).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path


def write(path: Path, value: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")
    return path


class Counter:
    """An integer counter file (energy_uj, energy1_input, idle_residency_ms) that wraps after `period` if
    given (RAPL's: rapl_package). Kept exactly, shown whole (truncated, as the kernel shows it). Written whole
    each time (a reader never sees half a number: the new text goes to a temporary file that is renamed over
    the old one, as atomic as the kernel's read of its own counter)."""

    def __init__(self, path: Path, value: float = 0, period: float | None = None) -> None:
        self.path, self.period = path, period
        self.exact = float(value)
        self._lock = threading.Lock()
        self._write()

    @property
    def value(self) -> int:
        return int(self.exact)

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        write(tmp, self.value)
        os.replace(tmp, self.path)

    def add(self, amount: float) -> None:
        with self._lock:
            self.exact += amount
            if self.period is not None:
                self.exact %= self.period
            self._write()


class Ticker:
    """Advances counters from a thread every `every_s`, each by its rate x the time really elapsed (a RAPL
    package at 30 W: 30e6 µJ a second), so the counter is a known rate of real time."""

    def __init__(self, rates: list[tuple[Counter, float]], every_s: float = 0.02) -> None:
        self.rates, self.every_s = rates, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sysfs-ticker", daemon=True)
        self._carry = [0.0] * len(rates)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            for i, (counter, rate) in enumerate(self.rates):
                amount = rate * (now - last) + self._carry[i]
                whole = int(amount)
                self._carry[i] = amount - whole
                counter.add(whole)
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---- RAPL -----------------------------------------------------------------------------------------------


STATUS_STATES = 1 << 32  # RAPL's ENERGY_STATUS register: 32 bits of energy units


def rapl_package(root: Path, n: int, energy_uj: int = 0, unit_nj: int = 61_035,
                 control: str = "intel-rapl", max_power_uw: tuple[int, int] | None = None) -> Counter:
    """/sys/class/powercap/intel-rapl:N (name package-N) with a core sub-zone intel-rapl:N:0 that must not be
    added again. Real sysfs has these as symlinks into /sys/devices/virtual/powercap/...: plain directories
    are read the same way.

    The counter as the kernel's rapl driver makes it (drivers/powercap/intel_rapl_common.c): a 32-bit
    register of energy units of `unit_nj` nJ (61,035 = 2^-14 J, the usual client unit; 15,258 = 2^-16 J on
    servers and AMD), `energy_uj` = raw x unit / 1000, `max_energy_range_uj` = 0xffffffff x unit / 1000 (both
    truncated to whole µJ); the register wraps from 0xffffffff to 0, so the µJ counter's period is 2^32 units,
    one unit more than max_energy_range_uj.

    `max_power_uw` (long term, short term): the package's power constraints as powercap.rst lays them out,
    constraint_N_{name,power_limit_uw,time_window_us,max_power_uw}; the limits set at the maximum (an Intel
    package; AMD's rapl zones have none, nor do trees made without it)."""
    zone = root / "class" / "powercap" / f"{control}:{n}"
    max_uj = (STATUS_STATES - 1) * unit_nj // 1000
    write(zone / "name", f"package-{n}")
    write(zone / "max_energy_range_uj", max_uj)
    write(zone / "enabled", 1)
    for i, (name, window_us, uw) in enumerate(zip(("long_term", "short_term"), (27_983_872, 2_440),
                                                  max_power_uw or (), strict=False)):
        write(zone / f"constraint_{i}_name", name)
        write(zone / f"constraint_{i}_power_limit_uw", uw)
        write(zone / f"constraint_{i}_time_window_us", window_us)
        write(zone / f"constraint_{i}_max_power_uw", uw)
    sub = root / "class" / "powercap" / f"{control}:{n}:0"
    write(sub / "name", "core")
    write(sub / "energy_uj", 999_999)
    write(sub / "max_energy_range_uj", max_uj)
    (root / "class" / "powercap" / control).mkdir(parents=True, exist_ok=True)  # the control type itself
    return Counter(zone / "energy_uj", energy_uj, period=STATUS_STATES * unit_nj / 1000)


# ---- GPUs ---------------------------------------------------------------------------------------------


def _card(root: Path, n: int, vendor: str, device: str, driver: str, pci: str) -> Path:
    card = root / "class" / "drm" / f"card{n}"
    dev = card / "device"
    write(dev / "vendor", vendor)
    write(dev / "device", device)
    ids = f"{vendor[2:].upper()}:{device[2:].upper()}"
    write(dev / "uevent", f"DRIVER={driver}\nPCI_CLASS=30000\nPCI_ID={ids}\nPCI_SLOT_NAME={pci}\n"
                          f"MODALIAS=pci:v0000{vendor[2:]}")
    (root / "class" / "drm" / f"card{n}-DP-1").mkdir(parents=True, exist_ok=True)  # a connector: not a GPU
    (root / "class" / "drm" / f"renderD{128 + n}").mkdir(parents=True, exist_ok=True)  # a render node
    return card


def gpu_metrics_v1_3(indep_throttle_status: int) -> bytes:
    """amdgpu's binary gpu_metrics table, v1.3 layout (kgd_pp_interface.h): 120 bytes, the ASIC-independent
    throttle status at offset 112; the other fields zero."""
    data = bytearray(120)
    struct.pack_into("<HBB", data, 0, 120, 1, 3)
    struct.pack_into("<Q", data, 112, indep_throttle_status)
    return bytes(data)


def amd_card(root: Path, n: int = 0, *, pci: str = "0000:03:00.0", busy: int = 87, mem_busy: int = 41,
             vram_used: int = 20 << 30, vram_total: int = 24 << 30, power_uw: int = 250_000_000,
             power_file: str = "power1_average", cap_uw: int = 300_000_000, edge_mc: int = 61_000,
             junction_mc: int = 74_000, sclk_hz: int = 2_400_000_000, mclk_hz: int = 1_250_000_000,
             fan_rpm: int = 1450, energy_uj: int | None = None, throttle: int | None = None,
             name: str | None = "AMD Radeon RX 7900 XTX") -> dict[str, Counter]:
    """An amdgpu card (RX 7900 XTX-like). Returns its counters (energy1_input when `energy_uj` is given)."""
    card = _card(root, n, "0x1002", "0x744c", "amdgpu", pci)
    dev = card / "device"
    write(dev / "gpu_busy_percent", busy)
    write(dev / "mem_busy_percent", mem_busy)
    write(dev / "mem_info_vram_used", vram_used)
    write(dev / "mem_info_vram_total", vram_total)
    if name:
        write(dev / "product_name", name)
    hw = dev / "hwmon" / f"hwmon{n + 3}"
    write(hw / "name", "amdgpu")
    write(hw / power_file, power_uw)
    write(hw / "power1_cap", cap_uw)
    write(hw / "temp1_input", edge_mc)
    write(hw / "temp1_label", "edge")
    write(hw / "temp2_input", junction_mc)
    write(hw / "temp2_label", "junction")
    write(hw / "freq1_input", sclk_hz)
    write(hw / "freq1_label", "sclk")
    write(hw / "freq2_input", mclk_hz)
    write(hw / "freq2_label", "mclk")
    write(hw / "fan1_input", fan_rpm)
    if throttle is not None:
        (dev / "gpu_metrics").write_bytes(gpu_metrics_v1_3(throttle))
    counters = {}
    if energy_uj is not None:
        counters["energy"] = Counter(hw / "energy1_input", energy_uj)
    return counters


def intel_xe_card(root: Path, n: int = 1, *, pci: str = "0000:05:00.0", energy_uj: int = 5_000_000,
                  idle_ms: int = 1_000_000, act_freq: int = 2850, power_max_uw: int = 190_000_000,
                  vram_bytes: int = 12 << 30, pkg_mc: int = 55_000,
                  throttle: dict[str, int] | None = None) -> dict[str, Counter]:
    """An xe card (Arc B580-like): gtidle residency, freq0, throttle reasons, hwmon energy1_input."""
    card = _card(root, n, "0x8086", "0xe20b", "xe", pci)
    dev = card / "device"
    gt = dev / "tile0" / "gt0"
    write(gt / "gtidle" / "name", "gt0-rc")
    write(gt / "gtidle" / "idle_status", "gt-c0")
    write(gt / "freq0" / "act_freq", act_freq)
    write(gt / "freq0" / "max_freq", 2850)
    write(dev / "tile0" / "physical_vram_size_bytes", vram_bytes)
    reasons = {"status": 0, "reason_pl1": 0, "reason_pl2": 0, "reason_pl4": 0, "reason_thermal": 0,
               "reason_prochot": 0, "reason_ratl": 0, "reason_vr_thermalert": 0, "reason_vr_tdc": 0}
    reasons.update(throttle or {})
    for name, value in reasons.items():
        write(gt / "freq0" / "throttle" / name, value)
    hw = dev / "hwmon" / f"hwmon{n + 5}"
    write(hw / "name", "xe")
    write(hw / "power1_max", power_max_uw)
    write(hw / "temp2_input", pkg_mc)
    write(hw / "temp2_label", "pkg")
    return {"energy": Counter(hw / "energy1_input", energy_uj),
            "idle": Counter(gt / "gtidle" / "idle_residency_ms", idle_ms)}


def intel_i915_card(root: Path, n: int = 2, *, pci: str = "0000:07:00.0", energy_uj: int = 9_000_000,
                    rc6_ms: int = 500_000, act_freq: int = 2100, lmem_total: int = 16 << 30,
                    lmem_avail: int = 10 << 30, throttle: dict[str, int] | None = None) -> dict[str, Counter]:
    """An i915 card (Arc A770-like): gt/gt0 rc6 residency and throttle_reason_*, hwmon energy1_input."""
    card = _card(root, n, "0x8086", "0x56a0", "i915", pci)
    gt = card / "gt" / "gt0"
    write(gt / "rps_act_freq_mhz", act_freq)
    write(card / "lmem_total_bytes", lmem_total)
    write(card / "lmem_avail_bytes", lmem_avail)
    reasons = {"throttle_reason_status": 0, "throttle_reason_pl1": 0, "throttle_reason_pl2": 0,
               "throttle_reason_pl4": 0, "throttle_reason_thermal": 0, "throttle_reason_prochot": 0,
               "throttle_reason_ratl": 0, "throttle_reason_vr_thermalert": 0, "throttle_reason_vr_tdc": 0}
    reasons.update(throttle or {})
    for name, value in reasons.items():
        write(gt / name, value)
    hw = card / "device" / "hwmon" / f"hwmon{n + 7}"
    write(hw / "name", "i915")
    write(hw / "power1_max", 225_000_000)
    return {"energy": Counter(hw / "energy1_input", energy_uj),
            "idle": Counter(gt / "rc6_residency_ms", rc6_ms)}


def drm_fd(proc: Path, pid: int, fd: int, pci: str, client: int, vram_kib: int | None,
           key: str = "drm-memory-vram", node: str = "/dev/dri/renderD128") -> None:
    """/proc/PID/fd/FD -> a DRM render node, and its fdinfo (drm-usage-stats.rst)."""
    fd_dir = proc / str(pid) / "fd"
    fd_dir.mkdir(parents=True, exist_ok=True)
    link = fd_dir / str(fd)
    if not link.is_symlink():
        link.symlink_to(node)
    lines = ["pos:\t0", "flags:\t02100002", "mnt_id:\t26", "drm-driver:\tamdgpu", f"drm-pdev:\t{pci}",
             f"drm-client-id:\t{client}"]
    if vram_kib is not None:
        lines.append(f"{key}:\t{vram_kib} KiB")
    write(proc / str(pid) / "fdinfo" / str(fd), "\n".join(lines))
    other = fd_dir / str(fd + 100)  # a file that is not a GPU
    if not other.is_symlink():
        other.symlink_to("/tmp/some.log")
