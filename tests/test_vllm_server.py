"""enginetop against the real vLLM (CPU build, tiny random-weight model): the raw API, /metrics as parsed by
tui.sources, rates and quantiles from real histogram deltas, and probes. A missing install fails.

The tiny model makes every engine step take a few ms; what is compared here is counts (exact) and
latencies within what the histogram buckets can resolve (see the quantile test).
"""

from __future__ import annotations

import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import until
from tui.base.stats import median
from tui.engines import models
from tui.model.samples import EngineReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.probe.client import ProbeClient
from tui.probe.results import CHUNK_ESTIMATE_NOTE
from tui.sources.engine import poll_engine
from tui.sources.engine_source import EngineSource
from tui.sources.metrics import names_query, parse_reading
from tui.sources.rates import derive

MODEL = models.TINY_NAME


def chat_body(content: str, max_tokens: int, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, **extra}


def stream_events(url: str, body: dict) -> list[dict | str]:
    """The decoded `data:` events of one streamed chat completion ("[DONE]" kept as a string)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events: list[dict | str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()[:300]
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def reading(url: str) -> EngineReading:
    return parse_reading(httpx.get(f"{url}/metrics", timeout=60).text)


def wait_finished(url: str, before: EngineReading, n: int, timeout: float = 15.0) -> EngineReading:
    """The first reading that counts `n` more finished requests than `before`.

    Token counters and the finished-request counter are recorded from the same engine iteration stats,
    so once the requests count as finished, their tokens are in the counters too.
    """
    deadline = time.monotonic() + timeout
    while True:
        cur = reading(url)
        assert before.requests_finished_total is not None and cur.requests_finished_total is not None
        if cur.requests_finished_total - before.requests_finished_total >= n or time.monotonic() > deadline:
            return cur
        time.sleep(0.1)


def test_health_version_and_model(vllm_server) -> None:
    health = httpx.get(f"{vllm_server.url}/health", timeout=5)
    assert health.status_code == 200 and health.text == ""
    assert httpx.get(f"{vllm_server.url}/version", timeout=5).json() == {"version": "0.32.0"}
    models_reply = httpx.get(f"{vllm_server.url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models_reply["data"]] == [MODEL]
    assert models_reply["data"][0]["max_model_len"] == 2048


def test_stream_starts_with_role_only_chunk_and_ends_with_usage_chunk(vllm_server) -> None:
    events = stream_events(vllm_server.url, chat_body("Say something.", 48))
    assert events[-1] == "[DONE]"
    first, usage_chunk = events[0], events[-2]
    assert isinstance(first, dict) and isinstance(usage_chunk, dict)
    delta = first["choices"][0]["delta"]
    assert delta["role"] == "assistant" and not delta.get("content")  # role only, no text yet
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 48  # ignore_eos holds the length
    assert usage["total_tokens"] == usage["prompt_tokens"] + 48
    middle = [e for e in events[1:-2] if isinstance(e, dict)]
    texts = [c["choices"][0]["delta"].get("content") for c in middle if c["choices"]]
    # Partial UTF-8 can leave a token's chunk without text, never the other way round.
    assert 0 < sum(1 for t in texts if t) <= 48
    assert [c["choices"][0]["finish_reason"] for c in middle if c["choices"]][-1] == "length"


def test_metrics_body_is_labelled_per_engine_and_model(vllm_server) -> None:
    text = httpx.get(f"{vllm_server.url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    engine_families = [f for name, f in families.items() if name.startswith("vllm:")]
    assert len(engine_families) >= 30
    # Two exceptions, as in the source: the frontend's admission counter has no engine index, and the
    # cache-config info gauge carries the engine and its config but no model name.
    no_engine = {s.name for f in engine_families for s in f.samples if "engine" not in s.labels}
    no_model = {s.name for f in engine_families for s in f.samples if s.labels.get("model_name") != MODEL}
    assert no_engine == {"vllm:admission_rejections_total", "vllm:admission_rejections_created"}
    assert no_model == {"vllm:cache_config_info"}
    assert {s.labels["engine"] for f in engine_families for s in f.samples if "engine" in s.labels} == {"0"}
    # prometheus_client's `_created` gauge families sit beside the counters and histograms.
    assert "vllm:generation_tokens_created" in families
    assert families["vllm:generation_tokens_created"].type == "gauge"
    assert any(name.startswith("http_") for name in families)
    assert "process_resident_memory_bytes" in families and "python_info" in families


def test_generation_and_prompt_counters_move_by_the_reported_usage(vllm_server) -> None:
    url = vllm_server.url
    before = reading(url)
    usages = [httpx.post(f"{url}/v1/chat/completions", json=chat_body("Count to ten.", 37), timeout=60)
              .json()["usage"]]
    events = stream_events(url, chat_body("Name a colour.", 21))
    usages.append(events[-2]["usage"])  # type: ignore[index]
    after = wait_finished(url, before, 2)
    assert after.requests_finished_total - before.requests_finished_total == 2
    assert after.generation_tokens_total - before.generation_tokens_total == 37 + 21
    assert [u["completion_tokens"] for u in usages] == [37, 21]
    # vLLM's prompt counter counts the whole prompt, cached tokens included.
    processed = after.prompt_tokens_processed_total - before.prompt_tokens_processed_total
    assert processed == sum(u["prompt_tokens"] for u in usages)


def test_running_and_waiting_are_exposed_and_idle_reads_zero(vllm_server) -> None:
    # "running rises under concurrent requests" is checked on the Gemma vLLM in test_demo_both.py: with
    # this tiny model an engine step (~2 ms) outruns vLLM's frontend, which then answers /metrics only
    # after a burst is over (seen on this two-core machine), so a watcher here sees nothing mid-burst.
    idle = reading(vllm_server.url)
    assert (idle.running, idle.waiting) == (0, 0)


async def test_poll_engine_reads_vllm(vllm_server) -> None:
    async with httpx.AsyncHTTPTransport() as transport:
        sample = await poll_engine(transport, EngineTarget("vllm", vllm_server.url), launched_by_us=True)
    assert sample.health == "up" and sample.health_reason is None
    assert sample.model == MODEL and sample.metrics_error is None
    assert sample.reading is not None and sample.reading.dialect == "vllm"
    r = sample.reading
    assert r.kv_cache_usage is not None and 0 <= r.kv_cache_usage <= 1
    assert r.ttft_buckets is not None and r.ttft_buckets[-1][0] == float("inf")
    assert r.prefix_cache_queries_total is not None and r.prefix_cache_hits_total is not None


async def test_the_poller_asks_vllm_for_the_series_it_reads_alone(vllm_server) -> None:
    # vLLM's /metrics/ is prometheus_client's own exposition, which honours name[]; /metrics is not.
    url = vllm_server.url

    def around() -> tuple[str, str] | None:
        """The whole body and the filtered one, when the engine's figures did not move in between (a
        request of an earlier test ending would move its counters)."""
        full = httpx.get(f"{url}/metrics", timeout=10).text
        alone = httpx.get(f"{url}/metrics/?{names_query('vllm')}", timeout=10).text
        after = httpx.get(f"{url}/metrics", timeout=10).text
        return (full, alone) if parse_reading(after) == parse_reading(full) else None

    full, alone = until(around, "two equal readings of /metrics around the filtered one")
    # the series read include vLLM's per-request histograms (phase times, lengths: ~20 buckets each), so the
    # filtered body is about a third of the whole one on this small server (9x smaller on a busy real one)
    assert len(alone) < len(full) / 2.5, (len(alone), len(full))
    assert parse_reading(alone) == parse_reading(full)
    transports = Transports()
    source = EngineSource(EngineTarget("vllm", url), transports)
    try:
        await source.read()
        assert not source.filtering  # what the engine is comes from the plain path
        later = [s for _ in range(2) for s in await source.read()]
    finally:
        await transports.aclose()
    assert source.filtering
    assert all(s.metrics_error is None and s.reading is not None and s.reading.dialect == "vllm"
               for s in later)


def test_startup_is_shown_as_starting_while_connections_are_refused(vllm_server) -> None:
    # Recorded by the fixture with the dashboard's own poller (launched_by_us=True) while vLLM loaded.
    startup = vllm_server.startup
    assert len(startup) >= 3
    before_up = [s for s in startup if s.health != "up"]
    assert before_up, "vLLM answered /health on the very first poll: nothing was observed while loading"
    assert {s.health for s in before_up} == {"starting"}
    assert all("not accepting connections yet" in (s.health_reason or "") for s in before_up)
    # Once up it stays up: "starting" only ever precedes "up".
    healths = [s.health for s in startup]
    if "up" in healths:
        assert set(healths[healths.index("up"):]) == {"up"}


def _bucket_of(value: float, buckets: tuple[tuple[float, float], ...]) -> tuple[float, float]:
    lower = 0.0
    for bound, _ in buckets:
        if value <= bound:
            return lower, bound
        lower = bound
    raise AssertionError(f"{value} is above every bucket")


def _within_a_bucket(server: float, measured: float, buckets: tuple[tuple[float, float], ...]) -> bool:
    """`measured` lies in the bucket holding the histogram estimate `server`, or in a neighbouring one."""
    bounds = [0.0] + [b for b, _ in buckets]
    _, upper = _bucket_of(server, buckets)
    i = bounds.index(upper)
    return bounds[max(0, i - 2)] <= measured <= bounds[min(len(bounds) - 1, i + 1)]


async def test_ttft_and_itl_quantiles_from_histogram_deltas_match_measurements(vllm_server) -> None:
    """Quantiles from `derive` over a window holding only these requests, against per-request measurements.

    Tolerance: histogram_quantile interpolates inside the bucket holding the rank, so it only places the
    true quantile somewhere in that bucket (10 ms wide for ITL's first bucket, 5-20 ms for TTFT's low
    ones); a measurement of the same quantity taken elsewhere may fall just across a bucket edge. So the
    measured median must lie in the estimate's bucket or a neighbouring one.

    Measured by whom: the engine's own per-request figures (final usage chunk, --enable-per-request-metrics:
    queue + scheduled-to-first-token, and mean inter-token gap), and the client's clock. The client's
    clock gets only a one-sided bound. With this tiny model an engine step (~2 ms) is shorter than the
    frontend's work per step, its output loop then drains a non-empty queue without yielding, and a
    stream is usually written out only when its request has finished (seen: TTFT ~120 ms by the client's
    clock against ~8 ms in the histogram; Gemma 3 270M, at ~55 ms a step, streams smoothly). A client
    can never see a token before the engine made it, so the client's TTFT median is at least the lower
    edge of the estimate's bucket.
    """
    url = vllm_server.url
    target = EngineTarget("vllm", url)
    prev, prev_t = reading(url), time.monotonic()
    n_requests = 15
    results = []
    async with ProbeClient() as client:
        for i in range(n_requests):
            results.append(await client.chat(target, chat_body(f"Request {i}: tell me about rivers.", 64)))
    assert all(r.ok for r in results), [r.error for r in results]
    cur = wait_finished(url, prev, n_requests)
    stats = derive(prev, prev_t, cur, time.monotonic())
    assert not stats.counter_reset
    assert cur.ttft_buckets is not None and prev.ttft_buckets is not None and cur.itl_buckets is not None
    # The window holds exactly these requests' first tokens, and all their later ones.
    assert cur.ttft_buckets[-1][1] - prev.ttft_buckets[-1][1] == n_requests
    assert cur.itl_buckets[-1][1] - prev.itl_buckets[-1][1] == n_requests * 63  # type: ignore[index]

    servers = [r.server for r in results]
    assert all(s is not None and s.source == "vllm" for s in servers)
    engine_ttft = median((s.queue_ms or 0) / 1000 + s.ttft_ms / 1000 for s in servers if s and s.ttft_ms)
    engine_itl = median(s.mean_itl_ms / 1000 for s in servers if s and s.mean_itl_ms)
    assert engine_ttft is not None and engine_itl is not None
    assert stats.ttft_p50_s is not None and stats.itl_p50_s is not None
    assert _within_a_bucket(stats.ttft_p50_s, engine_ttft, cur.ttft_buckets), (stats.ttft_p50_s, engine_ttft)
    assert _within_a_bucket(stats.itl_p50_s, engine_itl, cur.itl_buckets), (stats.itl_p50_s, engine_itl)

    client_ttft = median(r.ttft_s for r in results)
    assert client_ttft is not None
    assert client_ttft >= _bucket_of(stats.ttft_p50_s, cur.ttft_buckets)[0], (stats.ttft_p50_s, client_ttft)


async def test_probe_counts_tokens_from_the_final_usage_chunk(vllm_server) -> None:
    target = EngineTarget("vllm", vllm_server.url)
    body = chat_body("Describe a lighthouse.", 40)
    expected_prompt = httpx.post(f"{vllm_server.url}/v1/chat/completions", json=body, timeout=60).json()[
        "usage"]["prompt_tokens"]
    async with ProbeClient() as client:
        result = await client.chat(target, body, workload="short")
    assert result.ok, result.error
    assert result.token_source == "server" and CHUNK_ESTIMATE_NOTE not in result.notes
    assert result.completion_tokens == 40 and result.prompt_tokens == expected_prompt
    assert result.finish_reason == "length"
    assert 0 < result.chunks <= 40  # the role-only first chunk carries no text and is not counted
    assert result.ttft_s is not None
    # The tiny model's frontend sometimes writes the whole stream out in one piece (see below): then the
    # client saw no decode at all and must say so, never a rate from a zero-length span.
    if result.last_token_at == result.first_token_at:
        assert result.decode_tps is None
    else:
        assert result.decode_tps is not None and result.decode_tps > 0
    assert result.server_decode_tps is not None and result.server_decode_tps > 0  # the engine's own

