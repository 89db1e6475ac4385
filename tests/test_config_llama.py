"""The configuration and findings on the real llama-server: slots that split the context, a prompt too long
for one slot refused through the proxy and explained, and speculative decoding read from a real speculative
engine (synthetic acceptance for exact figures, the demo model drafting for itself, an n-gram type)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import RunningEngine, start_llama
from tests.shown import show
from tests.waiting import until
from tui.base.process import free_port, stop_group
from tui.engines.install_llamacpp import demo_model_path
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_source import EngineSource

pytestmark = pytest.mark.engine

ENGINETOP = [sys.executable, "-m", "tui"]


def read_store(url: str, polls: int = 2, api_key: str | None = None) -> Store:
    """The engine read as the dashboard reads it (its configuration included) into a store."""
    store = Store()

    async def go() -> None:
        transports = Transports()
        source = EngineSource(EngineTarget("llama", url, api_key=api_key), transports)
        try:
            for i in range(polls):
                for sample in await source.read():
                    store.add(sample)
                if i + 1 < polls:
                    await asyncio.sleep(0.5)
        finally:
            await transports.aclose()

    asyncio.run(go())
    return store


def test_slots_that_split_the_context_as_the_engine_says(llama_server: RunningEngine) -> None:
    """The session's llama-server runs -c 4096 --parallel 4: four slots of 1,024 that share nothing. The
    configuration read from it says so, as /props and the engine's own start-up log do."""
    config = read_store(llama_server.url, polls=1).engines["llama"].sample.config
    assert config is not None
    props = httpx.get(f"{llama_server.url}/props", timeout=5).json()
    log = "\n".join(llama_server.launched.log_tail(400))
    slot, unified = re.search(r"n_ctx_slot = (\d+), kv_unified = '(\w+)'", log).groups()
    assert config.context_tokens == props["default_generation_settings"]["n_ctx"] == int(slot) == 1024
    assert config.slots == props["total_slots"] == 4 and config.kv_pool_tokens == 4096
    assert config.kv_unified is (unified == "true") is False
    assert config.spec_type == "off" and config.pid == llama_server.launched.pid
    assert config.summary().endswith("4 slots × 1,024 split")


