"""`--workers N`: one engine's part of a bench or capacity run sent by N worker processes, as AIPerf spreads
its load, so that a deployment faster than one Python process can feed is measured, not the client.

The plan is made once, in the parent, and split so that each request is sent by exactly one worker: a
session's turns (linked by `after`) go to one worker, in order; the other requests are dealt in turn. Every
worker prepares its prompts (the engine's one-token words, or the --tokenizer's), says it is ready, and all of
them start on one clock: the parent picks a moment of time.monotonic(), which is the same clock in every
process of the machine, and each worker sends its requests at that moment plus their planned offsets. Each
result comes back as it ends, so the parent's run (WorkerBench.run) fills as it would in one process: the
live view, the capacity search's early stop and the result file read it unchanged.

Ctrl-C, or an engine that stops answering in one worker, stops them all: each sends back what it measured,
so nothing measured is lost. Each worker measures its own lateness, CPU share and event-loop lag; a worker
that could not keep up is named in the run's notes. Workers ignore SIGINT (the parent stops them) and the
pool is shut down with the part (a capacity search keeps one pool for all its levels).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.context import SpawnProcess
from typing import Any

from tui.base.stats import median, quantile
from tui.model.targets import EngineTarget
from tui.net.loop import run_loop
from tui.probe.client import ProbeLimits
from tui.probe.results import ProbeResult
from tui.probe.sweep import ClientLoad
from tui.workload.bench import Bench, EngineRun
from tui.workload.prompts import PromptMaker
from tui.workload.schedule import Planned
from tui.workload.tokenizer import load_tokenizer

FRESH_PER_WORKER = 10_000_000  # fresh-text numbers each worker may draw before the next worker's begin
STATUS_S = 0.25  # how often a worker says how many requests it has out
START_MARGIN_S = 0.2  # between the go and the shared start: every worker has the moment before it comes
STOP_WAIT_S = 15.0  # a stopped worker's last results, then it is terminated
READY_WAIT_S = 120.0


def make_bench(target: EngineTarget, planned: list[Planned], pool: WorkerPool | None, *,
               tokenizer: str | None = None, prompts: PromptMaker | None = None,
               **kwargs: Any) -> Bench | WorkerBench:
    """One process's Bench, or the pool's WorkerBench when there is a pool (--workers N, N > 1)."""
    if pool is None:
        # the tokenizer only makes prompts: a capacity level that is handed the last level's needs none
        return Bench(target, planned, prompts=prompts,
                     tokenizer=load_tokenizer(tokenizer) if tokenizer and prompts is None else None, **kwargs)
    return WorkerBench(target, planned, pool, tokenizer=tokenizer, **kwargs)


def parse_workers(text: str) -> int:
    """`--workers N` or `auto` (one per core this process may run on)."""
    if text == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, cores)
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--workers {text!r}: expected a number of processes or auto") from None
    if n < 1:
        raise ValueError(f"--workers must be at least 1, got {n}")
    return n


def split(planned: list[Planned], n: int) -> list[list[Planned]]:
    """Each planned request to exactly one of n workers: a session's turns together, in plan order; sessions
    and lone requests dealt out in turn, by their first request's place in the plan."""
    by_index = {p.index: p for p in planned}
    root: dict[int, int] = {}
    for p in sorted(planned, key=lambda p: p.index):
        root[p.index] = root.get(p.after, p.after) if p.after is not None and p.after in by_index else p.index
    groups: dict[int, list[Planned]] = {}
    for p in sorted(planned, key=lambda p: p.index):
        groups.setdefault(root[p.index], []).append(p)
    parts: list[list[Planned]] = [[] for _ in range(n)]
    for k, key in enumerate(sorted(groups)):
        parts[k % n].extend(groups[key])
    return parts


@dataclass(frozen=True)
class Options:
    """What a worker needs to send its share: the engine and how the bench was asked to run."""

    target: EngineTarget
    model: str | None
    block_size: int | None
    limits: ProbeLimits | None
    prompt_seed: str
    tokenizer: str | None  # the --tokenizer spec: each worker reads it itself
    concurrency: int | None  # this worker's share of a closed loop


