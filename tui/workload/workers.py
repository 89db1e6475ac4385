"""`--workers N`: one engine's part of a bench or capacity run sent by N worker processes, as AIPerf spreads
its load, so that a deployment faster than one Python process can feed is measured, not the client. This is
the parent's side: the pool of processes, and WorkerBench, which runs a part on them behind Bench's
interface. What each process does: tui.workload.worker_process; how the plan is dealt to them and the peak
in flight measured: tui.workload.dealing.

The plan is made once, in the parent, and dealt so that each request is sent by exactly one worker. Every
worker prepares its prompts, says it is ready, and all of them start on one clock: the parent picks a moment
of time.monotonic(), which is the same clock in every process of the machine, and each worker sends its
requests at that moment plus their planned offsets. Each result comes back as it ends, so the parent's run
(WorkerBench.run) fills as it would in one process: the live view, the capacity search's early stop and the
result file read it unchanged.

Ctrl-C, or an engine that stops answering in one worker, stops them all: each sends back what it measured,
so nothing measured is lost. Each worker measures its own lateness, CPU share and event-loop lag; a worker
that could not keep up is named in the run's notes. Workers ignore SIGINT (the parent stops them) and the
pool is shut down with the part (a capacity search keeps one pool for all its levels).

A closed loop's bound holds across the workers (tui.workload.dealing.shares; the run's notes say when fewer
than the pool sent). A worker only exits when told to, so one that exited on its own (the OOM killer, a
SIGKILL) is noticed within POLL_S: the others are stopped, the run ends with every result already received,
and its error names the worker and how it died; the pool is not used again. A worker that fails to start
(its tokenizer, its prompts, or it died first) fails the run's start, and the thread that reads the replies
ends with it. The peak in flight is measured from the results (tui.workload.dealing.peak_in_flight); the
run's summary has the time-weighted mean beside it (tui.workload.bench.mean_in_flight).
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
from tui.probe.client import ProbeLimits
from tui.probe.results import ProbeResult
from tui.probe.sweep import ClientLoad
from tui.workload.bench import Bench, EngineRun
from tui.workload.dealing import peak_in_flight, shares, split
from tui.workload.prompts import PromptMaker
from tui.workload.schedule import Planned
from tui.workload.tokenizer import load_tokenizer
from tui.workload.worker_process import Options, worker_main

START_MARGIN_S = 0.2  # between the go and the shared start: every worker has the moment before it comes
STOP_WAIT_S = 15.0  # a stopped worker's last results, then it is terminated
READY_WAIT_S = 120.0
POLL_S = 0.5  # how often the parent looks for a worker that died: a dead one says nothing
LOST_WAIT_S = 3.0  # after a worker died, the others' last results; they may never come (a torn reply queue)
PUMP_JOIN_S = 2.0  # the reply thread ends within its 0.1 s poll, unless a torn message holds it in a read


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


def how_ended(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class WorkerPool:
    """N worker processes for one engine's part; started on first use, kept until closed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.context = multiprocessing.get_context("spawn")  # no fork of a process that runs threads
        self.commands: list[Any] = []
        self.replies: Any = None
        self.processes: list[SpawnProcess] = []
        self.start_s: float | None = None  # how long the workers took to start (the first ready)
        # why the pool is not used again: a worker died, and may have died writing to the shared reply queue
        self.lost: str | None = None

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

    def exited(self) -> dict[int, tuple[int | None, int]]:
        """The workers that are gone (worker -> PID, exit code): a worker only exits when it is told to quit,
        so before close() each of these died."""
        return {k: (p.pid, p.exitcode) for k, p in enumerate(self.processes) if p.exitcode is not None}

    def close(self) -> None:
        for k in range(len(self.processes)):
            with contextlib.suppress(Exception):
                self.commands[k].put(("quit",))
        for process in self.processes:
            # after a death a live worker may hang on the reply queue's lock for good: it is not waited for
            process.join(0 if self.lost else 5.0)
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        for commands in self.commands:
            commands.cancel_join_thread()  # a dead worker's unread commands must not hold this process's exit
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
        self.shares = shares(concurrency, pool.n)
        self.active = len(self.shares)  # the workers that send this run: the first `active` of the pool
        # dealt by share, so that every worker's part lasts the whole run and the bound holds to its end
        self.parts = split(planned, [share or 1 for share in self.shares])
        self.workers = [WorkerStats(k, len(part)) for k, part in enumerate(self.parts)]
        self.notes: list[str] = []
        if self.active < pool.n:
            self.notes.append(f"{self.active} of the {pool.n} workers sent the requests: --concurrency "
                              f"{concurrency} gives each worker that sends at least one of its places")
        self.prompts = None  # each worker keeps its own
        self.max_in_flight = 0
        self._status: dict[int, tuple[int, int, float | None]] = {}  # worker -> (sent, in flight, oldest)
        self._by_index = {p.index: p for p in planned}
        self._ready = False
        self._replies: asyncio.Queue[tuple[Any, ...]] | None = None
        self._getter: asyncio.Future[tuple[Any, ...]] | None = None
        self._pump: threading.Thread | None = None
        self._stop_pump = threading.Event()

    @property
    def sent(self) -> int:
        return sum(s for s, _, _ in self._status.values())

    @property
    def in_flight(self) -> int:
        """Now, for the live view: the sum of the workers' last reports (the peak is measured, not this)."""
        return sum(f for _, f, _ in self._status.values())

    def oldest_wait_s(self, now: float) -> float | None:
        waits = [w for _, _, w in self._status.values() if w is not None]
        return max(waits) if waits else None

    async def _next(self, timeout: float) -> tuple[Any, ...] | None:
        """The next reply, or None after `timeout`. The one get is kept across timeouts and cancellations, so
        a reply that came just as the wait ended is not lost."""
        assert self._replies is not None
        if self._getter is None:
            self._getter = asyncio.ensure_future(self._replies.get())
        await asyncio.wait({self._getter}, timeout=max(0.0, timeout))
        if not self._getter.done():
            return None
        item, self._getter = self._getter.result(), None
        return item

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
                except Exception as exc:  # a torn message (its writer killed as it wrote): no more reads
                    item = ("broken", -1, f"{type(exc).__name__}: {exc}")
                    loop.call_soon_threadsafe(replies.put_nowait, item)
                    return
                loop.call_soon_threadsafe(replies.put_nowait, item)

        self._pump = threading.Thread(target=pump, name="bench worker replies", daemon=True)
        self._pump.start()

    async def _end_pump(self) -> None:
        self._stop_pump.set()
        if self._getter is not None:
            self._getter.cancel()
            self._getter = None
        if self._pump is not None:  # gone before the next share's replies come (a capacity level)
            await asyncio.to_thread(self._pump.join, PUMP_JOIN_S)

    def _died(self, k: int, pid: int | None, exitcode: int) -> str:
        return (f"worker {k + 1} of {self.active} (PID {pid}) {how_ended(exitcode)}; its unsent requests are "
                f"not measured")

    async def ready(self) -> None:
        """Start the workers (once per pool) and have each prepare its share. On failure the reply thread ends
        with it: a capacity search calls this before go()."""
        if self._ready:
            return
        if self.pool.lost:
            raise RuntimeError(f"the workers cannot be used again: {self.pool.lost}")
        started = time.monotonic()
        await asyncio.to_thread(self.pool.start)
        self._start_pump()
        try:
            await self._prepare()
        except BaseException:
            await self._end_pump()
            raise
        if self.pool.start_s is None:
            self.pool.start_s = time.monotonic() - started
        self._ready = True

    async def _prepare(self) -> None:
        for k, (part, share) in enumerate(zip(self.parts, self.shares, strict=True)):
            self.pool.send(k, ("run", part, replace(self.options, concurrency=share)))
        waiting = set(range(self.active))
        problems = []
        deadline = time.monotonic() + READY_WAIT_S
        while waiting:
            item = await self._next(POLL_S)
            if item is not None and item[0] == "ready":
                _, k, problem, note = item
                waiting.discard(k)
                if problem:
                    problems.append(f"worker {k + 1} of {self.active}: {problem}")
                if note:
                    self.run.prompt_note = note
                continue
            if gone := self.pool.exited():  # it will never say it is ready
                k, (pid, code) = min(gone.items())
                self.pool.lost = f"worker {k + 1} of {self.pool.n} (PID {pid}) {how_ended(code)}"
                self._cancel()
                raise RuntimeError(f"{self.pool.lost} before it was ready")
            if item is not None and item[0] == "broken":
                self.pool.lost = f"the workers' replies could not be read: {item[2]}"
                raise RuntimeError(self.pool.lost)
            if time.monotonic() > deadline:
                self._cancel()
                raise RuntimeError(f"workers {sorted(waiting)} were not ready after {READY_WAIT_S:g} s")
        if problems:
            self._cancel()
            raise ValueError(problems[0])

    def _cancel(self) -> None:
        """The run will not start: each worker is told (one that failed to prepare takes it as stale)."""
        for k in range(self.active):
            with contextlib.suppress(Exception):
                self.pool.send(k, ("cancel",))

    async def go(self) -> EngineRun:
        """Prepare, then every worker sends its share from one shared moment; results as they end."""
        try:
            await self.ready()
            start_at = time.monotonic() + START_MARGIN_S
            for k in range(self.active):
                self.pool.send(k, ("go", start_at))
            await self._collect(start_at)
        finally:
            await self._end_pump()
        return self.run

    async def _collect(self, start_at: float) -> None:
        done: set[int] = set()
        try:
            await self._gather(done, None)
        except asyncio.CancelledError:  # Ctrl-C: every worker stops and sends what it measured
            self._stop_all(done)
            await self._gather(done, time.monotonic() + STOP_WAIT_S)
            raise
        finally:
            self.run.duration_s = max(self.run.duration_s, time.monotonic() - start_at)
            self._stop_all(set())  # a finished worker waits for this before it takes the next share
            self.max_in_flight = max(self.max_in_flight, peak_in_flight(r for _, r in self.run.results))
            self._merge()

    async def _gather(self, done: set[int], deadline: float | None) -> None:
        """Replies until every worker is done, or `deadline` (time.monotonic()) passes; one that died is found
        within POLL_S, and then the others have LOST_WAIT_S to send what they measured."""
        check_at = time.monotonic() + POLL_S
        while len(done) < self.active:
            now = time.monotonic()
            if now >= check_at:
                check_at = now + POLL_S
                if self._find_dead(done) and (deadline is None or deadline > now + LOST_WAIT_S):
                    deadline = now + LOST_WAIT_S
            if deadline is not None and now >= deadline:
                for k in set(range(self.active)) - done:
                    self.workers[k].error = self.workers[k].error or "stopped, but sent nothing back in time"
                return
            item = await self._next(min(check_at, deadline or check_at) - now)
            if item is None:
                continue
            kind, k = item[0], item[1]
            if kind == "result":
                self._result(item[2], item[3])
            elif kind == "status" and k not in done:  # a dead worker's last report is not news
                self._status[k] = (item[2], item[3], item[4])
            elif kind == "done":
                done.add(k)
                self._done(k, item)
                if self.workers[k].error and self.run.error is None:  # the engine is gone: every worker stops
                    self.run.error = self.workers[k].error
                    self._stop_all(done)
            elif kind == "broken":  # nothing more can be read: whoever died is named, and the run ends
                self._find_dead(done)
                self.pool.lost = self.pool.lost or f"the workers' replies could not be read: {item[2]}"
                self.run.error = self.run.error or self.pool.lost
                self._stop_all(done)
                deadline = time.monotonic()

    def _find_dead(self, done: set[int]) -> bool:
        """A worker of this run that exited while results were due: named in the run's error, the others
        stopped, and the pool not used again."""
        found = False
        for k, (pid, code) in self.pool.exited().items():
            if self.pool.lost is None:
                self.pool.lost = f"worker {k + 1} of {self.pool.n} (PID {pid}) {how_ended(code)}"
            if k >= self.active or k in done:
                continue
            found = True
            done.add(k)
            self.workers[k].error = self._died(k, pid, code)
            self.workers[k].sent = self._status.get(k, (0, 0, None))[0]  # as it last said
            self._status[k] = (self.workers[k].sent, 0, None)
            self.run.error = self.run.error or self.workers[k].error
            self._stop_all(done)
        return found

    def _stop_all(self, done: set[int]) -> None:
        for k in range(self.active):
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
        stats.lateness_s, stats.client, stats.sent = list(lateness), client, sent
        stats.error = error or stats.error
        self.run.lateness_s.extend(lateness)
        self.run.duration_s = max(self.run.duration_s, duration)
        self.max_in_flight = max(self.max_in_flight, most)  # one worker's own count, measured at one moment
        self._status[k] = (stats.sent, 0, None)

    def _merge(self) -> None:
        """The run's client self-check: every worker's together, and the ones that could not keep up named."""
        self.run.workers = [s.json() for s in self.workers]
        loads = [s.client for s in self.workers if s.client is not None]
        self.run.worker_notes = (*self.notes, *(
            f"worker {s.worker + 1} of {self.active}: {note}" for s in self.workers
            if s.client is not None and s.client.bottleneck for note in s.client.notes))
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
