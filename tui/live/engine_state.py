"""What the store keeps of one engine: its newest sample and stats, its readings over the longest window, its
plotted series, probes, traffic and findings; and the figures read off that state alone (its tokens over a
GPU's energy window, the proxy's per-request figures with its busy share)."""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tui.findings.tracker import Since
from tui.live.series import Series
from tui.model.bench import BenchSample
from tui.model.containers import CgroupReading, CgroupUse, Container
from tui.model.findings import Finding, StartMemory
from tui.model.samples import EngineReading, EngineSample, EngineStats, PromptProgress, RequestStats
from tui.model.traffic import TrafficSample
from tui.sources.requests import serving


@dataclass
class EngineState:
    name: str
    url: str
    sample: EngineSample | None = None
    stats: EngineStats = field(default_factory=EngineStats)
    # (t, reading) for the longest window we derive over, all from the engine's current run
    readings: deque[tuple[float, EngineReading]] = field(default_factory=deque)
    reset_t: float | None = None  # when the counters last went back (the engine restarted)
    # The newest reading's shape (tui.sources.rates.shape), its counters, and since when readings had it
    shape: tuple[object, ...] | None = None
    has: tuple[bool, ...] = ()
    shape_t: float = math.inf
    series: dict[str, Series] = field(default_factory=dict)
    glance: dict[str, Series] = field(default_factory=dict)  # GLANCE_SERIES, for the sparklines
    probes: deque[tuple[float, Any]] = field(default_factory=deque)  # (t, ProbeResult), oldest first
    rss_bytes: int | None = None
    # Where its processes run (the host sample's): its container, what that container's cgroup imposes now,
    # the cgroup's readings over the rate window and its counters over them; or why no process of this
    # machine is the engine's although one holds its port (a tunnel, a forwarder: tui.sources.port_holder)
    container: Container | None = None
    cgroup: CgroupReading | None = None
    cgroup_readings: deque[tuple[float, CgroupReading]] = field(default_factory=deque)
    cgroup_use: CgroupUse | None = None
    port_note: str | None = None
    traffic: TrafficSample | None = None  # the user's own requests, measured by the proxy in front of it
    bench: BenchSample | None = None  # a bench or capacity run on this engine (tui.workload.live)
    # A llama-server router's loaded models: each one's readings over the rate window, and its gen tok/s
    model_readings: dict[str, deque[tuple[float, EngineReading]]] = field(default_factory=dict)
    model_gen_tps: dict[str, float | None] = field(default_factory=dict)
    model_status_since: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> (status, wall)
    model_used: dict[str, float] = field(default_factory=dict)  # id -> wall time it last served a request
    prefill: PromptProgress | None = None  # a probe's long prompt, as the engine streams its progress
    # Findings (tui.findings): what holds now, since when; and the evidence the store gathers for them over
    # the engine's current run: the most requests it ran and kept waiting at once, since when it is read
    findings: tuple[Finding, ...] = ()
    since: Since = field(default_factory=Since)
    start: StartMemory | None = None  # what its start cost the host, from the lifecycle (engine_start)
    busy_max: int | None = None
    waiting_max: int | None = None
    watched_t: float | None = None
    # (t, generated tokens so far) of an engine whose figures its source computed (Prometheus), kept for
    # ENERGY_KEEP_S: its tokens over exactly a GPU's energy window (generated_per_s), for the fleet's J/tok
    generated: deque[tuple[float, float]] = field(default_factory=deque)


def generated_per_s(state: EngineState, t0: float, t1: float) -> float | None:
    """The engine's generated tokens per second from t0 to t1 (a GPU's energy window), its counter (kept
    apart for an engine whose rates its source computed, else its readings') taken between readings by
    linear interpolation; None without readings covering at least half the span (never a rate over another
    window stood in for this one)."""
    points = list(state.generated) or [(t, r.generation_tokens_total) for t, r in state.readings
                                       if r.generation_tokens_total is not None]
    if len(points) < 2 or t1 <= t0:
        return None
    a, b = max(t0, points[0][0]), min(t1, points[-1][0])
    if b - a < (t1 - t0) / 2:
        return None

    def at(t: float) -> float:
        i = bisect.bisect_left(points, t, key=lambda p: p[0])
        if i < len(points) and points[i][0] == t:
            return points[i][1]
        (ta, va), (tb, vb) = points[i - 1], points[i]
        return va + (vb - va) * (t - ta) / (tb - ta)

    return (at(b) - at(a)) / (b - a)


def relayed(state: EngineState) -> RequestStats | None:
    """The proxy's per-request figures, for an engine that publishes none of its own (llama.cpp), with the
    busy share and the rate while serving from its own readings (/metrics or /slots)."""
    traffic = state.traffic
    lives = traffic.stats.per_request if traffic is not None and traffic.error is None else None
    if lives is None:
        return None
    busy, while_serving = serving(state.readings)
    return dataclasses.replace(lives, busy_share=busy, gen_tps_serving=while_serving)
