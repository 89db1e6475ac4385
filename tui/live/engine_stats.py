"""One engine's figures over the store's windows, read off what the store keeps of it (EngineState): its stats
(rates over the rate window, quantiles and the rest over the latency window), the plotted pair alone, a
router's models' rates and use, and its container's cgroup use. Each takes the engine's state alone: the
figures that need the other engines, the GPUs or the host (energy, its attribution) stay in the store."""

from __future__ import annotations

import bisect
from collections import deque

from tui.live.engine_state import EngineState, relayed
from tui.model.samples import EngineReading, EngineSample, EngineStats, ProcessTreeMemory
from tui.sources.cgroup import use_between
from tui.sources.rates import derive, gen_tps, spec_totals, ttft_p50
from tui.sources.requests import request_stats


def engine_stats(state: EngineState, t: float, rate_window_s: float, latency_window_s: float) -> EngineStats:
    """The engine's stats from its readings, its energy per token left to the store (Store._energy)."""
    # Shown until the latency window holds only the new run: its figures cover less time meanwhile.
    reset = state.reset_t is not None and t - state.reset_t < latency_window_s
    readings = state.readings
    if len(readings) < 2:
        if not readings:
            return EngineStats(counter_reset=reset)
        rate, length, per_pos = spec_totals(readings[-1][1])
        return EngineStats(counter_reset=reset, spec_accept_rate_total=rate,
                           spec_accept_length_total=length, spec_accept_per_pos_total=per_pos)
    cur_t, cur = readings[-1]
    rate_t, rate_prev = _oldest_within(readings, t - rate_window_s)
    lat_t, lat_prev = readings[0]
    rates = derive(rate_prev, rate_t, cur, cur_t, quantiles=False)  # only its rates are shown
    lat = derive(lat_prev, lat_t, cur, cur_t)
    return EngineStats(
        prompt_processed_tps=rates.prompt_processed_tps,
        prompt_computed_tps=rates.prompt_computed_tps,
        gen_tps=rates.gen_tps,
        decode_tps_busy=lat.decode_tps_busy,
        prefix_cache_hit_rate=lat.prefix_cache_hit_rate,
        spec_accept_rate=lat.spec_accept_rate,
        spec_accept_length=lat.spec_accept_length,
        spec_accept_per_pos=lat.spec_accept_per_pos,
        spec_drafts_per_s=rates.spec_drafts_per_s,
        spec_accept_rate_total=lat.spec_accept_rate_total,
        spec_accept_length_total=lat.spec_accept_length_total,
        spec_accept_per_pos_total=lat.spec_accept_per_pos_total,
        ttft_p50_s=lat.ttft_p50_s,
        ttft_p90_s=lat.ttft_p90_s,
        itl_p50_s=lat.itl_p50_s,
        itl_p90_s=lat.itl_p90_s,
        counter_reset=reset,
        requests=request_stats(readings) or relayed(state),
    )


def plotted(state: EngineState, rate_window_s: float) -> tuple[float | None, float | None]:
    """engine_stats(state, t, …)'s gen_tps and ttft_p50_s (the store's ENGINE_SERIES), without the other
    figures."""
    readings = state.readings
    if len(readings) < 2:
        return None, None
    cur_t, cur = readings[-1]
    rate_t, rate_prev = _oldest_within(readings, cur_t - rate_window_s)
    lat_t, lat_prev = readings[0]
    # Readings since shape_t each passed went_back against the one before: none went back since.
    return (gen_tps(rate_prev, rate_t, cur, cur_t, chained=rate_t >= state.shape_t),
            ttft_p50(lat_prev, lat_t, cur, cur_t, chained=lat_t >= state.shape_t))


def routed(state: EngineState, sample: EngineSample, t: float, rate_window_s: float) -> None:
    """Each loaded model's generation rate over the rate window (the router's own /metrics has none),
    since when it has its status, and when it last served (its counters moved, or a slot was busy):
    the router's /models says neither."""
    for m in sample.models or ():
        if state.model_status_since.get(m.id, ("",))[0] != m.status:
            state.model_status_since[m.id] = (m.status, sample.wall)
        before = state.model_readings.get(m.id)
        moved = before is not None and m.reading is not None and _served(before[-1][1], m.reading)
        if moved or (m.slots is not None and any(s.processing for s in m.slots.slots)):
            state.model_used[m.id] = sample.wall
    loaded = {m.id: m.reading for m in sample.models or () if m.reading is not None}
    for model in list(state.model_readings):
        if model not in loaded:  # unloaded: its counters start again with its next load
            del state.model_readings[model]
            state.model_gen_tps.pop(model, None)
    for model, reading in loaded.items():
        kept = state.model_readings.setdefault(model, deque())
        kept.append((t, reading))
        while len(kept) > 2 and t - kept[1][0] >= rate_window_s:
            kept.popleft()
        first_t, first = kept[0]
        state.model_gen_tps[model] = gen_tps(first, first_t, reading, t) if len(kept) > 1 else None


def placed(state: EngineState, tree: ProcessTreeMemory | None, t: float, rate_window_s: float) -> bool:
    """The engine's container and its cgroup's counters over the rate window; whether there is anything
    to judge of them (it is in a container now, or was)."""
    was = state.container is not None
    state.container = tree.container if tree is not None else None
    cgroup = tree.cgroup if tree is not None else None
    state.cgroup = cgroup
    kept = state.cgroup_readings
    if cgroup is None or cgroup.error is not None:
        kept.clear()
        state.cgroup_use = None
        return was or state.container is not None
    kept.append((t, cgroup))
    while len(kept) > 2 and t - kept[1][0] >= rate_window_s:
        kept.popleft()
    (t0, first), _ = kept[0], kept[-1]
    state.cgroup_use = use_between(first, cgroup, t - t0) if t > t0 else None
    return True


def _oldest_within(readings: deque[tuple[float, EngineReading]], t0: float) -> tuple[float, EngineReading]:
    """The oldest reading at or after t0, but never the newest one (a rate needs two readings). Readings
    are in time order (appended as polled): a binary search, not a walk over the latency window's minute."""
    if len(readings) < 2:
        raise ValueError("a window needs two readings")
    i = bisect.bisect_left(readings, t0, key=_time)
    return readings[min(i, len(readings) - 2)]


def _time(item: tuple[float, EngineReading]) -> float:
    return item[0]


def _served(before: EngineReading, now: EngineReading) -> bool:
    """Did the model take requests between two readings of its counters?"""
    return any(getattr(now, key) not in (None, getattr(before, key)) for key in
               ("generation_tokens_total", "prompt_tokens_processed_total"))
