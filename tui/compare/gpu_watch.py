"""GPU state during one probe block: sampled in a thread while the block runs, then summarised, the GPUs'
energy over the block included (their energy counters' change, or power x time: tui.sources.energy).

A block is flagged `throttled` when any sample showed a real throttle reason (power cap, HW or thermal
slowdown, power brake, sync boost), not idle or user-set clocks: such a block measured a slowed GPU.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tui.model.samples import GpuReport
from tui.sources.energy import span_of_reports
from tui.sources.energy_meter import GpuSource

__all__ = ["GpuSource", "GpuWatch", "summarize_reports"]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize_reports(reports: list[GpuReport]) -> dict[str, Any]:
    """Across samples: power is summed over GPUs then averaged in time; temperature is the hottest seen."""
    unavailable = next((r.unavailable for r in reports if r.unavailable), None)
    power: list[float] = []
    util: list[float] = []
    bw: list[float] = []
    sm_clock: list[float] = []
    temps: list[float] = []
    vram: list[float] = []
    reasons: list[str] = []
    throttled = False
    names: list[str] = []
    power_limit = None
    for report in reports:
        if not report.gpus:
            continue
        watts = [g.power_w for g in report.gpus if g.power_w is not None]
        if watts:
            power.append(sum(watts))
        limits = [g.power_limit_w for g in report.gpus if g.power_limit_w is not None]
        if limits:
            power_limit = sum(limits)
        for g in report.gpus:
            if g.name and g.name not in names:
                names.append(g.name)
            for value, into in (
                (g.util_gpu_pct, util),
                (g.mem_bw_pct, bw),
                (g.sm_clock_mhz, sm_clock),
                (g.temp_c, temps),
            ):
                if value is not None:
                    into.append(float(value))
            if g.vram_used_bytes is not None:
                vram.append(g.vram_used_bytes)
            throttled = throttled or g.throttled
            reasons += [r for r in g.throttle_reasons if r not in reasons]
    return {
        "samples": len(reports),
        "gpus": names,
        "unavailable": unavailable if not names else None,
        "temp_c_max": max(temps) if temps else None,
        "power_w_mean": _mean(power),
        "power_limit_w": power_limit,
        "util_gpu_pct_mean": _mean(util),
        "mem_bw_pct_mean": _mean(bw),
        "sm_clock_mhz_mean": _mean(sm_clock),
        "vram_used_bytes_max": max(vram) if vram else None,
        "throttle_reasons": reasons,
        "throttled": throttled,
        **span_of_reports(reports),
    }


class GpuWatch:
    """`with GpuWatch(sampler.sample, pids=EnginePids(name, url)) as watch: ...` then `watch.summary()`;
    samples at both ends at least. `pids`: the engine's process tree, given to the source each sample so that
    an AMD or Intel GPU (whose processes sysfs lists only for given PIDs) is seen holding it."""

    def __init__(self, source: GpuSource | None, interval_s: float = 0.5,
                 pids: Callable[[], dict[str, set[int]]] | None = None) -> None:
        self._source = source
        self._interval = interval_s
        self._pids = pids
        self._reports: list[GpuReport] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: str | None = None

    def _take(self) -> None:
        if self._source is not None:
            try:
                self._reports.append(self._source(self._pids() if self._pids is not None else None))
            except Exception as e:  # the readings so far stay; the energy over a shortened span does not
                self._source = None
                self._failed = f"GPU sampling failed during the run ({type(e).__name__}: {e})"

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._take()

    def __enter__(self) -> GpuWatch:
        # The sampler is not thread-safe: only this watch's thread touches it until __exit__ joins it.
        self._take()
        self._thread = threading.Thread(target=self._loop, name="gpu-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()

    def summary(self) -> dict[str, Any]:
        if self._failed is not None:
            out = summarize_reports(self._reports or [GpuReport(t=0.0, unavailable=self._failed)])
            return {**out, "energy_j": None, "energy_s": None, "energy_source": None, "energy_gpus": [],
                    "energy_note": f"{self._failed}: no energy figure", "sampling_failed": True}
        if self._source is None:
            return summarize_reports([GpuReport(t=0.0, unavailable="GPU not sampled")])
        return summarize_reports(self._reports)
