"""`--workers N`: a bench's plan split over worker processes, each request sent by exactly one of them at its
planned moment, the results merged into the same run as one process makes; on the loopback engine (every
request it got is seen) and on the real llama-server (a multi-turn workload: the same sessions, in the same
order, with the same tokens and cached tokens as one process). A closed loop's bound holds over the workers,
the peak in flight is measured, and a worker that dies or fails to start ends the run (or its start) within
seconds, named, with every result received kept and no reply thread left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.sse_server import Scenario, SSEServer
from tui.cli.main import main
from tui.model.targets import EngineTarget
from tui.model.workload import WorkloadRequest
from tui.probe.results import ProbeResult
from tui.workload.bench import mean_in_flight, summarize
from tui.workload.dealing import peak_in_flight, shares, split
from tui.workload.schedule import Planned
from tui.workload.workers import WorkerBench, WorkerPool, parse_workers


def test_split_keeps_each_session_on_one_worker_in_order_and_sends_everything_once() -> None:
    reqs = [WorkloadRequest(line=i) for i in range(10)]
    planned = [Planned(0, reqs[0], 0.0), Planned(1, reqs[1], 0.1), Planned(2, reqs[2], None, after=0),
               Planned(3, reqs[3], 0.2), Planned(4, reqs[4], None, after=2),
               Planned(5, reqs[5], None, after=1), Planned(6, reqs[6], 0.3)]
    parts = split(planned, [1, 1, 1])
    assert sorted(p.index for part in parts for p in part) == list(range(7))
    where = {p.index: k for k, part in enumerate(parts) for p in part}
    assert where[0] == where[2] == where[4] and where[1] == where[5]  # each session on one worker
    for part in parts:
        assert [p.index for p in part] == sorted(p.index for p in part)  # turns in plan order
    # by requests: session 0 (three), session 1 (two), request 3, then 6 to the worker with the fewest
    assert [len(part) for part in parts] == [3, 2, 2]
    assert parse_workers("2") == 2 and parse_workers("auto") >= 1
    with pytest.raises(ValueError, match="at least 1"):
        parse_workers("0")


def test_split_deals_requests_in_proportion_to_each_workers_share_of_the_bound() -> None:
    """A closed loop's worker sends at the pace of its share: 2 + 1 gets two thirds and one third, dealt so
    that the plan's first requests fill every place at once (0, 1 to the 2-slot worker, 2 to the other)."""
    def lone(n: int) -> list[Planned]:
        return [Planned(i, WorkloadRequest(line=i), None) for i in range(n)]

    two, one = split(lone(12), [2, 1])
    assert [p.index for p in two] == [0, 1, 3, 4, 6, 7, 9, 10] and [p.index for p in one] == [2, 5, 8, 11]
    assert [len(part) for part in split(lone(60), [3, 2])] == [36, 24]
    assert [len(part) for part in split(lone(12), [1, 1])] == [6, 6]


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


# ---------------------------------------------------- the bound, the peak, a death, a failed start


def _chats(n: int, *, tokens: int = 4, every_s: float | None = None) -> list[Planned]:
    """n lone chat requests: a closed loop (every_s None) or one every `every_s` seconds."""
    return [Planned(i, WorkloadRequest(line=i + 1, prompt=f"count to {i % 7 + 3}, please",
                                       output_length=tokens), None if every_s is None else i * every_s)
            for i in range(n)]


def _reply_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bench worker replies" and t.is_alive()]


def test_a_bound_is_split_into_parts_of_at_least_one_that_sum_to_it() -> None:
    assert shares(None, 3) == [None, None, None]
    assert shares(2, 4) == [1, 1]  # two of the four workers send: a share of 0 would be no bound at all
    assert shares(1, 2) == [1]
    assert shares(5, 2) == [3, 2] and shares(4, 4) == [1, 1, 1, 1]
    for c in range(1, 9):
        for n in range(1, 6):
            parts = shares(c, n)
            assert sum(p or 0 for p in parts) == c and all(p is not None and p >= 1 for p in parts)
    with pytest.raises(ValueError, match="at least 1"):
        shares(0, 2)


def _result(index: int, sent: float, ended: float) -> ProbeResult:
    return ProbeResult(engine="e", url="u", workload="bench", index=index, wall_start=0.0, sent_at=sent,
                       ended_at=ended, status=200, completion_tokens=4)


class _QuietPool:
    """A pool whose workers never run: the replies are put on the bench's queue by the test."""

    n = 2
    lost: str | None = None

    def send(self, k: int, command: tuple[Any, ...]) -> None:
        pass

    def exited(self) -> dict[int, tuple[int | None, int]]:
        return {}


