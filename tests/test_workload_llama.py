"""A workload with shared prefixes, replayed on the real llama-server: prompts made in its own tokens from the
hash ids, exact output lengths, and the cached tokens it reports follow the ids."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from tui.base.process import free_port
from tui.cli.main import main
from tui.model.slo import Slo
from tui.model.targets import EngineTarget
from tui.net.listen import Listen
from tui.proxy.options import ProxyOptions, build_proxy
from tui.workload.bench import Bench, summarize
from tui.workload.formats import load_workload
from tui.workload.schedule import plan

pytestmark = pytest.mark.engine

LINES = [  # one agent session whose turns extend the last (full 16-token blocks), and a stranger
    {"timestamp": 0, "input_length": 32, "output_length": 8, "hash_ids": [0, 1], "session_id": "s"},
    {"input_length": 48, "output_length": 8, "hash_ids": [0, 1, 2], "session_id": "s", "delay": 100},
    {"input_length": 64, "output_length": 8, "hash_ids": [0, 1, 2, 3], "session_id": "s", "delay": 100},
    {"timestamp": 50, "input_length": 40, "output_length": 6},
]


async def test_a_trace_with_shared_prefixes_replays_with_the_cache_following_the_ids(llama_server, tmp_path):
    trace = tmp_path / "agent.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LINES))
    (tmp_path / "agent.jsonl.meta.json").write_bytes(orjson.dumps({"block_size": 16, "tokenizer": "llama"}))
    workload = load_workload(trace)
    assert workload.kind == "enginetop" and workload.block_size == 16
    bench = Bench(EngineTarget("llama", llama_server.url), plan(workload, "trace"), block_size=16)
    run = await bench.go()
    summary = summarize(run, Slo.parse("ttft:30000"))
    assert summary.ok == 4 and summary.wrong_length == 0 and summary.attainment == 1.0
    by_line = {p.request.line: r for p, r in run.results}
    assert [by_line[n].prompt_tokens for n in (1, 2, 3, 4)] == [32, 48, 64, 40]  # exact, the BOS counted
    assert [by_line[n].completion_tokens for n in (1, 2, 3, 4)] == [8, 8, 8, 6]
    cached = [by_line[n].cached_tokens for n in (1, 2, 3, 4)]
    # each turn is served from the cache up to (nearly) the previous turn's end; the stranger from nothing
    assert cached[1] >= 24 and cached[2] >= 40 and cached[3] <= 1, cached
    assert summary.cached_share is not None and summary.cached_share > 0.3


async def test_a_captured_agent_conversation_replays_with_the_cache_it_had(llama_server, tmp_path):
    """Capture an agent's conversation through the proxy, replay its trace with `enginetop bench`: the same
    prompt lengths, the asked output lengths, and cached tokens that follow the capture's, less what only the
    real conversation could share (the replies the engine gave, which a replay's own replies are not)."""
    trace = tmp_path / "agent.jsonl"
    options = ProxyOptions({"llama": Listen("127.0.0.1", free_port())}, trace=trace, block_size=16,
                           key_file=tmp_path / "trace-key")
    proxy = build_proxy(options, [EngineTarget("llama", llama_server.url)])
    await proxy.start()
    messages = [{"role": "system", "content": "You plan trips for a travel agency, briefly. " * 4},
                {"role": "user", "content": "Plan a day in Lisbon."}]
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for turn in range(4):
                body = {"messages": messages, "max_tokens": 12, "temperature": 0}
                via = proxy.routes[0].proxy_url + "/v1/chat/completions"
                reply = (await client.post(via, json=body)).json()["choices"][0]["message"]["content"]
                messages = [*messages, {"role": "assistant", "content": reply},
                            {"role": "user", "content": f"Now day {turn + 2}, in another town."}]
    finally:
        await proxy.stop()
    captured = proxy.books["llama"].recent()
    out = tmp_path / "replay.json"
    code = await asyncio.to_thread(main, ["bench", str(trace), "--engine", f"llama={llama_server.url}",
                                          "--speed", "10", "-o", str(out)])
    assert code == 0
    replayed = orjson.loads(out.read_bytes())["engines"][0]["per_request"]
    assert [r["prompt_tokens"] for r in replayed] == [c.prompt_tokens for c in captured]
    assert all(r["completion_tokens"] == r["asked_tokens"] == 12 for r in replayed)
    pairs = [(c.cached_tokens, r["cached_tokens"]) for c, r in zip(captured, replayed, strict=True)]
    # the first turn shares nothing with what ran before it (another trace's ids make other text); each later
    # turn is served from the cache as far as in the capture, short of at most the reply and a block
    assert pairs[0][1] <= 16, pairs
    assert all(c is not None and c > 60 and c - 12 - 16 <= r <= c for c, r in pairs[1:]), pairs


def test_profiles_take_turns_through_the_safe_switch(tmp_path, capsys):
    trace = tmp_path / "agent.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LINES))
    (tmp_path / "agent.jsonl.meta.json").write_bytes(orjson.dumps({"block_size": 16, "tokenizer": "llama"}))
    out = tmp_path / "r.json"
    code = main(["bench", str(trace), "--profile", "demo-cpu-threads1", "--profile", "demo-cpu-threads2",
                 "--speed", "4", "--slo", "ttft:30000", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    engines = orjson.loads(out.read_bytes())["engines"]
    assert [e["engine"] for e in engines] == ["demo-cpu-threads1", "demo-cpu-threads2"]
    for engine in engines:
        assert engine["ok"] == 4 and engine["wrong_length"] == 0 and engine["attainment"] == 1.0
        steps = " ".join(engine["switch_steps"])
        assert "ready" in steps and engine["start_error"] is None, steps
        assert engine["cached_share"] > 0.3  # the ids' sharing, on each engine
    assert err.count("starting through the safe switch") == 2
    with pytest.raises(httpx.ConnectError):  # the last one is stopped too
        httpx.get("http://127.0.0.1:8090/health", timeout=2)
    assert main(["bench", str(trace), "--profile", "no-such-profile"]) == 2
    assert "no-such-profile" in capsys.readouterr().err
