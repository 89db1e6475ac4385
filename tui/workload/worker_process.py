"""What runs in each `--workers N` process (tui.workload.workers starts them and runs the parent's side): it
takes a share of the plan at a time, prepares its prompts (the engine's one-token words, or the
--tokenizer's), says it is ready, sends its requests on the shared clock (the parent's moment of
time.monotonic() plus each request's planned offset), streams every result back as it ends and says what it
has out every STATUS_S, until told to quit. It measures its own lateness, CPU share and event-loop lag and
sends them back when its share ends or it is stopped. It ignores SIGINT: Ctrl-C is the parent's, which stops
it and keeps what it measured.

The two sides agree on these messages (tuples, first the kind):
* to a worker, on its own command queue: ("run", planned, Options), ("go", start_at), ("stop",),
  ("cancel",) (a share that will not start), ("quit",);
* back, on the pool's one reply queue, each with the worker's number: "ready" (a problem or None, the prompts'
  note), "result" (the planned index, its ProbeResult), "status" (sent, in flight, the oldest wait), "done"
  (lateness, duration, client load, error, its most in flight, sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass
from typing import Any

from tui.model.targets import EngineTarget
from tui.net.loop import run_loop
from tui.probe.client import ProbeLimits
from tui.workload.bench import Bench
from tui.workload.prompts import PromptMaker
from tui.workload.tokenizer import load_tokenizer

FRESH_PER_WORKER = 10_000_000  # fresh-text numbers each worker may draw before the next worker's begin
STATUS_S = 0.25  # how often a worker says how many requests it has out


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
        try:  # a tokenizer that cannot be read, an engine that cannot give its tokens: the parent says why
            if options.tokenizer and tokenizer is None:
                tokenizer = load_tokenizer(options.tokenizer)
            bench = Bench(options.target, planned, concurrency=options.concurrency, model=options.model,
                          block_size=options.block_size, limits=options.limits, prompts=prompts,
                          fresh_from=worker * FRESH_PER_WORKER, prompt_seed=options.prompt_seed,
                          tokenizer=tokenizer,
                          on_result=lambda _name, p, r: replies.put(("result", worker, p.index, r)))
            await bench.ready()
        except Exception as exc:
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
