"""The dashboard and `snapshot --json` on the real vLLM (tiny model): vLLM's own values, shown as they are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import httpx

from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tui.model.targets import EngineTarget


def complete(url: str, max_tokens: int) -> int:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "enginetop-tiny-llama", "messages": [{"role": "user", "content": "Tell me about rivers."}],
        "max_tokens": max_tokens, "ignore_eos": True})
    return reply.json()["usage"]["completion_tokens"]


def test_snapshot_json_on_real_vllm(vllm_server):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui", "snapshot", "--engine", f"vllm={vllm_server.url}", "--interval", "10",
         "--timeout", "10", "--json"], stdout=subprocess.PIPE, text=True)
    time.sleep(5)  # the first reading is taken (start-up and one poll); the request lands between the two
    produced = complete(vllm_server.url, 23)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    engine = json.loads(out)["engines"]["vllm"]
    assert engine["dialect"] == "vllm" and engine["health"] == "up"
    assert engine["model"] == "enginetop-tiny-llama"
    assert engine["kv_cache_usage"] is not None and 0 <= engine["kv_cache_usage"] <= 1
    assert engine["running"] == 0 and engine["waiting"] == 0
    assert produced == 23
    # the one request between the readings is in the histogram deltas: TTFT/ITL quantiles exist
    assert engine["ttft_p50_s"] is not None and 0 < engine["ttft_p50_s"] < 10
    assert engine["itl_p50_s"] is not None and engine["gen_tps"] > 0


async def test_dashboard_shows_vllm_values(vllm_server, tmp_path):
    app = make_app([EngineTarget("vllm", vllm_server.url)], tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        state = app.store.engines["vllm"]
        await wait_for(pilot, lambda: state.sample and state.sample.reading, timeout=30, what="a reading")
        before = state.sample.reading.generation_tokens_total
        produced = complete(vllm_server.url, 31)
        await wait_for(pilot, lambda: state.sample.reading and  # a late /metrics reads no reading
                       state.sample.reading.generation_tokens_total == before + produced, timeout=30,
                       what="generation counter moved by the reported completion tokens")
        await wait_for(pilot, lambda: state.stats.ttft_p50_s is not None, timeout=30, what="TTFT quantile")
        await wait_for(pilot, lambda: re.search(r"TTFT p50/p90\s*\d+ ms", screen_text(app)), timeout=10,
                       what="the TTFT quantile drawn")
        text = screen_text(app)
        assert "vllm" in text and "enginetop-tiny-llama" in text
        assert re.search(r"KV\s+\S*\s*\d+% of [\d,]+ tokens", text)  # vLLM exposes it: a bar and its pool
        assert re.search(r"TTFT p50/p90\s*\d+ ms", text)
