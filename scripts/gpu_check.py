"""GPU check: the dashboard's GPU panel beside nvidia-smi, read at the same moment, disagreements flagged.

Run it once on a machine with an NVIDIA GPU, from the repository root:

    python3 scripts/gpu_check.py                # pynvml (nvidia-ml-py) installed
    make gpu-check-bundle                       # where it is not: copies the venv's pynvml.py (one file)
                                                # into .cache/gpu-check/, which the script also searches

On the lent device machine (no network; it gets the working tree plus the carried ignored paths), after
`make gpu-check-bundle` here, the whole check is one call of the device tool:

    run(command="python3 scripts/gpu_check.py", carry=[".cache/gpu-check"], timeout_s=120)

It imports only the repository (tui.sources.gpu.GpuSampler, exactly what the panel uses), the standard
library and pynvml, and runs `nvidia-smi --query-gpu=...` once. Per GPU it prints utilisation, memory,
power, power limit, temperature, SM and memory clocks and the clock-event reasons from both, the
difference, and DISAGREE where it exceeds the tolerance; on Hopper and newer also the DRAM bandwidth the
panel derives from GPM over the last ~1 s beside an independent GPM measurement over the same second.

Energy: over `--energy-seconds` (3) the sampler is read every 0.1 s, and per GPU the change of its energy
counter (NVML's nvmlDeviceGetTotalEnergyConsumption, the one the panel and J/token use) is printed beside
power x time integrated from the same readings' power, DISAGREE past 10 % (NVML's power is a 1 s average on
Ampere and newer, the counter moves every 20-100 ms: a steady load agrees closely, a bursty one less).

AMD and Intel GPUs (the kernel's sysfs, tui.sources.sysfs_gpu) have no nvidia-smi to compare with: what
the panel reads of each is printed, its energy check included where it has a counter (hwmon energy1_input,
or amd-smi), so a run on such a card shows what the panel would. Without nvidia-smi and without an AMD or
Intel GPU the script says so and exits 2 (this machine: no GPU at all).

Exit status: 0 everything agrees, 1 at least one disagreement, 2 the check could not run.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / ".cache" / "gpu-check"  # `make gpu-check-bundle` puts pynvml.py here
sys.path.insert(0, str(REPO))
sys.path.append(str(BUNDLE))  # after site-packages: an installed pynvml wins

from tui.model.samples import GpuSample  # noqa: E402
from tui.sources.energy import Point  # noqa: E402
from tui.sources.energy import energy_of_readings as over  # noqa: E402
from tui.sources.gpu import GpuSampler  # noqa: E402
from tui.sources.sysfs_gpu import SysfsGpus  # noqa: E402

MIB = 1 << 20
# nvidia-smi renamed clocks_throttle_reasons.* to clocks_event_reasons.* (driver 535); older drivers only
# know the old name, newer ones both.
REASONS_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
BASE_FIELDS = (
    "index", "uuid", "name", "utilization.gpu", "utilization.memory", "memory.used", "memory.total",
    "power.draw", "enforced.power.limit", "temperature.gpu", "clocks.sm", "clocks.mem",
)


@dataclass(frozen=True)
class Check:
    label: str
    smi_field: str
    panel: Any  # GpuSample -> value in nvidia-smi's unit, or None
    tolerance: Any  # (panel, smi) -> allowed absolute difference


def _within(absolute: float, relative: float = 0.0):
    return lambda a, b: max(absolute, relative * max(abs(a), abs(b)))


CHECKS = (
    # Utilisation is NVML's busy share over its own sampling period: two reads a moment apart may differ.
    Check("utilization.gpu [%]", "utilization.gpu", lambda g: g.util_gpu_pct, _within(10)),
    Check("utilization.memory [%]", "utilization.memory", lambda g: g.util_mem_pct, _within(10)),
    # The panel reads NVML's v1 memory info, whose "used" includes the driver's reserve; nvidia-smi on
    # newer drivers leaves the reserve out (memory.reserved): up to a few hundred MiB apart by design.
    Check("memory.used [MiB]", "memory.used", lambda g: _mib(g.vram_used_bytes), _within(1024, 0.01)),
    Check("memory.total [MiB]", "memory.total", lambda g: _mib(g.vram_total_bytes), _within(1024, 0.01)),
    Check("power.draw [W]", "power.draw", lambda g: g.power_w, _within(10, 0.10)),
    Check("enforced.power.limit [W]", "enforced.power.limit", lambda g: g.power_limit_w, _within(1)),
    Check("temperature.gpu [C]", "temperature.gpu", lambda g: g.temp_c, _within(2)),
    Check("clocks.sm [MHz]", "clocks.sm", lambda g: g.sm_clock_mhz, _within(30, 0.05)),
    Check("clocks.mem [MHz]", "clocks.mem", lambda g: g.mem_clock_mhz, _within(30, 0.02)),
)


def _mib(value: int | None) -> float | None:
    return value / MIB if value is not None else None


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except ValueError:
        return None  # [N/A], [Not Supported], [Unknown Error]


def query_smi(smi: str) -> tuple[list[str], list[dict[str, str]]]:
    """nvidia-smi's rows as {field: text}; the clock-reasons field under whichever name this driver knows."""
    last = ""
    for reasons in REASONS_FIELDS:
        fields = [*BASE_FIELDS, reasons]
        proc = subprocess.run(
            [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )
        if proc.returncode == 0:
            rows = [dict(zip(fields, (c.strip() for c in row), strict=False))
                    for row in csv.reader(io.StringIO(proc.stdout)) if row]
            return fields, rows
        last = (proc.stdout + proc.stderr).strip()
        if "not a valid field" not in last:
            break
    raise RuntimeError(f"nvidia-smi failed: {last}")


def own_gpm_start(nvml: Any, count: int) -> dict[int, tuple[Any, Any]]:
    """An independent GPM reading (not the sampler's code): a first sample per Hopper+ GPU."""
    started = {}
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                continue
            first = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, first)
            started[index] = (handle, first)
        except Exception as exc:  # GPM is optional: say so, keep going
            print(f"GPU {index}: own GPM sample failed ({type(exc).__name__}: {exc})")
    return started


