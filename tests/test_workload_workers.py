"""`--workers N`: a bench's plan split over worker processes, each request sent by exactly one of them at its
planned moment, the results merged into the same run as one process makes; on the loopback engine (every
request it got is seen) and on the real llama-server (a multi-turn workload: the same sessions, in the same
order, with the same tokens and cached tokens as one process)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.sse_server import SSEServer
from tui.cli.main import main
from tui.model.workload import WorkloadRequest
from tui.workload.schedule import Planned
from tui.workload.workers import parse_workers, split


def test_split_keeps_each_session_on_one_worker_in_order_and_sends_everything_once() -> None:
    reqs = [WorkloadRequest(line=i) for i in range(10)]
    planned = [Planned(0, reqs[0], 0.0), Planned(1, reqs[1], 0.1), Planned(2, reqs[2], None, after=0),
               Planned(3, reqs[3], 0.2), Planned(4, reqs[4], None, after=2),
               Planned(5, reqs[5], None, after=1), Planned(6, reqs[6], 0.3)]
    parts = split(planned, 3)
    assert sorted(p.index for part in parts for p in part) == list(range(7))
    where = {p.index: k for k, part in enumerate(parts) for p in part}
    assert where[0] == where[2] == where[4] and where[1] == where[5]  # each session on one worker
    for part in parts:
        assert [p.index for p in part] == sorted(p.index for p in part)  # turns in plan order
    assert [len(part) for part in parts] == [4, 2, 1]  # dealt in turn: sessions 0 and 1, request 3, then 6
    assert parse_workers("2") == 2 and parse_workers("auto") >= 1
    with pytest.raises(ValueError, match="at least 1"):
        parse_workers("0")


def _workload(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join(orjson.dumps({"prompt": f"question number {i} " * (1 + i % 5),
                                          "output_tokens": 4 + i % 3}).decode() + "\n" for i in range(n)))
    return path


def _bench(tmp_path: Path, url: str, workers: int, *extra: str) -> dict:
    out = tmp_path / f"r{workers}.json"
    code = main(["bench", f"vllm-custom:{_workload(tmp_path, 300)}", "--engine", f"e={url}", "--rate", "100",
                 "--arrival", "constant", "--workers", str(workers), "-o", str(out), *extra])
    assert code == 0
    return orjson.loads(out.read_bytes())["engines"][0]


def test_two_workers_send_every_planned_request_once_and_merge_what_one_process_measures(
        tmp_path: Path) -> None:
    with SSEServer() as server:
        alone = _bench(tmp_path, server.url, 1)
        sent_alone = [r.body["messages"][0]["content"] for r in server.requests if r.body]
        server.requests.clear()
        split_run = _bench(tmp_path, server.url, 2)
        sent_split = [r.body["messages"][0]["content"] for r in server.requests if r.body]
    # every planned request sent exactly once, by one of the workers
    assert sorted(sent_split) == sorted(sent_alone) and len(sent_split) == len(set(sent_split)) == 300
    assert [r["index"] for r in split_run["per_request"]] == list(range(300))

    def measured(engine: dict) -> list[tuple]:
        return [(r["index"], r["ok"], r["prompt_tokens"], r["completion_tokens"], r["asked_tokens"])
                for r in engine["per_request"]]

    assert measured(split_run) == measured(alone)
    assert split_run["ok"] == alone["ok"] == 300 and split_run["wrong_length"] == 0
    workers = split_run["workers"]
    assert [w["worker"] for w in workers] == [0, 1] and sum(w["planned"] for w in workers) == 300
    assert all(w["sent"] == w["planned"] and w["client"] is not None for w in workers)
    assert split_run["lateness_s"]["p99"] is not None and len(alone.get("workers") or []) == 0


@pytest.mark.engine
def test_a_multi_turn_workload_over_two_workers_matches_one_on_the_real_llama_server(llama_server,
                                                                                    tmp_path: Path) -> None:
    """Three agent sessions of three turns (shared prefixes by their hash ids): split over two workers, each
    session stays on one and keeps its order, and the engine counts the same prompt, output and cached
    tokens as when one process sent them."""
    lines = []
    for s in range(3):
        for turn in range(3):
            ids = [100 * s + k for k in range(turn + 2)]
            lines.append({"timestamp": 40 * s, "input_length": 16 * len(ids), "output_length": 4,
                          "hash_ids": ids, "session_id": f"s{s}", **({"delay": 10} if turn else {})})
    runs = {}
    for workers in (1, 2):
        # the same trace under two names: prompts are drawn with the file's name, so the second run finds none
        # of the first run's prompts in the engine's slots
        trace = tmp_path / f"agents-{workers}.jsonl"
        trace.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
        meta = orjson.dumps({"block_size": 16, "tokenizer": "x"})
        trace.with_name(trace.name + ".meta.json").write_bytes(meta)
        out = tmp_path / f"w{workers}.json"
        assert main(["bench", str(trace), "--engine", f"llama={llama_server.url}", "--workers", str(workers),
                     "-o", str(out)]) == 0
        runs[workers] = orjson.loads(out.read_bytes())["engines"][0]

    def sessions(engine: dict) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {}
        for r in sorted(engine["per_request"], key=lambda r: r["index"]):
            out.setdefault(r["session"], []).append(
                (r["line"], r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]))
        return out

    assert runs[2]["ok"] == runs[1]["ok"] == 9
    one, two = sessions(runs[1]), sessions(runs[2])
    assert one.keys() == two.keys() == {"s0", "s1", "s2"}
    for name in one:
        # a session's first turn shares nothing but the BOS with what a slot held (which slot: the engine's
        # choice); every later turn finds its earlier turns' tokens, the same number however it was sent
        assert [t[:3] for t in two[name]] == [t[:3] for t in one[name]]
        assert [t[3] for t in two[name][1:]] == [t[3] for t in one[name][1:]]
        assert one[name][0][3] <= 1 and two[name][0][3] <= 1
    assert [w["planned"] for w in runs[2]["workers"]] in ([6, 3], [3, 6])  # whole sessions
