"""Store: which readings each window uses, engine restarts, throttle spans, and a horizon of any length."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace
from pathlib import Path

import pytest

from tui.live.engine_stats import _oldest_within
from tui.live.series import Series
from tui.live.store import MIN_PROBES_KEPT, Store
from tui.model.config import EngineConfig
from tui.model.findings import StartMemory
from tui.model.samples import EngineReading, EngineSample, GpuReport, GpuSample
from tui.sources.metrics import parse_reading
from widgets.engine_panel import render_engine

DATA = Path(__file__).parent / "data" / "metrics"
GIB = 2**30
# Real llama-server bodies: a long-running engine, and a fresh one after its readiness check, 1 more token,
# and 64 more (tests/data/metrics/llamacpp_readiness_sequence.json).
RUNNING = parse_reading((DATA / "llamacpp.txt").read_text())
_SEQUENCE = json.loads((DATA / "llamacpp_readiness_sequence.json").read_text())["bodies"]
READY, ONE, SIXTY_FOUR = (parse_reading(_SEQUENCE[k]) for k in ("after_readiness", "after_1_token",
                                                               "after_64_tokens"))


def sample(t: float, reading: EngineReading | None, health: str = "up") -> EngineSample:
    return EngineSample(name="llama", url="http://127.0.0.1:8080", t=t, wall=1.8e9 + t, health=health,
                        reading=reading)


def generating(reading: EngineReading, seconds: float, tps: float) -> EngineReading:
    """`reading` after `seconds` more of decoding at `tps` tokens per second."""
    return replace(reading, generation_tokens_total=reading.generation_tokens_total + round(seconds * tps),
                   generation_seconds_total=reading.generation_seconds_total + seconds)


# --- window selection -----------------------------------------------------------------------------------


def test_oldest_within_picks_the_oldest_reading_in_the_window_but_never_the_newest() -> None:
    readings = deque((float(t), RUNNING) for t in range(21))
    assert _oldest_within(readings, 15.0)[0] == 15.0  # at t0 exactly: inside
    assert _oldest_within(readings, 14.5)[0] == 15.0
    assert _oldest_within(readings, -100.0)[0] == 0.0
    assert _oldest_within(readings, 20.0)[0] == 19.0  # only the newest inside: the one before it
    assert _oldest_within(readings, 99.0)[0] == 19.0
    assert _oldest_within(deque(list(readings)[:2]), 5.0)[0] == 0.0


def test_rates_use_the_rate_window_and_busy_rate_and_quantiles_the_latency_window() -> None:
    store = Store(horizon_s=300, rate_window_s=10, latency_window_s=60)
    reading = RUNNING
    for t in range(91):  # 50 tok/s for 80 s, then 10 tok/s for the last 10 s
        if t:
            reading = generating(reading, 1.0, 50.0 if t <= 80 else 10.0)
        state = store.add_engine_sample(sample(float(t), reading))
    assert [t for t, _ in state.readings] == list(range(29, 91))  # latency window (60 s) plus a second
    assert state.stats.gen_tps == pytest.approx(10.0)  # t=80..90 only
    # decode busy over the 61 s from t=29: 51 s at 50 tok/s and 10 s at 10 tok/s, all busy time
    assert state.stats.decode_tps_busy == pytest.approx((51 * 50 + 10 * 10) / 61)
    assert state.stats.counter_reset is False
    # each point is the rate over the 10 s before it: the slowdown at t=80 takes 10 s to show in full
    assert [round(v) for _, v in state.series["gen_tps"].since(80.0)] == list(range(50, 9, -4))


# --- engine restarts ------------------------------------------------------------------------------------


def test_figures_come_back_two_readings_after_a_restart_with_the_reset_shown() -> None:
    store = Store(horizon_s=300, rate_window_s=10, latency_window_s=60)
    reading = RUNNING
    for t in range(30):  # a long-running engine
        reading = generating(reading, 1.0, 50.0)
        store.add_engine_sample(sample(float(t), reading))
    state = store.add_engine_sample(sample(30.0, None, health="down"))  # restarting: no answer
    assert state.stats.gen_tps is None
    state = store.add_engine_sample(sample(31.0, READY))  # the new run: its counters are lower
    assert state.stats.counter_reset is True and state.stats.gen_tps is None
    assert [t for t, _ in state.readings] == [31.0]  # nothing from the old run is compared with the new

    state = store.add_engine_sample(sample(32.0, ONE))
    stats = state.stats
    assert stats.counter_reset is True  # still shown: the windows hold only the new run
    assert stats.gen_tps == pytest.approx(1.0)  # one token in 1 s, not void for the rate window (10 s)
    assert stats.prompt_processed_tps == pytest.approx(25.0)  # 24 computed + 1 cached, as the server said
    assert stats.prompt_computed_tps == pytest.approx(24.0)
    assert stats.decode_tps_busy is None  # 1 token: too little for a busy rate

    state = store.add_engine_sample(sample(62.0, SIXTY_FOUR))
    # the latency window runs from the new run's first reading, not void for 60 s of old readings
    assert state.stats.decode_tps_busy == pytest.approx(65 / (28.2566 - 1e-6))
    assert state.stats.counter_reset is True
    state = store.add_engine_sample(sample(91.5, SIXTY_FOUR))
    assert state.stats.counter_reset is False  # the latency window holds only the new run now


def test_another_dialect_on_the_same_url_is_a_restart() -> None:
    store = Store(horizon_s=300)
    store.add_engine_sample(sample(0.0, RUNNING))
    store.add_engine_sample(sample(1.0, generating(RUNNING, 1.0, 50.0)))
    vllm = parse_reading((DATA / "vllm_cpu_0.32_real.txt").read_text())
    state = store.add_engine_sample(sample(2.0, vllm))
    assert state.stats.counter_reset is True
    assert [r.dialect for _, r in state.readings] == ["vllm"]


def test_an_engine_down_has_no_findings_but_what_its_start_cost() -> None:
    """Its configuration, traffic and counters were of a run that is over: what they showed holds no more
    while it is down; a kill while it started is what holds then."""
    config = EngineConfig("llama.cpp", 0.0, spec_type="draft-simple", spec_n_max=4, sources=("argv (PID 1)",))
    drafting = replace(RUNNING, spec_drafts_total=100.0, spec_draft_tokens_total=400.0,
                       spec_accepted_tokens_total=190.0, spec_accepted_per_pos=(90.0, 60.0, 30.0, 10.0))
    store = Store()
    state = store.add_engine_sample(replace(sample(0.0, drafting), config=config))
    assert [f.id for f in state.findings] == ["spec-depth"]
    state = store.add_engine_sample(replace(sample(1.0, None, health="down"), config=config))
    assert state.findings == ()
    killed = StartMemory(GIB, 0, 3.0, 24 * GIB, 4 * GIB, 0, ended="killed by SIGKILL while starting")
    store.engine_start("llama", killed)
    assert [f.id for f in state.findings] == ["engine-killed"]
    # a dead vLLM engine core still serves /metrics: down all the same
    state = store.add_engine_sample(replace(sample(2.0, drafting, health="down"), config=config))
    assert [f.id for f in state.findings] == ["engine-killed"]
    state = store.add_engine_sample(replace(sample(3.0, drafting), config=config))
    assert {f.id for f in state.findings} == {"spec-depth", "engine-killed"}


# --- throttle spans -------------------------------------------------------------------------------------


def gpu(t: float, throttled: bool) -> GpuReport:
    return GpuReport(t=t, gpus=(GpuSample(index=0, t=t, name="NVIDIA H200", throttled=throttled),))


def test_throttle_spans_start_end_open_and_cut_at_t0() -> None:
    store = Store(horizon_s=300)
    for t in range(23):  # throttled from 10 to 14, free from 15, throttled again from 20 to the end
        store.add_gpu_report(gpu(float(t), 10 <= t < 15 or t >= 20))
    assert store.throttle_spans(0.0) == [(10.0, 15.0), (20.0, 22.0)]  # the open span ends at the last report
    assert store.throttle_spans(12.0) == [(12.0, 15.0), (20.0, 22.0)]  # cut at t0
    assert store.throttle_spans(16.0) == [(20.0, 22.0)]
    store.add_gpu_report(gpu(23.0, False))
    assert store.throttle_spans(16.0) == [(20.0, 23.0)]


def test_a_throttled_second_survives_a_day_long_horizon() -> None:
    store = Store(horizon_s=86400, max_points=3600)  # 24 s per point
    for t in range(0, 3600):
        store.add_gpu_report(gpu(float(t), t == 1801))
    spans = store.throttle_spans(0.0)
    assert len(spans) == 1 and spans[0][0] <= 1801 < spans[0][1]  # never averaged away


# --- horizon --------------------------------------------------------------------------------------------


def test_a_24_hour_horizon_keeps_the_whole_day_in_bounded_memory() -> None:
    horizon = 86400.0
    series = Series(horizon, max_points=3600)
    for t in range(int(horizon * 1.5)):  # 1 Hz for a day and a half
        series.add(float(t), float(t % 24))
    now = horizon * 1.5 - 1
    points = series.since(0.0)
    assert len(points) <= 3601
    assert points[0][0] >= now - horizon  # nothing older than the horizon
    assert points[0][0] <= now - horizon + 24  # ... and the whole horizon is there
    assert points[-1][0] >= now - 24
    assert all(v == pytest.approx(11.5) for _, v in points[1:-1])  # mean of 0..23 over each 24 s bucket


def test_a_5_minute_horizon_keeps_every_sample() -> None:
    series = Series(300.0, max_points=3600)
    t, times = 1000.0, []
    for i in range(600):  # 1 Hz with 80 ms of jitter either way
        t += 1.0 + (0.08 if i % 2 else -0.08)
        times.append(t)
        series.add(t, float(i))
    kept = series.since(0.0)
    assert [p[0] for p in kept] == [x for x in times if x >= t - 300]
    assert [p[1] for p in kept] == [float(i) for i, x in enumerate(times) if x >= t - 300]


def test_probes_are_kept_over_the_horizon_with_a_cap() -> None:
    store = Store(horizon_s=60, max_probes=50)
    for t in range(0, 600, 5):
        store.add_probe("llama", f"probe at {t}", t=float(t))
    probes = store.engine("llama").probes
    assert [t for t, _ in probes] == [float(t) for t in range(535, 600, 5)]  # the last 60 s
    for t in range(600, 700):
        store.add_probe("llama", "burst", t=float(t) / 1000 + 600)
    assert len(probes) == 50
    quiet = Store(horizon_s=10)
    for t in range(0, 1000, 100):  # rarer than the horizon: the panel still lists the last few
        quiet.add_probe("llama", "rare", t=float(t))
    assert len(quiet.engine("llama").probes) == MIN_PROBES_KEPT


def test_a_horizon_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="horizon must be a positive number of seconds, got 0"):
        Store(horizon_s=0)


# --- what the engine panel shows from it ------------------------------------------------------------------


def test_panel_reads_a_dash_after_the_readiness_check_and_names_both_prompt_rates() -> None:
    store = Store(horizon_s=300)
    fresh = replace(READY, prompt_tokens_processed_total=0, prompt_tokens_computed_total=0,
                    generation_tokens_total=0, generation_seconds_total=0, prefix_cache_queries_total=0)
    store.add_engine_sample(sample(0.0, fresh))  # before the readiness check
    text = render_engine(store.add_engine_sample(sample(1.0, READY))).plain
    assert "decode busy –" in " ".join(text.split())  # 1 token over 1e-6 s: no figure, not 1000000.0
    assert "1000000" not in text
    state = store.add_engine_sample(sample(2.0, ONE))
    lines = {line.split()[0] + " " + line.split()[1]: line for line in render_engine(state).plain.splitlines()
             if line.startswith(("prompt tok/s", "prefill tok/s"))}
    # over the 2 s since the fresh reading: two prompts, 50 tokens of which 1 came from the cache
    assert lines["prompt tok/s"].split()[-1] == "25.0"  # every prompt token, the cached one included
    assert lines["prefill tok/s"].split()[-1] == "24.5"  # the 49 the engine computed


# --- a replay's seek: many samples at once ---------------------------------------------------------------


def _moving(seed: int, n: int) -> list[EngineSample]:
    """A real vLLM body moved on second by second, with what a long session meets: a restart (counters
    back to the start), a poll whose /metrics failed, a counter missing for a while, one missing and back
    lower (nothing adjacent went back: only readings further apart show it), TTFT buckets that change
    bounds, an engine down."""
    import random

    base = parse_reading((DATA / "vllm_cpu_0.32_real.txt").read_text())
    rng = random.Random(seed)
    out, current = [], base
    for i in range(n):
        add = 0.0
        buckets = []
        for bound, count in current.ttft_buckets:
            add += rng.randint(0, 1)
            buckets.append((bound, count + add))
        if i == 150:  # the engine now gives one bucket less
            buckets = buckets[:3] + buckets[4:]
        tokens = current.generation_tokens_total + rng.randint(0, 90) - (5000 if i == 124 else 0)
        current = replace(current, generation_tokens_total=tokens, ttft_buckets=tuple(buckets))
        reading: EngineReading | None = current
        if i == n // 2:
            current = reading = base  # restarted
        if i % 37 == 5:
            reading = None  # /metrics failed, health still up
        if 60 <= i < 64 or 120 <= i < 124:
            reading = replace(current, generation_tokens_total=None)
        health = "down" if i == n - 30 else "up"
        out.append(EngineSample(name=f"e{seed}", url="u", t=100.0 + i * 0.5 + rng.random() * 0.1, wall=0.0,
                                health=health, reading=None if health == "down" else reading))
    return out


def test_add_many_leaves_the_store_as_adding_one_by_one_does() -> None:
    samples = sorted(_moving(1, 400) + _moving(2, 380), key=lambda s: s.t)
    gpu = [GpuReport(t=100.0 + i, gpus=(GpuSample(index=0, t=100.0 + i, throttled=i % 9 < 3),))
           for i in range(200)]
    items = sorted(samples + gpu, key=lambda s: s.t)
    for end in (len(items), len(items) - 20, len(items) // 2 + 3, 150):
        one, many = Store(horizon_s=60.0), Store(horizon_s=60.0)
        for item in items[:end]:
            one.add(item)
        many.add_many(items[:end])
        assert one.engines.keys() == many.engines.keys()
        for name, state in one.engines.items():
            other = many.engines[name]
            assert state.stats == other.stats and state.sample == other.sample
            assert state.reset_t == other.reset_t and list(state.readings) == list(other.readings)
            for key, series in state.series.items():
                assert series.points == other.series[key].points, (end, name, key)
        assert one.throttle.points == many.throttle.points and one.gpu == many.gpu
        if end == len(items):  # the runs met what they were made to meet
            assert one.engines["e1"].reset_t is not None and one.engines["e2"].reset_t is not None
            assert sum(v is not None for _, v in one.engines["e1"].series["ttft_p50_s"].points) > 20
            assert any(v for _, v in one.throttle.points)


def test_a_sparkline_spans_the_same_time_whatever_the_poll_interval():
    """`+`/`-` change the poll interval: a sparkline's cells are seconds, not polls, so 24 cells are the last
    24 s at 0.25 s polls as at 1 s polls and at 4 s ones (a cell no poll fell in holds the one before)."""
    from tui.live.series import Series

    def series(every_s: float) -> Series:
        s = Series(600.0, 3600)
        t = 0.0
        while t <= 120.0:
            s.add(1000.0 + t, 10.0 if t < 100.0 else 20.0)  # the rate doubled 20 s ago
            t += every_s
        return s

    for every in (0.25, 1.0, 4.0):
        cells = series(every).cells(24)
        assert len(cells) == 24, every
        assert cells[-20:] == [20.0] * 20 and set(cells[:3]) == {10.0}, (every, cells)
    # a young series is right-aligned by spark(): only the cells since its first point
    young = Series(600.0, 3600)
    for k in range(5):
        young.add(float(k), float(k))
    assert young.cells(24) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_sparkline_leaves_blank_what_no_reading_covered():
    """A figure holds through the cells until the next reading, as long as the slowest poll (10 s); an engine
    that did not answer for longer is a gap, never drawn as steady."""
    from tui.live.series import Series
    from widgets.fmt import spark

    s = Series(600.0, 3600)
    for t in (0.0, 1.0, 2.0, 20.0, 21.0):  # no reading from 2 s to 20 s
        s.add(1000.0 + t, 5.0)
    cells = s.cells(22)  # 3 cells read, 10 held, 7 blank, 2 read
    assert cells == [5.0] * 13 + [None] * 7 + [5.0] * 2
    assert spark(cells, 22) == "█" * 13 + " " * 7 + "█" * 2
    # the point before the span holds into it only while it is recent enough
    old = Series(600.0, 3600)
    for t in (0.0, 30.0):
        old.add(t, 3.0)
    assert old.cells(5) == [None] * 4 + [3.0]
    old.add(33.0, 3.0)
    assert old.cells(5) == [None] + [3.0] * 4  # the cell before 30 s is 29 s after 0 s: blank
