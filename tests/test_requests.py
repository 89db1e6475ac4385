"""RequestStats from readings (the engine's per-request histograms and counters over a window) and the
findings that rest on them: requests the context cut, and preemptions with the KV pool full."""

from __future__ import annotations

import dataclasses
import math

from tui.findings.judge import judge
from tui.model.config import EngineConfig
from tui.model.findings import Evidence
from tui.model.samples import EngineReading
from tui.sources.requests import request_stats

INF = math.inf


def reading(ended: float, e2e: tuple[float, float, float], finish: tuple[tuple[str, float], ...], *,
            running: float = 1.0, preempted: float = 0.0, kv: float = 0.5, gen: float = 0.0,
            prompt_len: tuple[float, float] = (0.0, 0.0), gen_len: tuple[float, float] = (0.0, 0.0)
            ) -> EngineReading:
    """e2e: the cumulative counts at le=0.5, le=1.0, +Inf; *_len: (count at le=1000 and +Inf, sum)."""
    return EngineReading(
        dialect="vllm", running=running, kv_cache_usage=kv, generation_tokens_total=gen,
        requests_finished_total=ended, e2e_buckets=((0.5, e2e[0]), (1.0, e2e[1]), (INF, e2e[2])),
        finish_reasons=finish, preemptions_total=preempted,
        prompt_len_buckets=((1000.0, prompt_len[0]), (INF, prompt_len[0])), prompt_len_sum=prompt_len[1],
        gen_len_buckets=((1000.0, gen_len[0]), (INF, gen_len[0])), gen_len_sum=gen_len[1])


def test_a_window_of_requests_as_the_engine_counted_them() -> None:
    before = reading(10, (5, 8, 10), (("length", 4.0), ("stop", 6.0)), running=0, gen=100)
    busy = reading(14, (6, 10, 14), (("length", 4.0), ("stop", 10.0)), running=2, gen=300)
    after = reading(20, (8, 14, 20), (("abort", 1.0), ("length", 6.0), ("stop", 13.0)), running=0, gen=500)
    stats = request_stats([(0.0, before), (5.0, busy), (10.0, after)])
    assert stats is not None and stats.ended == 10 and stats.requests_per_s == 1.0
    assert dict(stats.finish_window) == {"abort": 1.0, "length": 2.0, "stop": 7.0}
    assert stats.finish_total == (("abort", 1.0), ("length", 6.0), ("stop", 13.0))
    p50, p90, p99 = stats.e2e_s
    # 3 in (0, .5], 3 in (.5, 1], 4 above: rank 5 lies 2/3 into (.5, 1]; past 1.0, Prometheus answers 1.0
    assert math.isclose(p50, 0.5 + 0.5 * 2 / 3) and p90 == p99 == 1.0
    assert stats.busy_share == 0.5 and stats.gen_tps_serving == 400 / (10 * 0.5)


def test_a_restart_inside_the_window_gives_no_figures_that_cannot_be() -> None:
    before = reading(50, (20, 40, 50), (("stop", 50.0),))
    after = reading(3, (1, 2, 3), (("stop", 3.0),))  # the counters went back: a restart
    stats = request_stats([(0.0, before), (10.0, after)])
    assert stats is not None and stats.ended is None and stats.e2e_s is None and stats.finish_window == ()


def test_the_context_cutting_requests_short_is_said_with_the_engines_evidence() -> None:
    config = EngineConfig(engine="vLLM", read_wall=0.0, context_tokens=2048, kv_pool_tokens=55356)
    before = reading(0, (0, 0, 0), (), prompt_len=(0, 0), gen_len=(0, 0))
    after = reading(6, (0, 0, 6), (("length", 5.0), ("stop", 1.0)), prompt_len=(6, 6 * 1500),
                    gen_len=(6, 6 * 500))
    stats = request_stats([(0.0, before), (60.0, after)])
    [finding] = [f for f in judge(Evidence("v", config, requests=stats)) if f.id == "length-cap"]
    assert finding.title.startswith("5 of 6 requests ended at the length cap with prompt + output averaging "
                                    "2,000 of the 2,048-token context")
    assert "--max-model-len" in finding.suggestion
    # the same requests, well inside the context: the clients' own max_tokens ended them
    short = reading(6, (0, 0, 6), (("length", 5.0), ("stop", 1.0)), prompt_len=(6, 6 * 100),
                    gen_len=(6, 6 * 64))
    stats = request_stats([(0.0, before), (60.0, short)])
    assert not [f for f in judge(Evidence("v", config, requests=stats)) if f.id == "length-cap"]


