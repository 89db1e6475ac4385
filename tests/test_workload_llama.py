"""A workload with shared prefixes, replayed on the real llama-server: prompts made in its own tokens from the
hash ids, exact output lengths, and the cached tokens it reports follow the ids."""

from __future__ import annotations

import orjson
import pytest

from tui.model.slo import Slo
from tui.model.targets import EngineTarget
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
    assert [by_line[n].prompt_tokens for n in (1, 2, 3, 4)] == [33, 49, 65, 41]  # + BOS: exact lengths
    assert [by_line[n].completion_tokens for n in (1, 2, 3, 4)] == [8, 8, 8, 6]
    cached = [by_line[n].cached_tokens for n in (1, 2, 3, 4)]
    # each turn is served from the cache up to (nearly) the previous turn's end; the stranger from nothing
    assert cached[1] >= 24 and cached[2] >= 40 and cached[3] <= 1, cached
    assert summary.cached_share is not None and summary.cached_share > 0.3
