"""The probe client against the real llama-server (Gemma 3 270M, 4 slots). A missing engine fails."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tui.base.stats import median
from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient
from tui.probe.results import ProbeResult
from tui.probe.runner import ProbeRunner
from tui.probe.sweep import SweepConfig, run_sweep
from tui.probe.workloads import WorkloadParams, run_workload

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]


async def collect(url: str, workload: str, params: WorkloadParams, repeat: int) -> list[ProbeResult]:
    target = EngineTarget(name="llama", url=url)
    async with ProbeClient() as client:
        return [r async for r in run_workload(client, target, workload, params, repeat)]


async def test_decode_rate_agrees_with_server_timings(llama_server) -> None:
    results = await collect(llama_server.url, "short", WorkloadParams(max_tokens=96), 4)
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.token_source == "server" and r.completion_tokens == 96  # ignore_eos holds the length
        assert r.server is not None and r.server.source == "llamacpp" and r.server.predicted_n == 96
        assert r.finish_reason == "length"
    client = median(r.decode_tps for r in results)
    server = median(r.server_decode_tps for r in results)
    assert client is not None and server is not None
    assert client == pytest.approx(server, rel=0.03), (client, server)


async def test_agent_turns_after_the_first_hit_the_prompt_cache(llama_server) -> None:
    params = WorkloadParams(max_tokens=16, agent_context_tokens=300)
    results = await collect(llama_server.url, "agent", params, 4)
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.turn for r in results] == [1, 2, 3, 4]
    prompts = [r.prompt_tokens for r in results]
    assert prompts == sorted(prompts) and prompts[0] is not None and prompts[0] > 300
    for r in results[1:]:
        assert r.cached_tokens is not None and r.cached_tokens > 0
        assert r.cached_share is not None and r.cached_share > 0.5


async def test_long_prefill_is_not_served_from_the_cache(llama_server) -> None:
    # 4096 ctx over 4 slots leaves 1024 tokens a request on the demo server.
    results = await collect(llama_server.url, "long-prefill", WorkloadParams(prompt_tokens=700), 2)
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.completion_tokens == 1 and r.decode_tps is None  # one token: no decode rate to claim
        assert r.prompt_tokens is not None and 550 <= r.prompt_tokens <= 900
        # The nonce makes every prompt new after the template's first few tokens.
        assert r.cached_tokens is not None and r.cached_tokens < 20
        assert r.prefill_source == "server" and r.prefill_tps is not None and r.prefill_tps > 0


async def test_a_long_prompt_streams_its_prefill_progress(llama_server) -> None:
    """return_progress: llama-server reports each prompt batch before the first token; the probe hands it on
    (the dashboard's "probe prefill" row) and the result is unchanged by it."""
    seen = []
    target = EngineTarget(name="llama", url=llama_server.url)
    async with ProbeClient() as client:
        [result] = [r async for r in run_workload(client, target, "long-prefill",
                                                  WorkloadParams(prompt_tokens=900), 1, seen.append)]
    assert result.ok, result.error
    assert seen, "no prompt_progress chunk"
    last = seen[-1]
    assert last.total == result.prompt_tokens and last.processed == last.total and last.fraction == 1.0
    assert [p.processed for p in seen] == sorted(p.processed for p in seen)
    assert last.cache == result.cached_tokens


async def test_thinking_off_is_accepted(llama_server) -> None:
    (r,) = await collect(llama_server.url, "thinking-off", WorkloadParams(max_tokens=8), 1)
    assert r.ok and r.status == 200 and r.completion_tokens == 8


async def test_sweep_four_streams_beat_one(llama_server) -> None:
    # Levels interleaved (1, 4, 1, 4, 1, 4), each level's best compared: the other worker's tests (a
    # Prometheus over 210 synthetic engines, Chromium) take the CPU in bursts, and a burst during one level
    # cut it to 70 % of the other once when the levels' sums were compared. A burst only slows a level, so
    # the best of three is the engine's own rate. Once, bursts hit all three levels of 4 (46.7 tok/s for
    # either level): a second sweep is run before failing; an engine that does not batch fails both.
    config = SweepConfig(levels=(1, 4) * 3, requests_per_stream=2, params=WorkloadParams(max_tokens=32))
    rates = []
    for _ in range(2):
        async with ProbeClient() as client:
            result = await run_sweep(client, EngineTarget(name="llama", url=llama_server.url), config)
        for lv in result.levels:
            assert lv.ok == lv.requests == 2 * lv.level, lv.errors
            assert lv.token_source == "server" and lv.aggregate_tps is not None
        rates.append({n: max(lv.completion_tokens / lv.wall_s for lv in result.levels if lv.level == n)
                      for n in (1, 4)})
        if rates[-1][4] > rates[-1][1]:
            break
    assert rates[-1][4] > rates[-1][1], rates


def test_cli_probe_against_llama(llama_server) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tui", "probe", "--engine", llama_server.url, "--repeat", "2",
         "--max-tokens", "16", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    *requests, summary = [json.loads(line) for line in proc.stdout.splitlines()]
    for r in requests:
        assert r["ok"] and r["token_source"] == "server" and r["completion_tokens"] == 16
        assert r["server_decode_tps"] is not None and r["prefill_source"] == "server"
        assert r["server_timings"]["predicted_n"] == 16
    assert summary["ok"] == 2


def cli_probe(url: str, *args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "tui", "probe", "--engine", url, "--json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


async def test_repeated_dashboard_probes_and_cli_runs_are_not_served_from_the_cache(llama_server) -> None:
    """Five probes the way the dashboard sends them (`f` pressed five times: ProbeRunner.probe with the same
    workload, params and repeat=1, request index 0 each time), then two separate `enginetop probe` runs.
    Each after the first may reuse only the chat template's tokens from llama.cpp's prompt cache."""
    runner = ProbeRunner()
    target = EngineTarget(name="llama", url=llama_server.url)
    params = WorkloadParams(max_tokens=8)
    dashboard: list[ProbeResult] = []
    for _ in range(5):
        await runner.probe(target, "short", params, repeat=1, on_result=dashboard.append)
    await runner.aclose()
    cli = [cli_probe(llama_server.url, "--repeat", "1", "--max-tokens", "8")[0] for _ in range(2)]
    assert all(r.ok for r in dashboard) and all(r["ok"] for r in cli)
    assert [r.index for r in dashboard] == [0] * 5
    seen = [(r.cached_tokens, r.prompt_tokens, r.cache_served) for r in dashboard]
    seen += [(r["cached_tokens"], r["prompt_tokens"], r["cache_served"]) for r in cli]
    for cached, prompt, served in seen[1:]:
        assert cached is not None and prompt is not None and cached / prompt < 0.5, seen
        assert not served
    # A fixed nonce repeats a prompt on purpose, and the result says the cache served it.
    fixed = ("--nonce", secrets.token_hex(4), "--max-tokens", "8")
    cli_probe(llama_server.url, *fixed)
    again = cli_probe(llama_server.url, *fixed)[0]
    assert again["cached_share"] >= 0.5 and again["cache_served"] is True
    note = f"prompt cache served {again['cached_tokens']} of {again['prompt_tokens']} prompt tokens"
    assert any(n.startswith(note) for n in again["notes"]), again["notes"]


async def test_engine_ttft_beside_the_clients_and_no_gap_on_llama(llama_server) -> None:
    results = await collect(llama_server.url, "short", WorkloadParams(max_tokens=8), 3)
    for r in results:
        assert r.ok and r.server is not None and r.server.prompt_ms is not None
        assert r.server_ttft_s == pytest.approx(r.server.prompt_ms / 1000)
        assert r.ttft_s is not None and r.ttft_s >= r.server_ttft_s  # the client cannot see it sooner
        assert r.connect_s is not None and r.connect_s < r.ttft_s
        assert r.ttft_gap() is None, r.ttft_gap()
    (request, summary) = cli_probe(llama_server.url, "--repeat", "1", "--max-tokens", "8")
    assert request["server_ttft_s"] == pytest.approx(request["server_timings"]["prompt_ms"] / 1000)
    assert request["ttft_gap"] is None and request["connect_s"] is not None
    assert summary["server_ttft_s_p50"] == request["server_ttft_s"]