async def test_the_peak_in_flight_is_measured_from_the_results_not_summed_from_the_workers_reports() -> None:
    """Each worker reported one request out, a moment apart: summed, two; the results say the second went out
    as the first came back, so there never were two at once."""
    assert peak_in_flight([_result(0, 10.0, 11.0), _result(1, 11.0, 12.0)]) == 1  # [sent, ended)
    assert peak_in_flight([_result(0, 10.0, 11.0), _result(1, 10.5, 12.0), _result(2, 10.9, 10.95)]) == 3
    # the time-weighted mean beside it: two out for 1 s of the 2 s, one for the other
    assert mean_in_flight([_result(0, 10.0, 12.0), _result(1, 10.5, 11.5)]) == pytest.approx(1.5)
    assert mean_in_flight([]) is None
    bench = WorkerBench(EngineTarget("e", "http://127.0.0.1:9"), _chats(2), _QuietPool())  # type: ignore[arg-type]
    bench._replies = asyncio.Queue()
    for item in [("status", 0, 1, 1, 0.5), ("status", 1, 1, 1, 0.1),
                 ("result", 0, 0, _result(0, 10.0, 11.0)), ("result", 1, 1, _result(1, 11.0, 12.0)),
                 ("done", 0, [], 1.0, None, None, 1, 1), ("done", 1, [], 1.0, None, None, 1, 1)]:
        bench._replies.put_nowait(item)
    await asyncio.wait_for(bench._collect(time.monotonic()), 5)
    assert len(bench.run.results) == 2 and bench.max_in_flight == 1


async def test_a_bound_smaller_than_the_workers_holds_across_them_on_loopback() -> None:
    """--concurrency 1 over 2 workers: one request out at a time, not one for the first worker and no bound
    for the second."""
    with SSEServer(default=Scenario(first_token_delay_s=0.15)) as server:
        pool = WorkerPool(2)
        try:
            bench = WorkerBench(EngineTarget("e", server.url), _chats(6), pool, concurrency=1)
            run = await asyncio.wait_for(bench.go(), 60)
        finally:
            await asyncio.to_thread(pool.close)
    assert len(run.results) == 6 and all(r.ok for _, r in run.results) and run.error is None
    assert bench.max_in_flight == 1 == peak_in_flight(r for _, r in run.results)
    assert [w["planned"] for w in run.workers] == [6]
    assert any("1 of the 2 workers sent the requests" in note for note in run.worker_notes)


def _mean_in_flight(results: list[ProbeResult]) -> float:
    """The time-weighted mean number of requests out, from the first send to the last end: the area under the
    in-flight step curve (each request's own send and end) over the run's span."""
    events = sorted((t, step) for r in results if r.sent_at is not None and r.ended_at is not None
                    for t, step in ((r.sent_at, 1), (r.ended_at, -1)))
    area, out = 0.0, 0
    for (t, step), (t_next, _) in pairwise(events):
        out += step
        area += out * (t_next - t)
    return area / (events[-1][0] - events[0][0])


@pytest.mark.parametrize(("concurrency", "planned"), [(3, [24, 12]), (5, [36, 24])])
async def test_an_uneven_bound_over_two_workers_keeps_its_whole_concurrency_for_the_whole_run_on_loopback(
        concurrency: int, planned: list[int]) -> None:
    """--concurrency 3 over 2 workers is split 2 + 1: the requests are dealt 2 : 1 too, so both workers end
    together and three are out for the whole run. Dealt half and half, the 2-slot worker ended half-way and
    the rest went at one: the peak held (3), the load did not (a time-weighted mean of 2). 5 is 3 + 2."""
    with SSEServer(default=Scenario(first_token_delay_s=0.1)) as server:
        pool = WorkerPool(2)
        try:
            bench = WorkerBench(EngineTarget("e", server.url), _chats(12 * concurrency), pool,
                                concurrency=concurrency)
            run = await asyncio.wait_for(bench.go(), 120)
        finally:
            await asyncio.to_thread(pool.close)
    results = [r for _, r in run.results]
    assert run.error is None and len(results) == 12 * concurrency and all(r.ok for r in results)
    assert bench.max_in_flight == peak_in_flight(results) == concurrency
    mean = _mean_in_flight(results)
    assert mean >= 0.87 * concurrency, f"{mean:.2f} in flight on average, of {concurrency}"
    assert summarize(run).mean_in_flight == pytest.approx(mean)
    assert [w["planned"] for w in run.workers] == planned  # in proportion to each worker's share


async def test_a_worker_that_cannot_read_its_tokenizer_fails_the_start_and_the_reply_thread_ends() -> None:
    pool = WorkerPool(2)
    try:
        bench = WorkerBench(EngineTarget("e", "http://127.0.0.1:9"), _chats(4), pool,
                            tokenizer="/no/such/tokenizer.json")
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"worker \d of 2: ValueError: --tokenizer /no/such"):
            await asyncio.wait_for(bench.ready(), 60)
        assert time.monotonic() - t0 < 60 and not _reply_threads()
    finally:
        await asyncio.to_thread(pool.close)