@dataclass
class WorkerStats:
    """One worker's share of a run, as it measured it."""

    worker: int
    planned: int
    sent: int = 0
    lateness_s: list[float] = field(default_factory=list)
    client: ClientLoad | None = None
    error: str | None = None

    def json(self) -> dict[str, Any]:
        late = sorted(self.lateness_s)
        p50, p99 = median(late), quantile(late, 0.99)
        return {"worker": self.worker, "planned": self.planned, "sent": self.sent,
                "lateness_p50_ms": None if p50 is None else p50 * 1000,
                "lateness_p99_ms": None if p99 is None else p99 * 1000,
                "client": self.client.to_json() if self.client is not None else None, "error": self.error}


# ---------------------------------------------------------------- the worker process


def worker_main(worker: int, commands: Any, replies: Any) -> None:
    """A worker process: it takes a share of the plan at a time, prepares it, sends it on the shared clock,
    and streams every result back, until told to quit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops us and keeps our results
    run_loop(_serve(worker, commands, replies))


async def _serve(worker: int, commands: Any, replies: Any) -> None:
    loop = asyncio.get_running_loop()
    prompts: PromptMaker | None = None
    tokenizer: Any = None
    while True:
        command = await loop.run_in_executor(None, commands.get)
        if command[0] == "quit":
            return
        if command[0] != "run":
            continue  # a stop or cancel for a share that already ended
        _, planned, options = command
        if options.tokenizer and tokenizer is None:
            tokenizer = load_tokenizer(options.tokenizer)
        bench = Bench(options.target, planned, concurrency=options.concurrency, model=options.model,
                      block_size=options.block_size, limits=options.limits, prompts=prompts,
                      fresh_from=worker * FRESH_PER_WORKER, prompt_seed=options.prompt_seed,
                      tokenizer=tokenizer,
                      on_result=lambda _name, p, r: replies.put(("result", worker, p.index, r)))
        try:
            await bench.ready()
        except Exception as exc:  # the engine could not give its tokens: the parent says why
            replies.put(("ready", worker, f"{type(exc).__name__}: {exc}", None))
            continue
        prompts = bench.prompts
        replies.put(("ready", worker, None, bench.run.prompt_note))
        go = await loop.run_in_executor(None, commands.get)
        if go[0] != "go":
            replies.put(("done", worker, bench.run.lateness_s, 0.0, None, "not started", 0, 0))
            continue
        task = asyncio.ensure_future(bench.go(start_at=go[1]))
        status = asyncio.ensure_future(_status(worker, bench, replies))
        stop = loop.run_in_executor(None, commands.get)
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # told to stop: what is out is dropped, what ended was sent already
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        status.cancel()
        run = bench.run
        replies.put(("done", worker, run.lateness_s, run.duration_s, run.client, run.error,
                     bench.max_in_flight, bench.sent))
        if not stop.done():
            with contextlib.suppress(Exception):
                await stop  # the parent sends "stop" to every worker once all are done


async def _status(worker: int, bench: Bench, replies: Any) -> None:
    while True:
        now = time.monotonic()
        replies.put(("status", worker, bench.sent, bench.in_flight, bench.oldest_wait_s(now)))
        await asyncio.sleep(STATUS_S)


# ---------------------------------------------------------------- the parent


class WorkerPool:
    """N worker processes for one engine's part; started on first use, kept until closed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.context = multiprocessing.get_context("spawn")  # no fork of a process that runs threads
        self.commands: list[Any] = []
        self.replies: Any = None
        self.processes: list[SpawnProcess] = []
        self.start_s: float | None = None  # how long the workers took to start (the first ready)

    def start(self) -> None:
        if self.processes:
            return
        self.replies = self.context.Queue()
        for k in range(self.n):
            commands = self.context.Queue()
            process = self.context.Process(target=worker_main, args=(k, commands, self.replies),
                                           name=f"enginetop bench worker {k}", daemon=True)
            process.start()
            self.commands.append(commands)
            self.processes.append(process)

    def send(self, k: int, command: tuple[Any, ...]) -> None:
        self.commands[k].put(command)

    def close(self) -> None:
        for k in range(len(self.processes)):
            with contextlib.suppress(Exception):
                self.commands[k].put(("quit",))
        for process in self.processes:
            process.join(5.0)
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        self.processes.clear()
        self.commands.clear()