def test_a_prompt_longer_than_one_slot_through_the_proxy_is_refused_and_explained(
        llama_server: RunningEngine, tmp_path: Path) -> None:
    """A 1,500-token prompt through `enginetop proxy` to four slots of 1,024: the engine refuses it, and
    `enginetop snapshot --traffic` says why with the per-slot context and what would have held it."""
    port = free_port()
    proxy = subprocess.Popen([*ENGINETOP, "proxy", "--engine", f"llama={llama_server.url}", "--listen",
                              f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        until(lambda: proxy.poll() is not None or _answers(f"http://127.0.0.1:{port}/health"),
              "the proxy to answer", 30)
        assert proxy.poll() is None, proxy.stderr.read() if proxy.stderr else ""
        long = " ".join(["apple banana cherry"] * 500)
        for stream in (False, True):
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": long}], "max_tokens": 8, "stream": stream})
            assert reply.status_code == 400 and "exceeds the available context size" in reply.text
        tokens = reply.json()["error"]["n_prompt_tokens"]
        assert tokens > 1024
        out = subprocess.run([*ENGINETOP, "snapshot", "--engine", f"llama={llama_server.url}", "--traffic",
                              f"http://127.0.0.1:{port}", "--json", "--interval", "0.5"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        engine = json.loads(out.stdout)["engines"]["llama"]
        [finding] = [f for f in engine["findings"] if f["id"] == "slots-split"]
        show("configuration", engine["config"]["summary"])
        show("finding", finding)
        assert finding["severity"] == "error"
        assert finding["title"].startswith("4 slots of 1,024 tokens each; at most 1 request ran at a time; "
                                           "2 requests were refused for length: one slot of 4,096")
        assert finding["figures"]["needed_tokens"] == tokens and finding["figures"]["refused"] == 2
        assert any("exceeds the available context size (1024 tokens)" in e for e in finding["evidence"])
        assert engine["traffic"]["facts"]["refused_for_length"] == 2
        assert engine["config"]["summary"].endswith("4 slots × 1,024 split")
        # The same engine watched through the proxy's port: the listener there is the proxy, not
        # llama-server; its command line says nothing of the engine, so nothing is read from it and no
        # default is stated as a fact.
        out = subprocess.run([*ENGINETOP, "snapshot", "--engine", f"proxied=http://127.0.0.1:{port}",
                              "--json", "--interval", "0.5"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        config = json.loads(out.stdout)["engines"]["proxied"]["config"]
        show("configuration through the proxy", config)
        assert f"argv: not read: enginetop's proxy (PID {proxy.pid}): the engine is the one it relays to" \
            in config["lacks"]
        assert config["argv"] == [] and config["pid"] is None
        assert (config["kv_unified"], config["kv_cache_dtype"], config["prefix_caching"]) == (None,) * 3
        assert (config["context_tokens"], config["slots"]) == (1024, 4)  # what /props and /slots publish
        assert "unified" not in config["summary"] and "split" not in config["summary"]
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _probe(url: str, tokens: int, prompt: str = "Count from one to forty, one number a line.") -> dict:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _counters(url: str) -> dict[str, float]:
    """The engine's own speculative counters, straight from its /metrics text."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("llamacpp:spec_decode_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_acceptance_per_draft_position_matches_the_engines_counters_and_the_rates_set() -> None:
    """Synthetic acceptance 0.9, 0.6, 0.3, 0.1 at depth 4: what enginetop shows per position is the engine's
    own counters exactly, and the rates set within sampling error; each response's drafted and accepted
    tokens add up to the counters; the drafts past depth 3 are named as wasted."""
    model = str(demo_model_path())
    engine = start_llama("spec-synth", "--threads", "2", "-md", model, "--spec-type", "draft-simple",
                         "--spec-draft-n-max", "4", "--spec-draft-p-min", "0",
                         "--spec-synth-rates", "0.9,0.6,0.3,0.1")
    try:
        replies = [_probe(engine.url, 96) for _ in range(3)]
        counters = _counters(engine.url)
        store = read_store(engine.url)
    finally:
        stop_group(engine.launched)
    drafts = counters["llamacpp:spec_decode_num_drafts_total"]
    per_pos = [counters[f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{k}"}}']
               for k in range(4)]
    state = store.engines["llama"]
    shown = state.stats.spec_accept_per_pos_total
    show("rates 0.9,0.6,0.3,0.1: drafts, accepted per position (engine), shown", [drafts, per_pos, shown])
    assert shown == tuple(a / drafts for a in per_pos)  # exactly the engine's own counts
    for rate, set_rate in zip(shown, (0.9, 0.6, 0.3, 0.1), strict=True):
        assert abs(rate - set_rate) < 4 * math.sqrt(set_rate * (1 - set_rate) / drafts), (shown, drafts)
    assert state.stats.spec_accept_length_total == pytest.approx(1 + sum(per_pos) / drafts)
    drafted = counters["llamacpp:spec_decode_num_draft_tokens_total"]
    assert sum(r["timings"]["draft_n"] for r in replies) == drafted
    assert sum(r["timings"]["draft_n_accepted"] for r in replies) == sum(per_pos)
    config = state.sample.config
    assert (config.spec_type, config.spec_n_max, config.spec_synthetic) == (
        "draft-simple", 4, "rates 0.9,0.6,0.3,0.1")
    [finding] = [f for f in state.findings if f.id == "spec-depth"]
    show("finding", finding)
    assert "past depth 3" in finding.title and "--spec-draft-n-max 3" in finding.suggestion


def test_the_model_drafting_for_itself_is_accepted_nearly_always_and_an_ngram_type_drafts_for_real() -> None:
    model = str(demo_model_path())
    selfdraft = start_llama("spec-self", "--threads", "2", "-md", model, "--spec-type", "draft-simple",
                            "--spec-draft-n-max", "3")
    try:
        reply = _probe(selfdraft.url, 48)
        state = read_store(selfdraft.url).engines["llama"]
    finally:
        stop_group(selfdraft.launched)
    assert reply["timings"]["draft_n"] > 0
    show("self-drafting acceptance", state.stats.spec_accept_rate_total)
    assert state.stats.spec_accept_rate_total >= 0.9, state.stats
    ngram = start_llama("spec-ngram", "--threads", "2", "--spec-type", "ngram-simple",
                        "--spec-draft-n-max", "4")
    try:
        text = "alpha beta gamma delta epsilon " * 12
        reply = _probe(ngram.url, 48, f"Repeat this text exactly, twice: {text}")
        counters = _counters(ngram.url)
        state = read_store(ngram.url).engines["llama"]
    finally:
        stop_group(ngram.launched)
    drafts = counters["llamacpp:spec_decode_num_drafts_total"]
    drafted = counters["llamacpp:spec_decode_num_draft_tokens_total"]
    show("ngram-simple: drafts, drafted, acceptance", [drafts, drafted, state.stats.spec_accept_rate_total])
    assert drafts > 0 and reply["timings"]["draft_n"] == drafted
    assert state.stats.spec_accept_rate_total == pytest.approx(
        counters["llamacpp:spec_decode_num_accepted_tokens_total"]
        / counters["llamacpp:spec_decode_num_draft_tokens_total"])
    assert state.sample.config.spec_type == "ngram-simple"


def test_a_depth_sweep_with_a_synthetic_mean_length_shows_acceptance_falling_as_08_over_depth(
        tmp_path: Path) -> None:
    """`enginetop sweep-param demo-spec-synth --param spec-draft-n-max=1,2,4` (mean accepted length held at
    1.8 by the engine): acceptance per arm falls as 0.8 / depth while the mean length stays 1.8, within the
    sampling error of the drafts each arm made; the report draws both against depth."""
    out = tmp_path / "synth.json"
    report = tmp_path / "synth.html"
    run = subprocess.run([*ENGINETOP, "sweep-param", "demo-spec-synth", "--param", "spec-draft-n-max=1,2,4",
                          "--instances", "1", "--blocks", "1", "--requests", "2", "--max-tokens", "64",
                          "--warmup", "0", "-o", str(out), "--report", str(report)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    arms = result["analysis"]["arms"]
    for depth in (1, 2, 4):
        spec = arms[f"spec-draft-n-max={depth}"]["spec"]
        assert spec["source"] == "engine counters" and len(spec["per_position"]) == depth
        # the rates the engine set for this depth, as its log says them ("synthetic acceptance: ... rates")
        [instance] = [i for i in result["instances"] if i["arm"] == f"spec-draft-n-max={depth}"]
        logged = re.search(r"synthetic acceptance: n_max = \d+, mean length = ([\d.]+), rates = \[([^\]]*)\]",
                           Path(instance["log_path"]).read_text())
        assert float(logged.group(1)) == pytest.approx(1.8)
        rates = [float(x) for x in logged.group(2).split(",")]
        assert len(rates) == depth and sum(rates) == pytest.approx(0.8, abs=1e-4)
        drafts = spec["drafts"]
        show(f"synthetic mean length 1.8, depth {depth}: rates set, spec", [rates, spec])
        for seen, rate in zip(spec["per_position"], rates, strict=True):
            assert abs(seen - rate) < 4 * math.sqrt(rate * (1 - rate) / drafts) + 1e-9, (depth, spec, rates)
        # the accepted count of a draft: E[X] = 0.8, E[X²] = sum (2k-1) P(X >= k), P(X >= k) the k-th rate
        sd = math.sqrt((sum((2 * k + 1) * r for k, r in enumerate(rates)) - 0.64) / drafts)
        assert abs(spec["mean_accepted_length"] - 1.8) < 4 * sd, (depth, spec)
        # acceptance = accepted / drafted tokens: 0.8 per draft over the tokens drafted (depth each, fewer
        # only where a reply's last draft was cut short)
        per_token = drafts / spec["draft_tokens"]
        assert per_token == pytest.approx(1 / depth, rel=0.05)
        assert abs(spec["acceptance_rate"] - 0.8 * per_token) < 4 * sd * per_token, (depth, spec)
    rates = [arms[f"spec-draft-n-max={d}"]["spec"]["acceptance_rate"] for d in (1, 2, 4)]
    assert rates[0] > rates[1] > rates[2]
    html = report.read_text()
    assert "Speculative acceptance by --spec-draft-n-max" in html and "accepted per draft position" in html
    assert "Configuration captured from the running engines" in html and "len 1.8" in html
    assert re.search(r"draft depth \(n-max\) ≠", html)
    assert "accept" in run.stdout and "spec-draft-n-max=4" in run.stdout
