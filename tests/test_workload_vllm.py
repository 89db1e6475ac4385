"""Workloads on the real vLLM (CPU, its prefix cache in blocks of 128 tokens): a trace with shared prefixes
replayed in vLLM's own tokens, the cached tokens it reports following the ids; and an agent conversation
captured through the proxy, replayed with the cache it had."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from tests.test_proxy_llama import proxy_options
from tui.cli.main import main
from tui.model.targets import EngineTarget
from tui.proxy.options import build_proxy
from tui.workload.bench import Bench, summarize
from tui.workload.formats import load_workload
from tui.workload.schedule import plan

BLOCK = 128  # vLLM's KV block on this CPU build: the unit its prefix cache shares
LINES = [  # one agent session whose turns extend the last by whole blocks, and a stranger
    {"timestamp": 0, "input_length": 256, "output_length": 8, "hash_ids": [0, 1], "session_id": "s"},
    {"input_length": 384, "output_length": 8, "hash_ids": [0, 1, 2], "session_id": "s", "delay": 50},
    {"input_length": 512, "output_length": 8, "hash_ids": [0, 1, 2, 3], "session_id": "s", "delay": 50},
    {"timestamp": 30, "input_length": 300, "output_length": 6},
]


async def test_a_trace_with_shared_prefixes_replays_on_vllm_with_the_cache_following_the_ids(vllm_server,
                                                                                           tmp_path):
    trace = tmp_path / "agent.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LINES))
    (tmp_path / "agent.jsonl.meta.json").write_bytes(orjson.dumps({"block_size": BLOCK, "tokenizer": "x"}))
    workload = load_workload(trace)
    bench = Bench(EngineTarget("vllm", vllm_server.url), plan(workload, "trace"), block_size=BLOCK,
                  prompt_seed=workload.prompt_seed)
    run = await bench.go()
    summary = summarize(run)
    assert summary.ok == 4 and summary.wrong_length == 0, summary
    by_line = {p.request.line: r for p, r in run.results}
    assert [by_line[n].prompt_tokens for n in (1, 2, 3, 4)] == [256, 384, 512, 300]  # exact lengths
    assert [by_line[n].completion_tokens for n in (1, 2, 3, 4)] == [8, 8, 8, 6]  # min_tokens + ignore_eos
    # block by block: each turn finds the blocks of the turn before it, the stranger none
    assert [by_line[n].cached_tokens for n in (2, 3, 4)] == [256, 384, 0]


async def test_a_captured_conversation_replays_on_vllm_with_the_cache_it_had(vllm_server, tmp_path):
    trace = tmp_path / "chat.jsonl"
    proxy = build_proxy(proxy_options("vllm", tmp_path, trace=trace, block_size=BLOCK),
                        [EngineTarget("vllm", vllm_server.url)])
    await proxy.start()
    messages = [{"role": "system", "content": "You are a careful planner of long train journeys. " * 30},
                {"role": "user", "content": "Plan Lisbon to Porto."}]
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for turn in range(3):
                body = {"messages": messages, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
                via = proxy.routes[0].proxy_url + "/v1/chat/completions"
                reply = (await client.post(via, json=body)).json()["choices"][0]["message"]["content"]
                messages = [*messages, {"role": "assistant", "content": reply},
                            {"role": "user", "content": f"Then leg {turn + 2}, " + "with a stop. " * 60}]
    finally:
        await proxy.stop()
    captured = proxy.books["vllm"].recent()
    out = tmp_path / "replay.json"
    code = await asyncio.to_thread(main, ["bench", str(trace), "--engine", f"vllm={vllm_server.url}",
                                          "--speed", "10", "-o", str(out)])
    assert code == 0
    replayed = orjson.loads(out.read_bytes())["engines"][0]["per_request"]
    assert [r["prompt_tokens"] for r in replayed] == [c.prompt_tokens for c in captured]
    pairs = [(c.cached_tokens, r["cached_tokens"]) for c, r in zip(captured, replayed, strict=True)]
    # the same whole blocks, short of at most the one a real reply filled (a replay's own reply differs)
    assert all(c is not None and c >= BLOCK for c, _ in pairs[1:]), pairs
    assert all(c - BLOCK <= r <= c for c, r in pairs[1:]), pairs
