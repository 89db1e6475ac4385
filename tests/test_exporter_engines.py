"""The exporter on the real llama-server and the real vLLM: a real Prometheus scrapes it and reads back,
through its query API, exactly what the exporter measured; `enginetop probe` on the same engine agrees."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_server import RunningPrometheus, running_prometheus

from tui.base.process import free_port
from tui.exporter.metrics import TTFT_BUCKETS, ProbeMetrics
from tui.exporter.schedule import ProbeScheduler, Schedule
from tui.exporter.serve import serve
from tui.model.targets import EngineTarget
from tui.probe.results import ProbeResult
from tui.probe.workloads import WorkloadParams

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


def probe_in_process(targets: list[EngineTarget], schedule: Schedule,
                     metrics: ProbeMetrics) -> list[ProbeResult]:
    """What `enginetop exporter` does, minus argv: the results as measured, and the metrics they fed."""
    results: list[ProbeResult] = []

    def on_result(result: ProbeResult) -> None:
        metrics.observe(result)
        results.append(result)

    asyncio.run(ProbeScheduler(targets, schedule, on_result).run())
    return results


def scalar(prom: RunningPrometheus, promql: str) -> float:
    result = prom.query(promql)
    assert len(result) == 1, (promql, result)
    return float(result[0]["value"][1])


def wait_value(prom: RunningPrometheus, promql: str, want: float, timeout: float = 30) -> None:
    """Until a scrape taken after the last probe has been stored."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        result = prom.query(promql)
        if result and (got := float(result[0]["value"][1])) == want:
            return
        time.sleep(0.25)
    raise AssertionError(f"{promql} = {got}, wanted {want}")


