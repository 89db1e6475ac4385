"""Bounded history of everything polled: memory does not grow with session length.

Counters become rates here (over a short window, so llama.cpp's end-of-request counter updates do not
read as bursts) and histograms become quantiles over a longer window. Nothing here imports Textual.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tui.sources.rates import derive
from tui.sources.samples import EngineReading, EngineSample, EngineStats, GpuReport, HostSample

Point = tuple[float, float]  # (time.monotonic(), value)


class Series:
    """A ring buffer of (t, value); values that are not available are simply not stored."""

    def __init__(self, maxlen: int) -> None:
        self.points: deque[Point] = deque(maxlen=maxlen)

    def add(self, t: float, value: float | None) -> None:
        if value is not None:
            self.points.append((t, value))

    def since(self, t0: float) -> list[Point]:
        return [p for p in self.points if p[0] >= t0]

    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None


@dataclass
class EngineState:
    name: str
    url: str
    sample: EngineSample | None = None
    stats: EngineStats = field(default_factory=EngineStats)
    # (t, reading) for the longest window we derive over
    readings: deque[tuple[float, EngineReading]] = field(default_factory=deque)
    series: dict[str, Series] = field(default_factory=dict)
    probes: deque[tuple[float, Any]] = field(default_factory=lambda: deque(maxlen=200))  # (t, ProbeResult)
    rss_bytes: int | None = None


ENGINE_SERIES = ("gen_tps", "prompt_tps", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "running", "waiting")


class Store:
    def __init__(self, horizon_s: float = 600.0, rate_window_s: float = 10.0,
                 latency_window_s: float = 60.0, max_points: int = 3600) -> None:
        self.horizon_s = horizon_s
        self.rate_window_s = rate_window_s
        self.latency_window_s = latency_window_s
        self.max_points = max_points
        self.engines: dict[str, EngineState] = {}
        self.gpu: GpuReport | None = None
        self.host: HostSample | None = None
        self.throttle: Series = Series(max_points)  # 1.0 while any GPU reports a real throttle reason
        self.throttle_words: dict[int, tuple[str, ...]] = {}

    def engine(self, name: str, url: str = "") -> EngineState:
        state = self.engines.get(name)
        if state is None:
            series = {k: Series(self.max_points) for k in ENGINE_SERIES}
            state = EngineState(name=name, url=url, series=series)
            self.engines[name] = state
        return state

    def add_engine_sample(self, sample: EngineSample) -> EngineState:
        state = self.engine(sample.name, sample.url)
        state.sample = sample
        t = sample.t
        if sample.reading is None:
            if sample.health != "up":
                state.stats = EngineStats()
            return state
        readings = state.readings
        readings.append((t, sample.reading))
        while readings and t - readings[0][0] > self.latency_window_s + 1.0:
            readings.popleft()
        state.stats = self._stats(readings, t)
        for key in ENGINE_SERIES:
            value = getattr(state.stats, key, None)
            if value is None:
                value = getattr(sample.reading, key, None)
            state.series[key].add(t, value)
        return state

    def _stats(self, readings: deque[tuple[float, EngineReading]], t: float) -> EngineStats:
        if len(readings) < 2:
            return EngineStats()
        cur_t, cur = readings[-1]
        rate_prev = _oldest_within(readings, t - self.rate_window_s)
        lat_prev = readings[0]
        rates = derive(rate_prev[1], rate_prev[0], cur, cur_t)
        lat = derive(lat_prev[1], lat_prev[0], cur, cur_t)
        return EngineStats(
            prompt_tps=rates.prompt_tps,
            gen_tps=rates.gen_tps,
            decode_tps_busy=lat.decode_tps_busy,
            prefix_cache_hit_rate=lat.prefix_cache_hit_rate,
            spec_accept_rate=lat.spec_accept_rate,
            spec_accept_length=lat.spec_accept_length,
            ttft_p50_s=lat.ttft_p50_s,
            ttft_p90_s=lat.ttft_p90_s,
            itl_p50_s=lat.itl_p50_s,
            itl_p90_s=lat.itl_p90_s,
            counter_reset=rates.counter_reset or lat.counter_reset,
        )

    def add_gpu_report(self, report: GpuReport) -> None:
        self.gpu = report
        throttled = [g for g in report.gpus if g.throttled]
        self.throttle.add(report.t, 1.0 if throttled else 0.0)
        self.throttle_words = {g.index: g.throttle_reasons for g in throttled}

    def add_host_sample(self, sample: HostSample) -> None:
        self.host = sample
        by_engine = {m.engine: m.rss_bytes for m in sample.engines}
        for name, state in self.engines.items():
            state.rss_bytes = by_engine.get(name)

    def add_probe(self, name: str, result: Any, t: float | None = None) -> None:
        self.engine(name).probes.append((time.monotonic() if t is None else t, result))

    def throttle_spans(self, t0: float) -> list[tuple[float, float]]:
        """Periods (start, end) since t0 in which a GPU reported a real throttle reason."""
        spans: list[tuple[float, float]] = []
        start: float | None = None
        last_t = t0
        for t, v in self.throttle.since(t0):
            if v and start is None:
                start = t
            elif not v and start is not None:
                spans.append((start, t))
                start = None
            last_t = t
        if start is not None:
            spans.append((start, last_t))
        return spans


def _oldest_within(readings: Iterable[tuple[float, EngineReading]], t0: float) -> tuple[float, EngineReading]:
    """The oldest reading at or after t0, but never the newest one (a rate needs two readings)."""
    items = list(readings)
    for item in items[:-1]:
        if item[0] >= t0:
            return item
    return items[-2]
