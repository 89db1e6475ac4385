"""derive() and histogram_quantile() on known data."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tui.sources.rates import derive, histogram_quantile
from tui.sources.samples import EngineReading, EngineStats

INF = math.inf

# promql/testdata/histograms.test in Prometheus: testhistogram{start="positive"} at 50m is
# 5, 7, 11, 12 in buckets 0.1, 0.2, 1, +Inf; {start="negative"} is 1, 2, 2, 3 in -0.2, -0.1, 0.3, +Inf.
POSITIVE = ((0.1, 50.0), (0.2, 70.0), (1.0, 110.0), (INF, 120.0))
NEGATIVE = ((-0.2, 10.0), (-0.1, 20.0), (0.3, 20.0), (INF, 30.0))


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, POSITIVE, 0.15),
        (0.3, POSITIVE, 0.072),
        (0.8, POSITIVE, 0.72),
        (1.0, POSITIVE, 1.0),  # rank in the +Inf bucket: highest finite bound
        (0.5, NEGATIVE, -0.15),
        (0.3, NEGATIVE, -0.2),  # first bucket with a non-positive bound: its bound
        (0.0, ((0.1, 0.0), (0.5, 4.0), (INF, 4.0)), 0.1),  # lower edge of the first non-empty bucket
    ],
)
def test_histogram_quantile_matches_prometheus(q: float, buckets, expected: float) -> None:
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_hand_computed() -> None:
    buckets = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 40.0))
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)  # rank 20: 0.1 + 0.4 * 10/20
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.8)  # rank 36: 0.5 + 0.5 * 6/10
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: 0 + 0.1 * 10/10


@pytest.mark.parametrize(
    "buckets",
    [
        (),
        ((INF, 5.0),),  # one bucket
        ((0.1, 0.0), (INF, 0.0)),  # no observations
        ((0.1, 2.0), (0.5, 4.0)),  # no +Inf bucket
    ],
)
def test_histogram_quantile_none_where_prometheus_gives_nan(buckets) -> None:
    assert histogram_quantile(0.5, buckets) is None


def test_histogram_quantile_forces_monotonic_counts() -> None:
    assert histogram_quantile(0.5, ((0.1, 5.0), (0.5, 4.0), (INF, 10.0))) == pytest.approx(0.1)


def test_histogram_quantile_rejects_bad_q() -> None:
    with pytest.raises(ValueError, match="within"):
        histogram_quantile(1.5, POSITIVE)


LLAMA_PREV = EngineReading(
    dialect="llamacpp", running=1, waiting=0, prompt_tokens_total=1000, generation_tokens_total=500,
    prompt_seconds_total=2.0, generation_seconds_total=10.0, prefix_cache_queries_total=1200,
    prefix_cache_hits_total=200, spec_drafts_total=0, spec_draft_tokens_total=0, spec_accepted_tokens_total=0,
)


def test_llamacpp_rates() -> None:
    cur = replace(LLAMA_PREV, prompt_tokens_total=1300, generation_tokens_total=620, prompt_seconds_total=2.5,
                  generation_seconds_total=12.0, prefix_cache_queries_total=1600, prefix_cache_hits_total=300)
    stats = derive(LLAMA_PREV, 100.0, cur, 102.0)
    assert stats.prompt_tps == pytest.approx(150.0)
    assert stats.gen_tps == pytest.approx(60.0)
    assert stats.decode_tps_busy == pytest.approx(60.0)  # 120 tokens in 2.0 s of decode time
    assert stats.prefix_cache_hit_rate == pytest.approx(0.25)  # 100 of 400 looked-up tokens
    assert stats.spec_accept_rate is None  # no drafts in the window (llama.cpp exposes zeros without spec)
    assert stats.spec_accept_length is None
    assert stats.ttft_p50_s is None and stats.itl_p90_s is None  # llama.cpp has no histograms
    assert stats.counter_reset is False


def test_idle_window() -> None:
    stats = derive(LLAMA_PREV, 0.0, LLAMA_PREV, 1.0)
    assert stats.gen_tps == 0.0
    assert stats.decode_tps_busy is None  # no decode time in the window
    assert stats.prefix_cache_hit_rate is None  # nothing looked up: no rate, not 0%


def test_counter_reset_voids_the_whole_window() -> None:
    # Engine restarted: generation went back, while prompt tokens of the new run already exceed the old.
    cur = replace(LLAMA_PREV, generation_tokens_total=20, prompt_tokens_total=5000,
                  generation_seconds_total=0.5)
    stats = derive(LLAMA_PREV, 0.0, cur, 1.0)
    assert stats == EngineStats(counter_reset=True)


def test_reset_is_not_sticky() -> None:
    restarted = replace(LLAMA_PREV, generation_tokens_total=20, generation_seconds_total=0.5)
    later = replace(restarted, generation_tokens_total=80, generation_seconds_total=1.5)
    stats = derive(restarted, 1.0, later, 2.0)
    assert stats.counter_reset is False
    assert stats.gen_tps == pytest.approx(60.0)


def test_dialect_change_counts_as_reset() -> None:
    assert derive(LLAMA_PREV, 0.0, EngineReading(dialect="vllm"), 1.0).counter_reset is True


def test_non_positive_dt_gives_empty_stats() -> None:
    assert derive(LLAMA_PREV, 5.0, LLAMA_PREV, 5.0) == EngineStats()


def test_missing_counters_stay_none() -> None:
    prev = EngineReading(dialect="vllm", generation_tokens_total=10)
    cur = EngineReading(dialect="vllm", generation_tokens_total=30)
    stats = derive(prev, 0.0, cur, 2.0)
    assert stats.gen_tps == pytest.approx(10.0)
    assert stats.prompt_tps is None
    assert stats.decode_tps_busy is None


TTFT_BOUNDS = (0.1, 0.5, 1.0, INF)


def hist(*counts: float) -> tuple[tuple[float, float], ...]:
    return tuple(zip(TTFT_BOUNDS, counts, strict=True))


def test_vllm_quantiles_come_from_bucket_deltas_and_spec_from_counters() -> None:
    # Before the window: 1000 fast requests. In the window: 10 requests, all between 0.5 and 1 s.
    prev = EngineReading(dialect="vllm", ttft_buckets=hist(1000, 1000, 1000, 1000),
                         itl_buckets=hist(0, 0, 0, 0), spec_drafts_total=100, spec_draft_tokens_total=300,
                         spec_accepted_tokens_total=150, prefix_cache_queries_total=0,
                         prefix_cache_hits_total=0)
    cur = replace(prev, ttft_buckets=hist(1000, 1000, 1010, 1010), spec_drafts_total=200,
                  spec_draft_tokens_total=600, spec_accepted_tokens_total=330)
    stats = derive(prev, 0.0, cur, 1.0)
    assert stats.ttft_p50_s == pytest.approx(0.75)
    assert stats.ttft_p90_s == pytest.approx(0.95)
    assert stats.itl_p50_s is None  # no observations in the window
    assert stats.spec_accept_rate == pytest.approx(0.6)  # 180 of 300 draft tokens
    assert stats.spec_accept_length == pytest.approx(2.8)  # 1 + 180 / 100 drafts
    assert stats.prefix_cache_hit_rate is None


def test_histogram_going_backwards_is_a_reset() -> None:
    prev = EngineReading(dialect="vllm", ttft_buckets=hist(5, 6, 7, 7))
    cur = EngineReading(dialect="vllm", ttft_buckets=hist(1, 1, 1, 1))
    assert derive(prev, 0.0, cur, 1.0).counter_reset is True


def test_changed_bucket_layout_gives_no_quantile_and_no_reset() -> None:
    prev = EngineReading(dialect="vllm", ttft_buckets=((0.2, 1.0), (INF, 2.0)))
    cur = EngineReading(dialect="vllm", ttft_buckets=hist(1, 2, 3, 4))
    stats = derive(prev, 0.0, cur, 1.0)
    assert stats.ttft_p50_s is None
    assert stats.counter_reset is False


def test_sglang_falls_back_to_its_gauges_only_without_counters() -> None:
    prev = EngineReading(dialect="sglang", prompt_tokens_total=100, prefix_cache_queries_total=100,
                         prefix_cache_hits_total=None, spec_drafts_total=10, cache_hit_rate_gauge=0.9,
                         spec_accept_rate_gauge=0.5, spec_accept_length_gauge=2.5)
    cur = replace(prev, prompt_tokens_total=200, prefix_cache_queries_total=200, spec_drafts_total=20,
                  cache_hit_rate_gauge=0.4, spec_accept_rate_gauge=0.7, spec_accept_length_gauge=3.1)
    stats = derive(prev, 0.0, cur, 1.0)
    assert stats.prefix_cache_hit_rate == 0.4  # the current gauge, since hits are not exposed
    assert stats.spec_accept_rate == 0.7
    assert stats.spec_accept_length == 3.1  # drafts alone cannot give a length: gauge

    with_counter = replace(cur, prefix_cache_hits_total=50)
    stats = derive(replace(prev, prefix_cache_hits_total=10), 0.0, with_counter, 1.0)
    assert stats.prefix_cache_hit_rate == pytest.approx(0.4)  # 40 of 100 from the counters

    before = replace(prev, prefix_cache_hits_total=10)
    idle = derive(before, 0.0, before, 1.0)
    assert idle.prefix_cache_hit_rate is None  # counters exist and nothing was looked up: no rate