def own_gpm_finish(nvml: Any, started: dict[int, tuple[Any, Any]]) -> dict[int, float | None]:
    values: dict[int, float | None] = {}
    for index, (handle, first) in started.items():
        second = nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmSampleGet(handle, second)
            mg = nvml.c_nvmlGpmMetricsGet_t()
            mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = first, second
            mg.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            nvml.nvmlGpmMetricsGet(mg)
            ok = mg.metrics[0].nvmlReturn == nvml.NVML_SUCCESS
            values[index] = float(mg.metrics[0].value) if ok else None
        except Exception as exc:
            print(f"GPU {index}: own GPM reading failed ({type(exc).__name__}: {exc})")
            values[index] = None
        finally:
            nvml.nvmlGpmSampleFree(first)
            nvml.nvmlGpmSampleFree(second)
    return values


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1e5 else f"{value:.0f}"
    return str(value)


def compare_gpu(gpu: GpuSample, row: dict[str, str], reasons_field: str, own_gpm: float | None) -> int:
    """Print one GPU's side-by-side table; returns the number of disagreements."""
    print(f"\nGPU {gpu.index}: {gpu.name} ({gpu.uuid})")
    print(f"  {'field':<34}{'GPU panel':>14}{'nvidia-smi':>14}{'diff':>10}")
    disagreements = 0

    def line(label: str, panel: Any, smi: Any, verdict: str, diff: Any = None) -> None:
        print(f"  {label:<34}{_fmt(panel):>14}{_fmt(smi):>14}{_fmt(diff) if diff is not None else '':>10}"
              f"  {verdict}")

    for check in CHECKS:
        panel, smi = check.panel(gpu), _number(row.get(check.smi_field, ""))
        if panel is None or smi is None:
            line(check.label, panel, smi, "(one side n/a)")
            continue
        diff = abs(panel - smi)
        bad = diff > check.tolerance(panel, smi)
        disagreements += bad
        line(check.label, panel, smi, "DISAGREE" if bad else "ok", diff)

    smi_mask = _number(row.get(reasons_field, ""))
    panel_mask = gpu.clock_event_mask
    same = panel_mask is not None and smi_mask is not None and int(smi_mask) == panel_mask
    # The idle bit flips with load between two reads; any other bit must match.
    idle = 0x1
    bad = panel_mask is not None and smi_mask is not None and (int(smi_mask) ^ panel_mask) & ~idle != 0
    disagreements += bad
    line(f"{reasons_field} (mask)", f"{panel_mask:#x}" if panel_mask is not None else None,
         f"{int(smi_mask):#x}" if smi_mask is not None else None,
         "DISAGREE" if bad else ("ok" if same else "ok (only the idle bit differs)"))
    print(f"  {'':<34}panel words: {', '.join(gpu.throttle_reasons) or 'none'}")

    if gpu.mem_bw_source == "gpm" or own_gpm is not None:
        panel_pct = gpu.mem_bw_pct if gpu.mem_bw_source == "gpm" else None
        diff = abs(panel_pct - own_gpm) if panel_pct is not None and own_gpm is not None else None
        bad = diff is not None and diff > 5
        disagreements += bad
        print(f"  {'GPM DRAM bandwidth [% of peak]':<34}{_fmt(panel_pct):>14}{_fmt(own_gpm):>14}"
              f"{_fmt(diff) if diff is not None else '':>10}  {'DISAGREE' if bad else 'ok'} "
              "(right: an independent GPM reading over the same ~1 s)")
        if gpu.mem_bw_gbps is not None:
            print(f"  {'':<34}panel: {gpu.mem_bw_gbps:.0f} GB/s of {gpu.peak_bw_gbps:.0f} GB/s peak")
    else:
        print(f"  {'GPM DRAM bandwidth':<34}not available on this GPU; the panel shows "
              f"{_fmt(gpu.mem_bw_pct)} % from {gpu.mem_bw_source or 'nothing'}")
    return disagreements


