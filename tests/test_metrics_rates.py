"""derive() and histogram_quantile() on known data, real engine counters, and the real llama-server."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from tui.findings.facts import spec_between
from tui.live.store import Store
from tui.model.samples import EngineReading, EngineSample, EngineStats
from tui.sources.metrics import parse_reading
from tui.sources.rates import MIN_BUSY_S, MIN_BUSY_TOKENS, MIN_WINDOW_S, derive, histogram_quantile, went_back

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
    dialect="llamacpp", running=1, waiting=0, prompt_tokens_processed_total=1200,
    prompt_tokens_computed_total=1000, prompt_tokens_cached_total=200, generation_tokens_total=500,
    generation_seconds_total=10.0, prefix_cache_queries_total=1200, prefix_cache_hits_total=200,
    spec_drafts_total=0, spec_draft_tokens_total=0, spec_accepted_tokens_total=0,
)


def test_llamacpp_rates() -> None:
    cur = replace(LLAMA_PREV, prompt_tokens_processed_total=1600, prompt_tokens_computed_total=1300,
                  prompt_tokens_cached_total=300, generation_tokens_total=620, generation_seconds_total=12.0,
                  prefix_cache_queries_total=1600, prefix_cache_hits_total=300)
    stats = derive(LLAMA_PREV, 100.0, cur, 102.0)
    assert stats.prompt_processed_tps == pytest.approx(200.0)  # 400 prompt tokens, 100 of them cached
    assert stats.prompt_computed_tps == pytest.approx(150.0)  # the 300 prefilled
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
    cur = replace(LLAMA_PREV, generation_tokens_total=20, prompt_tokens_processed_total=5000,
                  generation_seconds_total=0.5)
    stats = derive(LLAMA_PREV, 0.0, cur, 1.0)
    assert stats == EngineStats(counter_reset=True)


def test_reset_is_not_sticky() -> None:
    restarted = replace(LLAMA_PREV, generation_tokens_total=20, generation_seconds_total=0.5)
    later = replace(restarted, generation_tokens_total=80, generation_seconds_total=1.5)
    stats = derive(restarted, 1.0, later, 2.0)
    assert stats.counter_reset is False
    assert stats.gen_tps == pytest.approx(60.0)
    assert went_back(LLAMA_PREV, restarted) and not went_back(restarted, later)


def test_dialect_change_counts_as_reset() -> None:
    assert derive(LLAMA_PREV, 0.0, EngineReading(dialect="vllm"), 1.0).counter_reset is True


def test_non_positive_dt_gives_empty_stats() -> None:
    assert derive(LLAMA_PREV, 5.0, LLAMA_PREV, 5.0) == EngineStats()


def test_missing_counters_stay_none() -> None:
    prev = EngineReading(dialect="vllm", generation_tokens_total=10)
    cur = EngineReading(dialect="vllm", generation_tokens_total=30)
    stats = derive(prev, 0.0, cur, 2.0)
    assert stats.gen_tps == pytest.approx(10.0)
    assert stats.prompt_processed_tps is None
    assert stats.prompt_computed_tps is None
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


def test_a_draft_positions_count_going_back_is_a_restart_and_every_figure_per_position_is_one() -> None:
    prev = EngineReading(dialect="vllm", generation_tokens_total=900, spec_drafts_total=100,
                         spec_draft_tokens_total=300, spec_accepted_tokens_total=150,
                         spec_accepted_per_pos=(90.0, 50.0, 10.0))
    # the other counters are higher (the new run is busier), one position's count went back: a restart
    restarted = replace(prev, generation_tokens_total=1000, spec_drafts_total=120,
                        spec_draft_tokens_total=360, spec_accepted_tokens_total=160,
                        spec_accepted_per_pos=(95.0, 45.0, 20.0))
    assert went_back(prev, restarted)
    assert derive(prev, 0.0, restarted, 1.0).counter_reset is True
    store = Store()
    store.add_engine_sample(EngineSample("v", "u", 0.0, 0.0, "up", reading=prev))
    state = store.add_engine_sample(EngineSample("v", "u", 1.0, 1.0, "up", reading=restarted))
    assert state.reset_t == 1.0 and [t for t, _ in state.readings] == [1.0]
    # a window in which nothing went back: per position, the window's accepted tokens over its drafts, and
    # since the start the totals over all drafts: the dashboard's, snapshot's and the exporter's figures
    cur = replace(prev, generation_tokens_total=1000, spec_drafts_total=200, spec_draft_tokens_total=600,
                  spec_accepted_tokens_total=290, spec_accepted_per_pos=(180.0, 90.0, 20.0))
    stats = derive(prev, 0.0, cur, 1.0)
    assert stats.spec_accept_per_pos == pytest.approx((0.9, 0.4, 0.1))
    assert stats.spec_accept_per_pos_total == pytest.approx((0.9, 0.45, 0.1))
    assert stats.spec_accept_per_pos == spec_between(prev, cur).position_rates  # type: ignore[union-attr]


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
    prev = EngineReading(dialect="sglang", prompt_tokens_processed_total=100, prefix_cache_queries_total=100,
                         prefix_cache_hits_total=None, spec_drafts_total=10, cache_hit_rate_gauge=0.9,
                         spec_accept_rate_gauge=0.5, spec_accept_length_gauge=2.5)
    cur = replace(prev, prompt_tokens_processed_total=200, prefix_cache_queries_total=200,
                  spec_drafts_total=20, cache_hit_rate_gauge=0.4, spec_accept_rate_gauge=0.7,
                  spec_accept_length_gauge=3.1)
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



# --- real llama.cpp counters: a rate from too little is "–" (None), never a figure that cannot be ----------

DATA = Path(__file__).parent / "data" / "metrics"
SEQUENCE = json.loads((DATA / "llamacpp_readiness_sequence.json").read_text())
READY, ONE, SIXTY_FOUR = (parse_reading(SEQUENCE["bodies"][k])
                          for k in ("after_readiness", "after_1_token", "after_64_tokens"))
# The same llama-server before its first request: every counter at zero.
FRESH = replace(READY, prompt_tokens_processed_total=0, prompt_tokens_computed_total=0,
                prompt_tokens_cached_total=0, generation_tokens_total=0, generation_seconds_total=0,
                prefix_cache_queries_total=0, prefix_cache_hits_total=0)


def test_one_token_over_a_microsecond_gives_no_decode_rate() -> None:
    # The readiness check's 1-token completion, then another: 1 token over 1e-6 s of decode time each,
    # which read "decode busy 1000000.0 tok/s" before the minimums.
    for prev, cur in ((FRESH, READY), (READY, ONE)):
        assert cur.generation_tokens_total - prev.generation_tokens_total == 1
        assert cur.generation_seconds_total - prev.generation_seconds_total == pytest.approx(1e-6)
        assert derive(prev, 0.0, cur, 1.0).decode_tps_busy is None


def test_64_tokens_give_the_servers_own_decode_rate() -> None:
    timings = SEQUENCE["replies"]["64_tokens"]["timings"]
    stats = derive(ONE, 0.0, SIXTY_FOUR, 30.0)
    # tokens per second of decode time, as the server timed them (its counter prints 6 digits)
    server_timed = timings["predicted_n"] / timings["predicted_ms"] * 1000
    assert stats.decode_tps_busy == pytest.approx(server_timed, rel=1e-5)
    # the server's own figure times the n-1 gaps between n tokens: 64/63 of it
    assert stats.decode_tps_busy == pytest.approx(timings["predicted_per_second"] * 64 / 63, rel=1e-5)


@pytest.mark.parametrize(
    ("tokens", "seconds", "shown"),
    [(MIN_BUSY_TOKENS - 1, 1.0, False), (MIN_BUSY_TOKENS, 1.0, True), (1000, MIN_BUSY_S / 2, False),
     (1000, MIN_BUSY_S, True)],
)
def test_decode_busy_needs_enough_tokens_and_time(tokens: int, seconds: float, shown: bool) -> None:
    prev = replace(LLAMA_PREV, generation_seconds_total=0.0)
    cur = replace(prev, generation_tokens_total=prev.generation_tokens_total + tokens,
                  generation_seconds_total=seconds)
    busy = derive(prev, 0.0, cur, 10.0).decode_tps_busy
    assert busy == (pytest.approx(tokens / seconds) if shown else None)


def test_windowed_rates_need_a_long_enough_window() -> None:
    short = derive(ONE, 0.0, SIXTY_FOUR, MIN_WINDOW_S * 0.9)
    assert short.gen_tps is None and short.prompt_processed_tps is None and short.prompt_computed_tps is None
    assert short.decode_tps_busy is not None  # busy time is the engine's own, not the poll window
    enough = derive(ONE, 0.0, SIXTY_FOUR, MIN_WINDOW_S)
    assert enough.gen_tps == pytest.approx(64 / MIN_WINDOW_S)


def test_prompt_processed_and_computed_from_real_llamacpp_counters() -> None:
    reply = SEQUENCE["replies"]["64_tokens"]
    stats = derive(ONE, 0.0, SIXTY_FOUR, 2.0)
    # processed = the whole prompt (usage.prompt_tokens, its cached token included); computed = prompt_n
    assert stats.prompt_processed_tps * 2.0 == pytest.approx(reply["usage"]["prompt_tokens"])
    assert stats.prompt_computed_tps * 2.0 == pytest.approx(reply["timings"]["prompt_n"])
    assert reply["timings"]["cache_n"] > 0


def test_prompt_processed_and_computed_from_the_real_vllm_body() -> None:
    facts = json.loads((DATA / "vllm_cpu_0.32_real.json").read_text())
    real = parse_reading((DATA / "vllm_cpu_0.32_real.txt").read_text())
    fresh = replace(real, prompt_tokens_processed_total=0, prompt_tokens_computed_total=0,
                    prompt_tokens_cached_total=0, generation_tokens_total=0, prefix_cache_queries_total=0,
                    prefix_cache_hits_total=0, requests_finished_total=0, ttft_buckets=None, itl_buckets=None)
    stats = derive(fresh, 0.0, real, 10.0)
    assert stats.prompt_processed_tps == pytest.approx(facts["prompt_tokens"] / 10)  # 1155: all clients sent
    assert stats.prompt_computed_tps == pytest.approx(643 / 10)  # by_source{local_compute}
    # without the exact counter (older vLLM), processed - cached gives the same figure
    older = derive(replace(fresh, prompt_tokens_computed_total=None), 0.0,
                   replace(real, prompt_tokens_computed_total=None), 10.0)
    assert older.prompt_computed_tps == pytest.approx(643 / 10)


def test_computed_is_none_when_cached_outruns_processed() -> None:
    # Two counters scraped between their two updates (SGLang adds prompt, then cached): no figure.
    prev = EngineReading(dialect="sglang", prompt_tokens_processed_total=100, prompt_tokens_cached_total=10)
    cur = replace(prev, prompt_tokens_processed_total=110, prompt_tokens_cached_total=30)
    stats = derive(prev, 0.0, cur, 1.0)
    assert stats.prompt_processed_tps == pytest.approx(10.0)
    assert stats.prompt_computed_tps is None


# --- the real llama-server -----------------------------------------------------------------------------

def scrape(client: httpx.Client) -> tuple[EngineReading, float]:
    reply = client.get("/metrics")
    reply.raise_for_status()
    return parse_reading(reply.text), time.monotonic()


def settled(client: httpx.Client, before: EngineReading, before_t: float,
            tokens: int) -> tuple[EngineReading, float]:
    """llama.cpp adds the generation counters when the slot is released, just after the reply is sent."""
    deadline = time.monotonic() + 10
    while True:
        time.sleep(max(0.05, before_t + MIN_WINDOW_S - time.monotonic()))
        reading, t = scrape(client)
        if reading.generation_tokens_total - before.generation_tokens_total >= tokens or t > deadline:
            return reading, t


def chat(client: httpx.Client, content: str, max_tokens: int) -> dict:
    reply = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0})
    reply.raise_for_status()
    return reply.json()


@pytest.mark.engine
def test_real_server_one_token_gives_no_decode_rate_and_64_the_true_one(llama_server) -> None:
    with httpx.Client(base_url=llama_server.url, timeout=180) as client:
        before, t0 = scrape(client)
        chat(client, f"Say hi. {uuid4()}", 1)
        one, t1 = settled(client, before, t0, 1)
        assert one.generation_tokens_total - before.generation_tokens_total == 1
        # one token's busy time is ~1e-6 s: /metrics prints 6 significant digits, so on a server that has
        # run a while it may not move at all (the fresh-server bodies in the data file show 1e-06 s)
        assert one.generation_seconds_total >= before.generation_seconds_total
        assert derive(before, t0, one, t1).decode_tps_busy is None

        reply = chat(client, f"Tell me a long story. {uuid4()}", 64)
        after, t2 = settled(client, one, t1, 64)
    timings = reply["timings"]
    assert timings["predicted_n"] == 64 == after.generation_tokens_total - one.generation_tokens_total
    seconds = after.generation_seconds_total - one.generation_seconds_total
    printed = 10 ** (math.floor(math.log10(after.generation_seconds_total)) - 5)  # /metrics prints 6 digits
    assert abs(seconds - timings["predicted_ms"] / 1000) <= printed
    stats = derive(one, t1, after, t2)
    assert stats.decode_tps_busy == pytest.approx(64 / seconds)
    assert stats.decode_tps_busy == pytest.approx(timings["predicted_per_second"], rel=0.05)  # n vs n-1 gaps


@pytest.mark.engine
def test_real_server_processed_and_computed_prompt_tokens_match_its_usage(llama_server) -> None:
    prompt = f"{uuid4()} Describe the water cycle, the seasons and the tides in three short paragraphs."
    seen = []
    with httpx.Client(base_url=llama_server.url, timeout=180) as client:
        for _ in range(2):  # the same prompt twice: the second is served mostly from the prompt cache
            before, t0 = scrape(client)
            reply = chat(client, prompt, 4)
            after, t1 = settled(client, before, t0, 4)
            seen.append((before, t0, after, t1, reply))
    for before, t0, after, t1, reply in seen:
        usage, timings = reply["usage"], reply["timings"]
        assert usage["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
        moved = {k: getattr(after, f"prompt_tokens_{k}_total") - getattr(before, f"prompt_tokens_{k}_total")
                 for k in ("processed", "computed", "cached")}
        assert moved == {"processed": usage["prompt_tokens"], "computed": timings["prompt_n"],
                         "cached": timings["cache_n"]}
        stats = derive(before, t0, after, t1)
        assert stats.prompt_processed_tps * (t1 - t0) == pytest.approx(usage["prompt_tokens"])
        assert stats.prompt_computed_tps * (t1 - t0) == pytest.approx(timings["prompt_n"])
    first, second = (reply["timings"] for *_, reply in seen)
    assert second["cache_n"] > first["cache_n"] and second["prompt_n"] < first["prompt_n"]
