"""Each request's life as the real vLLM timed and counted it: finish reasons equal to what the responses
said (a client that drops its stream is not counted by vLLM 0.32: its output processor forgets the request
without a finish reason), and the phase quantiles inside the buckets vLLM's own histograms put them in."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.shown import show
from tui.exporter.metrics import ProbeMetrics
from tui.model.samples import EngineStats
from tui.model.targets import EngineTarget
from tui.sources.engine import poll_engine
from tui.sources.requests import request_stats

pytestmark = pytest.mark.engine

MODEL = "enginetop-tiny-llama"


async def _reading(url: str):
    async with httpx.AsyncHTTPTransport() as transport:
        sample = await poll_engine(transport, EngineTarget("vllm", url))
    assert sample.reading is not None, sample.metrics_error
    return sample.reading


def _buckets(text: str, family: str) -> list[tuple[float, float]]:
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            by: dict[float, float] = {}
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    by[float(s.labels["le"])] = by.get(float(s.labels["le"]), 0.0) + s.value
            return sorted(by.items())
    raise AssertionError(f"{family} not in /metrics")


def _bucket_of(delta: list[tuple[float, float]], q: float) -> tuple[float, float]:
    """The bucket (lower, upper) in which vLLM's own histogram puts quantile q."""
    rank = q * delta[-1][1]
    lower = 0.0
    for bound, count in delta:
        if count >= rank and count > 0:
            return lower, bound
        lower = bound
    raise AssertionError("empty histogram")


def test_finish_reasons_and_phase_quantiles_are_vllms_own(vllm_server) -> None:
    url = vllm_server.url
    before_text = httpx.get(f"{url}/metrics", timeout=10).text
    before = asyncio.run(_reading(url))

    async def traffic() -> list[str]:
        reasons = []
        async with httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(client.post(f"{url}/v1/completions", json={
                "model": MODEL, "prompt": f"request {n} " * (4 + 3 * n), "max_tokens": 4 + 4 * n,
                "temperature": 0, **({"stop": ["e", " ", "t"]} if n % 2 else {})}) for n in range(6)))
            reasons += [r.json()["choices"][0]["finish_reason"] for r in replies]
        return reasons

    told = asyncio.run(traffic())
    after = asyncio.run(_reading(url))
    after_text = httpx.get(f"{url}/metrics", timeout=10).text
    stats = request_stats([(0.0, before), (10.0, after)])
    assert stats is not None
    show("the responses' finish reasons", told)
    show("vLLM's, in the window", stats.finish_window)
    expected: dict[str, float] = {}
    for reason in told:
        expected[reason] = expected.get(reason, 0) + 1
    assert dict(stats.finish_window) == expected
    assert stats.ended == len(told)
    for field, family in (("e2e_s", "vllm:e2e_request_latency_seconds"),
                          ("queue_s", "vllm:request_queue_time_seconds"),
                          ("prefill_s", "vllm:request_prefill_time_seconds"),
                          ("decode_s", "vllm:request_decode_time_seconds")):
        old, new = _buckets(before_text, family), _buckets(after_text, family)
        delta = [(b, c - p) for (b, c), (_, p) in zip(new, old, strict=True)]
        shown = getattr(stats, field)
        show(field, shown)
        for q, value in zip((0.5, 0.9, 0.99), shown, strict=True):
            lower, upper = _bucket_of(delta, q)
            assert value is not None
            if math.isinf(upper):
                assert value == lower  # Prometheus' answer past the last finite bound
            else:
                assert lower <= value <= upper, (field, q, value, lower, upper)
    assert stats.prompt_len is not None and stats.prompt_len[0] > 0
    assert stats.gen_len is not None and stats.gen_len[0] > 0
    assert stats.tokens_per_step is not None and stats.tokens_per_step > 0
    # tokens per step is vLLM's own iteration_tokens_total histogram: its sum's delta over its count's
    steps = [(_sample(t, "vllm:iteration_tokens_total_sum"), _sample(t, "vllm:iteration_tokens_total_count"))
             for t in (before_text, after_text)]
    assert math.isclose(stats.tokens_per_step, (steps[1][0] - steps[0][0]) / (steps[1][1] - steps[0][1]))
    metrics = ProbeMetrics(process=False)  # and the exporter serves it as computed
    metrics.engine("vllm", (), EngineStats(requests=stats))
    served = metrics.exposition().decode()
    assert f'enginetop_tokens_per_step{{engine="vllm"}} {stats.tokens_per_step}' in served


def _sample(text: str, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)