def test_preemptions_with_the_pool_full_are_a_finding_and_without_it_are_not() -> None:
    config = EngineConfig(engine="vLLM", read_wall=0.0, context_tokens=2048, kv_pool_tokens=55356)
    before = reading(0, (0, 0, 0), (), kv=0.5)
    full = reading(3, (0, 0, 3), (("stop", 3.0),), kv=0.97, preempted=4)
    stats = request_stats([(0.0, before), (60.0, full)])
    [finding] = [f for f in judge(Evidence("v", config, requests=stats)) if f.id == "preemptions"]
    assert finding.title == ("4 preemptions in the last 60 s with the KV pool of 55,356 tokens 97% full: "
                             "preempted requests compute their prompt again")
    roomy = reading(3, (0, 0, 3), (("stop", 3.0),), kv=0.6, preempted=4)
    stats = request_stats([(0.0, before), (60.0, roomy)])
    assert not [f for f in judge(Evidence("v", config, requests=stats)) if f.id == "preemptions"]


def test_the_exporter_serves_the_requests_while_known_and_removes_them_after() -> None:
    from prometheus_client import generate_latest

    from tui.exporter.metrics import ProbeMetrics
    from tui.model.samples import EngineStats

    before = reading(10, (5, 8, 10), (("stop", 10.0),), running=0)
    after = reading(20, (8, 14, 20), (("length", 4.0), ("stop", 16.0)), running=1, preempted=2)
    stats = request_stats([(0.0, before), (10.0, after)])
    metrics = ProbeMetrics(process=False)
    metrics.engine("v", (), EngineStats(requests=stats))
    text = generate_latest(metrics.shared).decode()
    assert 'enginetop_request_seconds{engine="v",phase="e2e",quantile="0.5"}' in text
    assert 'enginetop_requests_ended{engine="v",reason="length"} 4.0' in text
    assert 'enginetop_request_rate{engine="v",what="preemptions"} 0.2' in text
    assert 'enginetop_busy_share{engine="v"} 1.0' in text
    metrics.engine("v", (), EngineStats())  # idle, restarted or gone: nothing of it is served
    assert 'engine="v"' not in generate_latest(metrics.shared).decode()


def test_on_the_proxys_figures_only_requests_cut_before_their_max_tokens_count() -> None:
    """llama.cpp says "length" for a client's own max_tokens and for the context alike: through the proxy,
    the finding counts only those that ended before what their client asked (length_unasked)."""
    from tui.model.samples import RequestStats

    config = EngineConfig(engine="llama.cpp", read_wall=0.0, context_tokens=2048, kv_pool_tokens=8192)
    asked = RequestStats(window_s=60.0, ended=6.0, prompt_len=(1500.0, 1500.0, 1500.0),
                         gen_len=(500.0, 500.0, 500.0), finish_window=(("length", 5.0), ("stop", 1.0)),
                         origin="proxy", length_unasked=0.0)
    assert not [f for f in judge(Evidence("l", config, requests=asked)) if f.id == "length-cap"]
    cut = dataclasses.replace(asked, length_unasked=5.0)
    [finding] = [f for f in judge(Evidence("l", config, requests=cut)) if f.id == "length-cap"]
    assert finding.title.startswith("5 of 6 requests ended at the length cap")
    assert "5 of them before the max_tokens their clients asked" in finding.evidence[0]
    assert "relayed by enginetop's proxy" in finding.evidence[1]
