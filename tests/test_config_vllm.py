"""The configuration and findings on the real vLLM (CPU build): its KV pool as vLLM publishes it and logs it,
a workload whose ids share prefixes replayed with prefix caching on (no finding) and off (the finding, its
shared tokens following the ids), and its n-gram speculative decoding read per draft position."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import RunningEngine, wait_openai_ready
from tests.shown import show
from tests.test_config_llama import read_store
from tui.base.paths import runs_dir
from tui.base.process import free_port, launch, stop_group
from tui.cli.main import main
from tui.findings.facts import refused_for_length, refused_tokens
from tui.lifecycle.profile_files import load_profiles, repo_profiles_dir
from tui.lifecycle.profile_resolve import resolve
from widgets.engine_panel import render_engine

pytestmark = pytest.mark.engine

BLOCK = 128  # vLLM's KV block on this CPU build
# One agent session whose turns extend the last by whole blocks, and a stranger: 1,792 of 3,060 prompt tokens
# shared with an earlier request, by the ids
LINES = [{"timestamp": 0, "input_length": 128 * (n + 2), "output_length": 8, "hash_ids": list(range(n + 2)),
          "session_id": "s", **({"delay": 20} if n else {})} for n in range(5)]
LINES.append({"timestamp": 40, "input_length": 300, "output_length": 8, "hash_ids": [90, 91, 92]})
SHARED = 256 + 384 + 512 + 640


def workload(tmp_path: Path) -> Path:
    trace = tmp_path / "agent.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LINES))
    (tmp_path / "agent.jsonl.meta.json").write_bytes(orjson.dumps({"block_size": BLOCK, "tokenizer": "x"}))
    return trace


def bench(url: str, tmp_path: Path, key: str | None = None) -> dict:
    out = tmp_path / "bench.json"
    auth = []
    if key is not None:
        (tmp_path / "key").write_text(key + "\n")
        auth = ["--api-key-file", f"vllm={tmp_path / 'key'}"]
    code = main(["bench", str(workload(tmp_path)), "--engine", f"vllm={url}", *auth, "--speed", "20", "-o",
                 str(out)])
    assert code == 0
    text = out.read_text()
    assert_no_secret(text, "the bench result")
    [engine] = orjson.loads(text)["engines"]
    assert engine["ok"] == len(LINES), engine["first_errors"]
    return engine


def test_the_kv_pool_as_vllm_publishes_it_and_logs_it_and_a_cache_that_serves(vllm_server, tmp_path) -> None:
    """The session's vLLM (prefix caching on): the KV pool enginetop shows is cache_config_info's
    kv_cache_size_tokens and the number vLLM logged at start; the shared prefixes are served from its cache,
    so no prefix finding; its refusal of a prompt too long is recognised in its own words."""
    config = read_store(vllm_server.url, polls=1).engines["llama"].sample.config
    assert config is not None and config.engine == "vLLM"
    labels = dict(config.published)
    # the whole log: its start-up lines lie far above a tail once the session's other tests have sent traffic
    logged = re.search(r"KV cache size: ([\d,]+) tokens",
                       vllm_server.launched.log_path.read_text(errors="replace"))
    assert logged is not None
    pool = int(logged.group(1).replace(",", ""))
    assert config.kv_pool_tokens == int(labels["kv_cache_size_tokens"]) == pool
    models = httpx.get(f"{vllm_server.url}/v1/models", timeout=5).json()
    assert config.context_tokens == models["data"][0]["max_model_len"] == 2048
    assert config.prefix_caching is True and config.block_size == BLOCK and config.spec_type == "off"
    assert config.version == httpx.get(f"{vllm_server.url}/version", timeout=5).json()["version"]
    assert config.argv and "--max-model-len" in config.argv  # a local engine: its command line, read
    # the names it answers to (--served-model-name), in the facts line beside dtype and version
    assert config.served_names == tuple(m["id"] for m in models["data"]) == ("enginetop-tiny-llama",)
    assert "served as enginetop-tiny-llama" in config.facts() and f"vLLM {config.version}" in config.facts()
    snap = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--engine",
                           f"v={vllm_server.url}", "--interval", "0.3"], capture_output=True, text=True,
                          timeout=60)
    assert snap.returncode == 0, snap.stderr
    shown = orjson.loads(snap.stdout)["engines"]["v"]["config"]
    assert shown["served_names"] == ["enginetop-tiny-llama"]
    assert "served as enginetop-tiny-llama" in shown["facts"]
    engine = bench(vllm_server.url, tmp_path)
    ids = {f["id"]: f for f in engine["findings"]}
    show("configuration (prefix cache on)", engine["config"]["summary"])
    show("KV pool: shown, cache_config_info, logged",
         [config.kv_pool_tokens, labels["kv_cache_size_tokens"], pool])
    for f in ids.values():
        show("finding", f)
    assert not [i for i in ids if i.startswith("prefix")], ids
    assert "context-below-pool" not in ids  # a pool larger than one request's context is vLLM's design
    assert engine["config"]["kv_pool_tokens"] == config.kv_pool_tokens
    reply = httpx.post(f"{vllm_server.url}/v1/completions", timeout=30, json={
        "model": models["data"][0]["id"], "prompt": "hello " * 3000, "max_tokens": 4})
    words = reply.json()["error"]["message"]
    assert reply.status_code == 400 and refused_for_length(400, words) is not None, words
    assert refused_tokens(words) is not None and refused_tokens(words) > 2048, words


# The Gemma vLLM below is started with secrets in spellings its parser takes: --api-key as a prefix with two
# keys, --hf-token with `_` and `=`. None may reach any output.
KEYS = ("sk-vllm-one-5d0e", "sk-vllm-two-a9c3")
HF_TOKEN = "hf_vllm_token_77e2"
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}


def assert_no_secret(text: str, where: str) -> None:
    leaked = [s for s in (*KEYS, HF_TOKEN) if s in text]
    assert not leaked, f"a secret of the engine's command line is in {where}"


@pytest.fixture(scope="module")
def gemma_off() -> Iterator[RunningEngine]:
    """vLLM on the demo Gemma with its prefix cache switched off and n-gram speculative decoding on, and two
    API keys and a Hugging Face token on its command line."""
    port = free_port()
    profile = dataclasses.replace(load_profiles([repo_profiles_dir()]).get("demo-vllm-gemma"), port=port)
    resolved = resolve(profile)
    assert resolved.argv is not None
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    argv = [*resolved.argv, "--no-enable-prefix-caching", "--speculative-config", spec,
            "--api-k", *KEYS, f"--hf_token={HF_TOKEN}"]
    launched = launch(argv, runs_dir() / f"test-vllm-gemma-{port}.log", env=resolved.env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_openai_ready("vLLM (Gemma, prefix cache off)", url, launched, timeout=240, api_key=KEYS[1])
        yield RunningEngine("vllm-off", url, port, launched)
    finally:
        stop_group(launched)


def test_prefix_caching_off_fires_with_the_shared_tokens_the_ids_say(gemma_off: RunningEngine,
                                                                     tmp_path: Path) -> None:
    engine = bench(gemma_off.url, tmp_path, KEYS[1])
    assert engine["config"]["prefix_caching"] is False
    [finding] = [f for f in engine["findings"] if f["id"].startswith("prefix")]
    show("configuration (prefix cache off)", engine["config"]["summary"])
    show("finding", finding)
    assert finding["id"] == "prefix-cache-off" and finding["severity"] == "warning"
    figures = finding["figures"]
    assert figures["shared_tokens"] == SHARED  # from the ids, in the order sent
    assert figures["prompt_tokens"] == sum(line["input_length"] for line in LINES)
    assert figures["cached_tokens"] == 0 and figures["prefill_s_lost"] > 0
    assert f"shared {SHARED:,} of" in finding["title"] and "--enable-prefix-caching" in finding["suggestion"]


def test_vllm_ngram_speculation_read_per_draft_position(gemma_off: RunningEngine) -> None:
    prompt = "1, 2, 3, 4, " * 12
    for _ in range(2):
        reply = httpx.post(f"{gemma_off.url}/v1/completions", timeout=120, headers=AUTH, json={
            "model": "gemma-3-270m", "prompt": prompt, "max_tokens": 48, "temperature": 0})
        assert reply.status_code == 200, reply.text
    counters = {}
    for line in httpx.get(f"{gemma_off.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            position = re.search(r'position="(\d+)"', name)
            key = f"pos{position.group(1)}" if position else name.split("{")[0]
            counters[key] = float(value)
    drafts = counters["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0
    state = read_store(gemma_off.url, api_key=KEYS[1]).engines["llama"]
    assert state.stats.spec_accept_per_pos_total == tuple(counters[f"pos{k}"] / drafts for k in range(3))
    accepted = counters["vllm:spec_decode_num_accepted_tokens_total"]
    assert state.stats.spec_accept_rate_total == pytest.approx(
        accepted / counters["vllm:spec_decode_num_draft_tokens_total"])
    config = state.sample.config
    assert (config.spec_type, config.spec_n_max, config.prefix_caching) == ("ngram", 3, False)


def test_a_vllm_started_with_secrets_shows_its_command_line_without_them(gemma_off: RunningEngine,
                                                                        tmp_path: Path) -> None:
    """`vllm ... --api-k KEY1 KEY2 --hf_token=TOKEN`: the configuration keeps the command line, masked in
    every spelling, in the snapshot (JSON and text) and the engine's column."""
    (tmp_path / "key").write_text(KEYS[1] + "\n")
    target = ["--engine", f"vllm={gemma_off.url}", "--api-key-file", f"vllm={tmp_path / 'key'}"]
    shown = []
    snapshot: dict = {}
    for form in (["--json"], []):
        out = subprocess.run([sys.executable, "-m", "tui", "snapshot", *target, "--interval", "0.5", *form],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        shown.append(out.stdout + out.stderr)
        snapshot = snapshot or orjson.loads(out.stdout)
    config = snapshot["engines"]["vllm"]["config"]
    show("vLLM's argv as shown", config["argv"])
    assert config["argv"][config["argv"].index("--api-k") + 1:][:2] == ["***", "***"]
    assert "--hf_token=***" in config["argv"] and "--no-enable-prefix-caching" in config["argv"]
    state = read_store(gemma_off.url, polls=1, api_key=KEYS[1]).engines["llama"]
    shown.append(render_engine(state, width=200).plain)
    for text in shown:
        assert_no_secret(text, "the snapshot or the engine's column")