ENERGY_TOLERANCE = 0.10  # counter against power x time
ENERGY_EVERY_S = 0.1


def energy_check(sample: Any, seconds: float, sleep: Any = time.sleep) -> dict[tuple[str, int], tuple]:
    """Read `sample()` (a GpuReport) every 0.1 s for `seconds`: per GPU (vendor, index) the energy counter's
    change and power x time over the same readings, in joules, and the seconds they span."""
    points: dict[tuple[str, int], list[Point]] = {}
    end = time.monotonic() + seconds
    while True:
        for g in sample().gpus:
            if g.error is None:
                points.setdefault((g.vendor or "", g.index), []).append(Point(g.t, g.energy_j, g.power_w))
        if time.monotonic() >= end:
            break
        sleep(ENERGY_EVERY_S)
    out = {}
    for key, pts in points.items():
        counted = [p for p in pts if p.energy_j is not None]
        counter = counted[-1].energy_j - counted[0].energy_j if len(counted) >= 2 else None  # type: ignore[operator]
        span = counted[-1].t - counted[0].t if len(counted) >= 2 else None
        powered = over([Point(p.t, None, p.power_w) for p in pts])  # power x time alone
        out[key] = (counter, powered[0] if powered else None, span or (powered[1] if powered else None))
    return out


def print_energy(key: tuple[str, int], got: tuple | None, power_from_counter: bool = False) -> int:
    """One GPU's energy line; 1 when counter and power x time disagree past the tolerance. Where the power
    itself is the counter's change (Intel's hwmon has no power reading), there is nothing to check."""
    label = f"{'energy over the check [J]':<34}"
    if got is None:
        print(f"  {label}not read")
        return 0
    counter, power_time, span = got
    if power_from_counter and counter is not None and span:
        print(f"  {label}{counter:>14.1f}{'':>14}{'':>10}  ({counter / span:.1f} W over {span:.1f} s; this "
              "driver's power is the counter's change, so nothing independent to check it against)")
        return 0
    if counter is None or power_time is None:
        why = "no energy counter" if counter is None else "no power reading"
        print(f"  {label}{_fmt(counter):>14}{_fmt(power_time):>14}{'':>10}  ({why}; over {_fmt(span)} s)")
        return 0
    diff = abs(counter - power_time)
    bad = diff > ENERGY_TOLERANCE * max(abs(counter), abs(power_time), 1e-9)
    print(f"  {label}{counter:>14.1f}{power_time:>14.1f}{diff:>10.1f}  {'DISAGREE' if bad else 'ok'} "
          f"(left: the energy counter's change; right: power x time, over {span:.1f} s)")
    if span:
        print(f"  {'':<34}that is {counter / span:.1f} W by the counter, {power_time / span:.1f} W by power")
    return int(bad)