async def test_a_worker_killed_before_it_is_ready_fails_the_start_within_seconds() -> None:
    pool = WorkerPool(2)
    try:
        await asyncio.to_thread(pool.start)
        victim = pool.processes[1]
        os.kill(victim.pid or 0, signal.SIGKILL)
        await asyncio.to_thread(victim.join, 10)
        bench = WorkerBench(EngineTarget("e", "http://127.0.0.1:9"), _chats(4), pool)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"worker 2 of 2 \(PID {victim.pid}\) was killed by SIGKILL "
                                               "before it was ready"):
            await asyncio.wait_for(bench.ready(), 30)
        assert time.monotonic() - t0 < 5 and not _reply_threads()
        # a capacity search's next level on the same pool
        with pytest.raises(RuntimeError, match="cannot be used again: worker 2 of 2"):
            await WorkerBench(EngineTarget("e", "http://127.0.0.1:9"), _chats(4), pool).ready()
    finally:
        t0 = time.monotonic()
        await asyncio.to_thread(pool.close)
    assert time.monotonic() - t0 < 10


_KILLED = "worker 2 of 2 (PID {pid}) was killed by SIGKILL; its unsent requests are not measured"


async def _kill_one_mid_run(url: str, planned: list[Planned], after: int) -> tuple[Any, ...]:
    """Two workers send `planned`; worker 2 is killed with SIGKILL once `after` results came back. What the
    run kept, what had come back at the kill, the victim's PID, and the seconds from the kill to the end."""
    pool = WorkerPool(2)
    kill: dict[str, Any] = {}

    def on_result(_name: str, _p: Planned, _r: ProbeResult) -> None:
        if len(bench.run.results) >= after and not kill:
            kill.update(pid=pool.processes[1].pid, at=time.monotonic(), received=len(bench.run.results))
            os.kill(kill["pid"], signal.SIGKILL)

    bench = WorkerBench(EngineTarget("e", url), planned, pool, on_result=on_result)
    try:
        run = await asyncio.wait_for(bench.go(), 90)
        ended = time.monotonic()
        assert not _reply_threads()
    finally:
        await asyncio.to_thread(pool.close)
    assert kill, "the run ended before the kill"
    return run, kill["received"], kill["pid"], ended - kill["at"]


async def test_a_worker_killed_mid_run_ends_the_run_within_seconds_named_with_every_result_kept() -> None:
    with SSEServer(default=Scenario(first_token_delay_s=0.05, per_token_delay_s=0.02)) as server:
        planned = _chats(60, tokens=4, every_s=0.1)  # 6 s of plan: the kill comes about a second in
        run, received, pid, took = await _kill_one_mid_run(server.url, planned, after=8)
    assert took < 5, f"the run went on {took:.1f} s after a worker died"
    assert run.error == _KILLED.format(pid=pid)
    assert run.workers[1]["error"] == run.error and run.workers[0]["error"] is None
    assert received <= len(run.results) < 60
    assert all(r.ok and r.completion_tokens == 4 for _, r in run.results)
    assert len({p.index for p, _ in run.results}) == len(run.results)


@pytest.mark.engine
@pytest.mark.parametrize("workers", [2, 3])
async def test_a_closed_loop_bound_of_two_holds_over_the_workers_on_the_real_llama_server(
        llama_server, workers: int) -> None:
    """--concurrency 2 on the 4-slot engine: at most two requests out at once over the workers, and two while
    the plan has more to send, measured from the results' own send and end times (3 workers: one sits out)."""
    pool = WorkerPool(workers)
    try:
        bench = WorkerBench(EngineTarget("llama", llama_server.url), _chats(8, tokens=8), pool, concurrency=2)
        run = await asyncio.wait_for(bench.go(), 120)
    finally:
        await asyncio.to_thread(pool.close)
    assert run.error is None and len(run.results) == 8
    assert all(r.ok and r.completion_tokens == 8 for _, r in run.results)
    assert bench.max_in_flight == peak_in_flight(r for _, r in run.results) == 2
    assert len(run.workers) == 2 and all(w["sent"] == 4 for w in run.workers)
    assert bool(run.worker_notes) == (workers > 2)


@pytest.mark.engine
async def test_a_worker_killed_mid_run_on_the_real_llama_server_ends_the_run_named_keeping_its_results(
        llama_server) -> None:
    planned = _chats(40, tokens=6, every_s=0.1)  # 4 s of small requests; the kill after the first three
    run, received, pid, took = await _kill_one_mid_run(llama_server.url, planned, after=3)
    assert took < 5, f"the run went on {took:.1f} s after a worker died"
    assert run.error == _KILLED.format(pid=pid)
    assert 3 <= received <= len(run.results) < 40
    assert all(r.ok and r.completion_tokens == 6 and r.sent_at is not None for _, r in run.results)