class WorkerBench:
    """Bench's interface (tui.workload.bench.Bench), its plan sent by a pool of worker processes."""

    def __init__(self, target: EngineTarget, planned: list[Planned], pool: WorkerPool, *,
                 concurrency: int | None = None, model: str | None = None, block_size: int | None = None,
                 limits: ProbeLimits | None = None, prompt_seed: str = "enginetop",
                 tokenizer: str | None = None,
                 on_result: Callable[[str, Planned, ProbeResult], None] | None = None) -> None:
        self.target = target
        self.planned = planned
        self.pool = pool
        self.concurrency = concurrency
        self.options = Options(target, model or target.model, block_size, limits, prompt_seed, tokenizer,
                               None)
        self.on_result = on_result
        self.run = EngineRun(target.name, target.url)
        self.parts = split(planned, pool.n)
        self.workers = [WorkerStats(k, len(part)) for k, part in enumerate(self.parts)]
        self.prompts = None  # each worker keeps its own
        self.max_in_flight = 0
        self._status: dict[int, tuple[int, int, float | None]] = {}  # worker -> (sent, in flight, oldest)
        self._by_index = {p.index: p for p in planned}
        self._ready = False
        self._replies: asyncio.Queue[tuple[Any, ...]] | None = None
        self._pump: threading.Thread | None = None
        self._stop_pump = threading.Event()

    @property
    def sent(self) -> int:
        return sum(s for s, _, _ in self._status.values())

    @property
    def in_flight(self) -> int:
        return sum(f for _, f, _ in self._status.values())

    def oldest_wait_s(self, now: float) -> float | None:
        waits = [w for _, _, w in self._status.values() if w is not None]
        return max(waits) if waits else None

    def _shares(self) -> list[int | None]:
        if self.concurrency is None:
            return [None] * self.pool.n
        base, extra = divmod(self.concurrency, self.pool.n)
        return [base + (k < extra) for k in range(self.pool.n)]

    async def _next(self) -> tuple[Any, ...]:
        assert self._replies is not None
        return await self._replies.get()

    def _start_pump(self) -> None:
        """Replies come on a multiprocessing queue: a thread hands them to this loop."""
        loop = asyncio.get_running_loop()
        self._replies = asyncio.Queue()
        replies = self._replies

        def pump() -> None:
            while not self._stop_pump.is_set():
                try:
                    item = self.pool.replies.get(timeout=0.1)
                except queue.Empty:
                    continue
                except (EOFError, OSError):
                    return
                loop.call_soon_threadsafe(replies.put_nowait, item)

        self._pump = threading.Thread(target=pump, name="bench worker replies", daemon=True)
        self._pump.start()

    async def ready(self) -> None:
        """Start the workers (once per pool) and have each prepare its share."""
        if self._ready:
            return
        started = time.monotonic()
        await asyncio.to_thread(self.pool.start)
        self._start_pump()
        for k, (part, share) in enumerate(zip(self.parts, self._shares(), strict=True)):
            self.pool.send(k, ("run", part, replace(self.options, concurrency=share)))
        waiting = set(range(self.pool.n))
        problems = []
        deadline = time.monotonic() + READY_WAIT_S
        while waiting:
            try:
                item = await asyncio.wait_for(self._next(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise RuntimeError(f"workers {sorted(waiting)} were not ready after {READY_WAIT_S:g} s") \
                    from None
            if item[0] != "ready":
                continue
            _, k, problem, note = item
            waiting.discard(k)
            if problem:
                problems.append(problem)
            if note:
                self.run.prompt_note = note
        if self.pool.start_s is None:
            self.pool.start_s = time.monotonic() - started
        if problems:
            for k in range(self.pool.n):
                self.pool.send(k, ("cancel",))
            raise ValueError(problems[0])
        self._ready = True

    async def go(self) -> EngineRun:
        """Prepare, then every worker sends its share from one shared moment; results as they end."""
        try:
            await self.ready()
            start_at = time.monotonic() + START_MARGIN_S
            for k in range(self.pool.n):
                self.pool.send(k, ("go", start_at))
            await self._collect(start_at)
        finally:
            self._stop_pump.set()
            if self._pump is not None:  # gone before the next share's replies come (a capacity level)
                await asyncio.to_thread(self._pump.join)
        return self.run

    async def _collect(self, start_at: float) -> None:
        done: set[int] = set()
        stopping = False
        try:
            while len(done) < self.pool.n:
                item = await self._next()
                kind, k = item[0], item[1]
                if kind == "result":
                    self._result(item[2], item[3])
                elif kind == "status":
                    self._status[k] = (item[2], item[3], item[4])
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                elif kind == "done":
                    done.add(k)
                    self._done(k, item)
                    if self.workers[k].error and not stopping:  # the engine is gone: every worker stops
                        stopping = True
                        self.run.error = self.workers[k].error
                        self._stop_all(done)
        except asyncio.CancelledError:  # Ctrl-C: every worker stops and sends what it measured
            self._stop_all(done)
            deadline = time.monotonic() + STOP_WAIT_S
            while len(done) < self.pool.n and time.monotonic() < deadline:
                try:
                    item = await asyncio.wait_for(self._next(), max(0.05, deadline - time.monotonic()))
                except TimeoutError:
                    break
                if item[0] == "result":
                    self._result(item[2], item[3])
                elif item[0] == "done":
                    done.add(item[1])
                    self._done(item[1], item)
            raise
        finally:
            self.run.duration_s = max(self.run.duration_s, time.monotonic() - start_at)
            self._stop_all(set())  # a finished worker waits for this before it takes the next share
            self._merge()

    def _stop_all(self, done: set[int]) -> None:
        for k in range(self.pool.n):
            if k not in done:
                with contextlib.suppress(Exception):
                    self.pool.send(k, ("stop",))

    def _result(self, index: int, result: ProbeResult) -> None:
        planned = self._by_index[index]
        self.run.results.append((planned, result))
        if self.on_result is not None:
            self.on_result(self.target.name, planned, result)

    def _done(self, k: int, item: tuple[Any, ...]) -> None:
        _, _, lateness, duration, client, error, most, sent = item
        stats = self.workers[k]
        stats.lateness_s, stats.client, stats.error, stats.sent = list(lateness), client, error, sent
        self.run.lateness_s.extend(lateness)
        self.run.duration_s = max(self.run.duration_s, duration)
        self.max_in_flight = max(self.max_in_flight, most)
        self._status[k] = (stats.sent, 0, None)

    def _merge(self) -> None:
        """The run's client self-check: every worker's together, and the ones that could not keep up named."""
        loads = [s.client for s in self.workers if s.client is not None]
        if not loads:
            return
        lags = [x for x in (load.loop_lag_p99_ms for load in loads) if x is not None]
        self.run.client = ClientLoad(
            wall_s=max(load.wall_s for load in loads), cpu_s=sum(load.cpu_s for load in loads),
            loop_lag_p50_ms=median([x for x in (load.loop_lag_p50_ms for load in loads) if x is not None]),
            loop_lag_p99_ms=max(lags) if lags else None,
            loop_lag_max_ms=max((x for x in (load.loop_lag_max_ms for load in loads) if x is not None),
                                default=None),
            host_cpu_percent=max((x for x in (load.host_cpu_percent for load in loads) if x is not None),
                                 default=None))
        self.run.worker_notes = tuple(
            f"worker {s.worker + 1} of {self.pool.n}: {note}" for s in self.workers
            if s.client is not None and s.client.bottleneck for note in s.client.notes)
        self.run.workers = [s.json() for s in self.workers]
