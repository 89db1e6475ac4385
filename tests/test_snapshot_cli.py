"""`enginetop snapshot --json` against the real llama-server, run as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tui.base.process import free_port

KEYS = ("dialect", "health", "model", "running", "waiting", "prompt_processed_tps", "prompt_computed_tps",
        "gen_tps", "decode_tps_busy", "prefix_cache_hit_rate", "spec_accept_rate", "kv_cache_usage",
        "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "prompt_tokens_processed_total",
        "prompt_tokens_computed_total", "prompt_tokens_cached_total", "generation_tokens_total")


def snapshot(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--interval", "0.5", "--json", *args],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def test_snapshot_counts_exactly_the_tokens_the_server_reported(llama_server):
    code, first = snapshot("--engine", f"llama={llama_server.url}")
    assert code == 0
    engine = first["engines"]["llama"]
    for key in KEYS:
        assert key in engine, key
    assert engine["dialect"] == "llamacpp" and engine["health"] == "up"
    assert engine["model"].endswith(".gguf")
    # llama.cpp exposes neither histograms nor a KV-cache gauge: null, not 0
    for key in ("ttft_p50_s", "ttft_p90_s", "itl_p50_s", "kv_cache_usage"):
        assert engine[key] is None, key
    assert isinstance(first["gpus"], list) and "host" in first
    assert first["host"]["ram_total_bytes"] > 0

    reply = httpx.post(f"{llama_server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": 17, "ignore_eos": True})
    usage = reply.json()["usage"]
    code, second = snapshot("--engine", f"llama={llama_server.url}")
    assert code == 0

    def moved(key: str) -> float:
        return second["engines"]["llama"][key] - engine[key]

    assert moved("generation_tokens_total") == usage["completion_tokens"] == 17
    # the same meaning on every engine: processed = the whole prompt, computed = what was not cached
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert moved("prompt_tokens_processed_total") == usage["prompt_tokens"]
    assert moved("prompt_tokens_cached_total") == cached
    assert moved("prompt_tokens_computed_total") == usage["prompt_tokens"] - cached


def test_snapshot_exit_status_3_when_an_engine_is_down(llama_server):
    dead = f"http://127.0.0.1:{free_port()}"
    code, snap = snapshot("--engine", f"llama={llama_server.url}", "--engine", f"gone={dead}")
    assert code == 3
    assert snap["engines"]["gone"]["health"] == "down"
    assert "refused" in snap["engines"]["gone"]["health_reason"]
    assert snap["engines"]["gone"]["gen_tps"] is None
    assert snap["engines"]["llama"]["health"] == "up"


def test_snapshot_rejects_a_malformed_engine_spec():
    proc = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--engine", "llama=localhost:8080"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "expected NAME=http://HOST:PORT" in proc.stderr