def scraped_after(prom, wall: float, timeout: float = 30.0) -> None:
    """Wait for a scrape of the exporter that began after `wall` (Prometheus stamps a scrape's series with
    its start): a scrape taken while the probes ran holds only some of their results."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = prom.query('timestamp(up{job="enginetop"})')
        if got and float(got[0]["value"][1]) > wall:
            return
        time.sleep(0.25)
    raise AssertionError(f"no scrape of the exporter after {wall}")


def test_prometheus_reads_back_exactly_what_the_exporter_measured_on_llama(llama_server) -> None:
    metrics = ProbeMetrics()
    port = free_port()
    server = serve(metrics, "127.0.0.1", port)
    dead = f"http://127.0.0.1:{free_port()}"
    targets = [EngineTarget("llama", llama_server.url), EngineTarget("dead", dead)]
    schedule = Schedule(every_s=1.0, workloads=("short", "agent"), agent_turns=2,
                        params=WorkloadParams(max_tokens=24), rounds=2)
    try:
        with running_prometheus({"enginetop": [f"127.0.0.1:{port}"]}, interval_s=1.0) as prom:
            results = probe_in_process(targets, schedule, metrics)
            scraped_after(prom, time.time())  # every figure below is then from a scrape of the finished run
            short = [r for r in results if r.engine == "llama" and r.workload == "short"]
            agent = [r for r in results if r.engine == "llama" and r.workload == "agent"]
            assert len(short) == 2 and len(agent) == 4 and all(r.ok for r in short + agent), results
            sel = '{engine="llama",workload="short"}'
            wait_value(prom, f"enginetop_probe_ttft_seconds_count{sel}", len(short))
            # The same floats, through the text format, a scrape, the TSDB and the query API.
            assert scalar(prom, f"enginetop_probe_ttft_seconds_sum{sel}") == short[0].ttft_s + short[1].ttft_s
            assert scalar(prom, f"enginetop_probe_last_ttft_seconds{sel}") == short[-1].ttft_s
            assert scalar(prom, f"enginetop_probe_last_server_ttft_seconds{sel}") == short[-1].server_ttft_s
            assert scalar(prom, f"enginetop_probe_last_e2e_seconds{sel}") == short[-1].e2e_s
            decode = prom.query(f"enginetop_probe_last_decode_tokens_per_second{sel}")
            assert len(decode) == 1 and float(decode[0]["value"][1]) == short[-1].decode_tps
            labels = decode[0]["metric"]
            assert labels["token_source"] == "server" and labels["model"] == short[-1].model
            assert labels["model"] and "127.0.0.1" not in labels["model"]
            assert scalar(prom, f"enginetop_probe_completion_tokens_total{sel}") == 2 * 24
            prefill = scalar(prom, f"enginetop_probe_last_prefill_tokens_per_second{sel}")
            assert prefill == short[-1].prefill_tps
            # The agent's cached share counts turns after the first: the conversation hit the cache.
            asel = '{engine="llama",workload="agent"}'
            assert scalar(prom, f"enginetop_probe_cached_prompt_share_count{asel}") == 2
            later = [r for r in agent if r.turn == 2]
            assert scalar(prom, f"enginetop_probe_cached_prompt_share_sum{asel}") == (
                later[0].cached_share + later[1].cached_share)
            assert all(r.cached_share > 0.5 for r in later)
            # The dead engine: failures by reason, up 0, and the live one beside it up 1.
            failed = [r for r in results if r.engine == "dead"]
            assert len(failed) == 6 and {r.failure for r in failed} == {"refused"}
            assert scalar(prom, 'sum(enginetop_probe_failed_total{engine="dead",reason="refused"})') == 6
            assert scalar(prom, 'enginetop_probe_up{engine="dead"}') == 0
            assert scalar(prom, 'enginetop_probe_up{engine="llama"}') == 1
            # p90 of the two TTFTs lies inside the bucket that holds the larger. Read from the bucket counters
            # themselves: a rate() over them extrapolates each bucket from the scrapes it saw (a probe that
            # ended before a bucket's series first appeared is no increase), which moved p90 out of the
            # bucket once (0.48 for TTFTs of 0.39 and 0.51 s).
            p90 = scalar(prom, "histogram_quantile(0.9, sum by (le) "
                               f"(enginetop_probe_ttft_seconds_bucket{sel}))")
            slowest = max(r.ttft_s for r in short)
            upper = min(b for b in TTFT_BUCKETS if b >= slowest)
            lower = max((b for b in TTFT_BUCKETS if b < slowest), default=0.0)
            assert lower < p90 <= upper, (p90, [r.ttft_s for r in short])
            assert scalar(prom, 'up{job="enginetop"}') == 1
    finally:
        server.shutdown()
        server.server_close()


def enginetop_probe(url: str, *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "tui", "probe", "--engine", url, "--json", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()][:-1]


def assert_agree(results: list[ProbeResult], cli: list[dict], max_tokens: int) -> None:
    """Same definitions, same code path: counts equal, rates of the same size, the same labels."""
    assert all(r.ok for r in results) and all(c["ok"] for c in cli)
    assert {r.completion_tokens for r in results} == {c["completion_tokens"] for c in cli} == {max_tokens}
    assert {r.token_source for r in results} == {c["token_source"] for c in cli} == {"server"}
    # Same workload, same seed: the prompts differ only in their nonce tag.
    assert abs(statistics.median(r.prompt_tokens for r in results)
               - statistics.median(c["prompt_tokens"] for c in cli)) <= 3
    # Rates measured minutes apart on a shared machine differ with its load (12.6 against 33.3 tok/s once, the
    # other test worker busy): the same definition shows as the same ratio to the engine's own decode rate of
    # each request, and each side's within a few percent of it.
    exp_ratio = statistics.median(r.decode_tps / r.server_decode_tps for r in results)
    cli_ratio = statistics.median(c["decode_tps"] / c["server_decode_tps"] for c in cli)
    assert abs(exp_ratio - cli_ratio) < 0.05, (exp_ratio, cli_ratio)
    for r in results:
        assert abs(r.decode_tps / r.server_decode_tps - 1) < 0.15, (r.decode_tps, r.server_decode_tps)
    for c in cli:
        assert abs(c["decode_tps"] / c["server_decode_tps"] - 1) < 0.15, c


def test_exporter_agrees_with_enginetop_probe_on_llama(llama_server) -> None:
    metrics = ProbeMetrics(process=False)
    schedule = Schedule(every_s=0.5, workloads=("short",), params=WorkloadParams(max_tokens=32), rounds=3)
    results = probe_in_process([EngineTarget("llama", llama_server.url)], schedule, metrics)
    cli = enginetop_probe(llama_server.url, "--workload", "short", "--repeat", "3", "--max-tokens", "32")
    assert_agree(results, cli, 32)


def test_exporter_probes_vllm_with_its_own_ttft(vllm_server) -> None:
    metrics = ProbeMetrics(process=False)
    schedule = Schedule(every_s=0.5, workloads=("short",), params=WorkloadParams(max_tokens=16), rounds=2)
    results = probe_in_process([EngineTarget("vllm", vllm_server.url)], schedule, metrics)
    assert len(results) == 2 and all(r.ok for r in results)
    # vLLM reports its TTFT per request (--enable-per-request-metrics): exported beside the client's.
    last = results[-1]
    labels = {"engine": "vllm", "workload": "short", "model": last.model}
    assert last.model and last.server_ttft_s is not None
    got = metrics.sample
    assert got("enginetop_probe_last_server_ttft_seconds", labels) == last.server_ttft_s
    assert got("enginetop_probe_last_ttft_seconds", labels) == last.ttft_s
    assert got("enginetop_probe_server_ttft_seconds_count", labels) == 2
    cli = enginetop_probe(vllm_server.url, "--workload", "short", "--repeat", "2", "--max-tokens", "16")
    assert {r.completion_tokens for r in results} == {c["completion_tokens"] for c in cli} == {16}
    assert {r.token_source for r in results} == {c["token_source"] for c in cli} == {"server"}
    assert all(c["server_ttft_s"] is not None for c in cli)


async def test_the_exporter_serves_llama_cpps_per_request_series_from_a_proxy(llama_server, tmp_path) -> None:
    """llama.cpp publishes no per-request series: with --traffic, the exporter serves those of a separate
    proxy's answers (finish reasons, lengths) under the same names as vLLM's."""
    from fake_pynvml import FakeNvml, h200

    from tui.exporter.watch import watch_engines
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions, build_proxy
    from tui.sources.gpu import GpuSampler
    from tui.sources.host import HostSampler

    target = EngineTarget("llama", llama_server.url)
    proxy = build_proxy(ProxyOptions({"llama": Listen("127.0.0.1", free_port())}, key_file=tmp_path / "key"),
                        [target])
    await proxy.start()
    metrics = ProbeMetrics()
    url = proxy.routes[0].proxy_url
    watch = asyncio.create_task(watch_engines([target], metrics, 0.3, gpu=GpuSampler(FakeNvml([h200()])),
                                              host=HostSampler(), traffic=[url]))
    try:
        import httpx
        async with httpx.AsyncClient(timeout=120) as client:
            for n in (4, 6, 8):
                reply = await client.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": n,
                    "ignore_eos": True})
                assert reply.json()["choices"][0]["finish_reason"] == "length"
        want = b'enginetop_requests_ended{engine="llama",reason="length"} 3.0'
        deadline = time.monotonic() + 20
        while want not in metrics.exposition() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        body = metrics.exposition().decode()
        assert want.decode() in body
        assert 'enginetop_request_tokens{engine="llama",kind="generation",quantile="avg"} 6.0' in body
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await proxy.stop()


async def test_an_engine_without_a_reading_keeps_its_proxys_per_request_series(tmp_path) -> None:
    """llama-server with neither --metrics nor /slots gives no reading at all: the exporter serves nothing
    the engine was found to be, but still the per-request series of the proxy in front of it (they are of its
    answers), while it is up; once it is down, none."""
    from conftest import start_engine
    from fake_pynvml import FakeNvml, h200

    from tui.base.process import stop_group
    from tui.engines.install_llamacpp import demo_argv
    from tui.exporter.watch import watch_engines
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions, build_proxy
    from tui.sources.gpu import GpuSampler
    from tui.sources.host import HostSampler

    engine = start_engine("bare", "llama-server", lambda port: [
        a for a in demo_argv(port, "--no-slots", "--threads", "1") if a != "--metrics"])
    target = EngineTarget("bare", engine.url)
    proxy = build_proxy(ProxyOptions({"bare": Listen("127.0.0.1", free_port())}, key_file=tmp_path / "key"),
                        [target])
    await proxy.start()
    metrics = ProbeMetrics()
    url = proxy.routes[0].proxy_url
    watch = asyncio.create_task(watch_engines([target], metrics, 0.3, gpu=GpuSampler(FakeNvml([h200()])),
                                              host=HostSampler(), traffic=[url]))
    want = 'enginetop_requests_ended{engine="bare",reason="length"} 2.0'

    async def served(what: str, present: bool = True) -> str:
        deadline = time.monotonic() + 20
        while (what in (body := metrics.exposition().decode())) != present and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return body

    try:
        import httpx
        async with httpx.AsyncClient(timeout=120) as client:
            for n in (4, 8):
                reply = await client.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": n,
                    "ignore_eos": True})
                assert reply.json()["choices"][0]["finish_reason"] == "length"
        body = await served(want)
        assert want in body
        assert 'enginetop_request_tokens{engine="bare",kind="generation",quantile="avg"} 6.0' in body
        await asyncio.sleep(1.0)  # several rounds later, each without a reading: still served
        assert want in metrics.exposition().decode()
        stop_group(engine.launched)
        assert want not in await served(want, present=False)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await proxy.stop()
        stop_group(engine.launched)
