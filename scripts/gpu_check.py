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
from tui.sources.gpu import GpuSampler  # noqa: E402

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


def main(argv: list[str] | None = None, nvml: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--interval", type=float, default=1.0, help="GPM interval in seconds (default 1)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare with")
    args = parser.parse_args(argv)

    smi = shutil.which(args.nvidia_smi)
    if smi is None:
        print(f"gpu_check: {args.nvidia_smi} not found on PATH: nothing to compare with", file=sys.stderr)
        return 2
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            print("gpu_check: pynvml not found: install nvidia-ml-py, or run `make gpu-check-bundle` where "
                  f"it is installed (it copies pynvml.py into {BUNDLE.relative_to(REPO)})", file=sys.stderr)
            return 2
    sampler = GpuSampler(nvml)
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
    verdict = f"{disagreements} disagreement(s)" if disagreements else "everything agrees within tolerance"
    print(f"\n{len(report.gpus)} GPU(s): {verdict}")
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
