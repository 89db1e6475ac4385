"""The fleet view's figures for the REAL engines, read through a real Prometheus (1 s scrapes), checked
against a direct scrape of the same engine's /metrics:

- counters (tokens generated, prompt tokens): equal, once both have seen the same state (engine idle);
- generation tok/s under steady load: within 35 % of the rate of two direct scrapes 10 s apart (llama.cpp
  adds a request's tokens when it ends, and Prometheus' rate extrapolates to its window's edges: the two
  windows do not cover exactly the same requests);
- vLLM's TTFT / ITL p50: over a window holding all the load and nothing before it, Prometheus' quantile and
  the one enginetop computes from the direct scrapes' bucket deltas agree within 5 % (histogram_quantile
  is blind to a scale common to every bucket, but rate() extrapolates a bucket that started at zero a
  little less than one that did not, by half a scrape interval at most).

A missing engine fails (conftest), never skips.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_server import running_prometheus

from tui.fleet.prometheus import PrometheusClient
from tui.fleet.source import FleetSource
from tui.record.reader import Recording
from tui.sources.metrics import parse_reading
from tui.sources.rates import histogram_quantile

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine
RATE_TOLERANCE = 0.35
Q_TOL = 0.05


async def direct(url: str):
    async with httpx.AsyncClient() as client:
        r = await client.get(f"{url}/metrics", timeout=10)
    return time.monotonic(), parse_reading(r.text)


async def load(url: str, seconds: float, streams: int = 2, max_tokens: int = 24) -> int:
    done = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal done
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = await client.post(f"{url}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": f"Tell me about lighthouse number {i}."}],
                "max_tokens": max_tokens, "temperature": 0})
            r.raise_for_status()
            done += 1

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, i) for i in range(streams)))
    return done


async def fleet_read(prom_url: str):
    client = PrometheusClient(prom_url)
    source = FleetSource(client)
    try:
        samples = await source.read()
    finally:
        await client.aclose()
    assert source.error is None, source.error
    [sample] = samples
    return sample


async def settle(prom, url: str) -> tuple:
    """Wait until Prometheus' newest scrape shows what a direct scrape shows (the engine is idle)."""
    deadline = time.monotonic() + 15
    while True:
        _, now = await direct(url)
        sample = await fleet_read(prom.url)
        if sample.reading.generation_tokens_total == now.generation_tokens_total or \
                time.monotonic() > deadline:
            return sample, now
        await asyncio.sleep(0.5)


async def test_llama_server_through_prometheus_matches_its_own_metrics(llama_server, tmp_path):
    with running_prometheus({"llama": [f"127.0.0.1:{llama_server.port}"]}) as prom:
        prom.wait_for("llamacpp:tokens_predicted_total")
        task = asyncio.create_task(load(llama_server.url, 14))
        await asyncio.sleep(3)
        t0, first = await direct(llama_server.url)
        await asyncio.sleep(10)
        t1, second = await direct(llama_server.url)
        during = await fleet_read(prom.url)
        assert await task > 0
        direct_rate = (second.generation_tokens_total - first.generation_tokens_total) / (t1 - t0)
        assert direct_rate > 0
        assert during.stats.gen_tps == pytest.approx(direct_rate, rel=RATE_TOLERANCE)
        assert during.reading.dialect == "llamacpp" and during.health == "up"
        assert during.instance == f"127.0.0.1:{llama_server.port}" and during.host == "127.0.0.1"
        sample, now = await settle(prom, llama_server.url)
        assert sample.reading.generation_tokens_total == now.generation_tokens_total
        assert sample.reading.prompt_tokens_processed_total == now.prompt_tokens_processed_total
        assert sample.reading.running == now.running == 0
        # llama.cpp has no histograms and no KV gauge: n/a through Prometheus too, never 0
        assert sample.stats.ttft_p50_s is None and sample.reading.kv_cache_usage is None

        # `enginetop record --prometheus`: the same fleet samples, figures and labels, kept in a recording
        out = tmp_path / "fleet.enginetop.sqlite"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui", "record", "--prometheus", prom.url, "--refresh", "1",
            "--duration", "5", "-o", str(out), cwd=ROOT, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert f"recording the fleet in {prom.url}" in err.decode()
        recorded = [r.item for r in Recording(out).rows() if r.kind == "engine"]
        assert len(recorded) >= 3
        last = recorded[-1]
        assert last.instance == f"127.0.0.1:{llama_server.port}" and last.health == "up"
        assert last.stats is not None and last.reading.dialect == "llamacpp"
        assert last.reading.generation_tokens_total == now.generation_tokens_total  # idle since settle()


async def test_vllm_through_prometheus_matches_its_own_metrics(vllm_server):
    with running_prometheus({"vllm": [f"127.0.0.1:{vllm_server.port}"]}) as prom:
        prom.wait_for("vllm:generation_tokens_total")
        await asyncio.sleep(2)
        _, before = await direct(vllm_server.url)
        assert await load(vllm_server.url, 8, max_tokens=16) > 0
        sample, after = await settle(prom, vllm_server.url)
        assert sample.reading.dialect == "vllm" and sample.model and sample.labels
        assert sample.reading.generation_tokens_total == after.generation_tokens_total
        assert sample.reading.prompt_tokens_processed_total == after.prompt_tokens_processed_total
        assert sample.reading.kv_cache_usage is not None
        delta = [(b, a - c) for (b, a), (_, c) in zip(after.ttft_buckets, before.ttft_buckets, strict=True)]
        assert sample.stats.ttft_p50_s == pytest.approx(histogram_quantile(0.5, delta), rel=Q_TOL)
        delta = [(b, a - c) for (b, a), (_, c) in zip(after.itl_buckets, before.itl_buckets, strict=True)]
        assert sample.stats.itl_p50_s == pytest.approx(histogram_quantile(0.5, delta), rel=Q_TOL)