def show_sysfs(seconds: float, sysfs: SysfsGpus | None = None) -> int:
    """AMD and Intel GPUs: what the panel reads of each, and its energy check. The number of GPUs shown."""
    reader = sysfs or SysfsGpus()
    first = reader.sample({})
    if not first:
        return 0
    sampler = GpuSampler(nvml=_NoNvml(), sysfs=reader)
    energy = energy_check(sampler.sample, seconds)
    for g in sampler.sample().gpus:
        print(f"\nGPU {g.index}: {g.vendor} {g.name} ({g.driver}, {g.uuid or 'no PCI slot'}): no nvidia-smi "
              "to compare with; the panel reads")
        for label, value in (("utilization [%]", g.util_gpu_pct), ("memory busy [%]", g.util_mem_pct),
                             ("VRAM used [MiB]", _mib(g.vram_used_bytes)),
                             ("VRAM total [MiB]", _mib(g.vram_total_bytes)), ("power [W]", g.power_w),
                             ("power limit [W]", g.power_limit_w), ("temperature [C]", g.temp_c),
                             ("clock [MHz]", g.sm_clock_mhz), ("memory clock [MHz]", g.mem_clock_mhz),
                             ("fan [RPM]", g.fan_rpm), ("energy counter [J]", g.energy_j)):
            print(f"  {label:<34}{_fmt(value):>14}")
        print(f"  {'throttling':<34}{', '.join(g.throttle_reasons) or 'none the driver says'}")
        print(f"  {'':<34}{'counter':>14}{'power x time':>14}")
        print_energy((g.vendor or "", g.index), energy.get((g.vendor or "", g.index)),
                     power_from_counter=g.driver in ("xe", "i915"))
    return len(first)


class _NoNvml:
    """Stands in for pynvml where only sysfs GPUs are read: its init says there is no NVIDIA driver."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):  # pynvml's name
        pass

    NVMLError_DriverNotLoaded = NVMLError_LibraryNotFound

    def nvmlInit(self) -> None:  # pynvml's name
        raise self.NVMLError_LibraryNotFound("not looked for")


def main(argv: list[str] | None = None, nvml: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--interval", type=float, default=1.0, help="GPM interval in seconds (default 1)")
    parser.add_argument("--energy-seconds", type=float, default=3.0,
                        help="how long the energy counter is checked against power x time (default 3)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare with")
    args = parser.parse_args(argv)

    smi = shutil.which(args.nvidia_smi)
    if smi is None:
        if show_sysfs(args.energy_seconds):
            print(f"\ngpu_check: {args.nvidia_smi} not found on PATH: the AMD / Intel GPUs above are what "
                  "the panel reads (nothing to compare them with)")
            return 0
        print(f"gpu_check: {args.nvidia_smi} not found on PATH: nothing to compare with; no AMD or Intel GPU "
              f"in {SysfsGpus().root / 'class' / 'drm'} either: no GPU to check on this machine",
              file=sys.stderr)
        return 2
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            print("gpu_check: pynvml not found: install nvidia-ml-py, or run `make gpu-check-bundle` where "
                  f"it is installed (it copies pynvml.py into {BUNDLE.relative_to(REPO)})", file=sys.stderr)
            return 2
    sampler = GpuSampler(nvml, sysfs=False)  # NVIDIA only here; AMD and Intel are shown after
    try:
        baseline = sampler.sample()  # also the panel's GPM baseline
        if baseline.unavailable:
            print(f"gpu_check: {baseline.unavailable}", file=sys.stderr)
            return 2
        print(f"driver {baseline.driver_version}; pynvml: {getattr(nvml, '__file__', type(nvml).__name__)}")
        started = own_gpm_start(nvml, len(baseline.gpus))
        time.sleep(args.interval)
        own = own_gpm_finish(nvml, started)
        report = sampler.sample()  # the same moment as nvidia-smi below (a few ms apart)
        try:
            fields, rows = query_smi(smi)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"gpu_check: {exc}", file=sys.stderr)
            return 2
        energy = energy_check(sampler.sample, args.energy_seconds)
    finally:
        sampler.close()
    reasons_field = fields[-1]
    by_uuid = {row.get("uuid"): row for row in rows}
    disagreements = 0
    for gpu in report.gpus:
        row = by_uuid.get(gpu.uuid) or next((r for r in rows if r.get("index") == str(gpu.index)), None)
        if gpu.error or row is None:
            print(f"\nGPU {gpu.index}: {gpu.error or 'not in nvidia-smi output'}")
            disagreements += 1
            continue
        disagreements += compare_gpu(gpu, row, reasons_field, own.get(gpu.index))
        disagreements += print_energy(("NVIDIA", gpu.index), energy.get(("NVIDIA", gpu.index)))
    show_sysfs(args.energy_seconds)  # a mixed host: its AMD and Intel GPUs too
    verdict = f"{disagreements} disagreement(s)" if disagreements else "everything agrees within tolerance"
    print(f"\n{len(report.gpus)} GPU(s): {verdict}")
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
