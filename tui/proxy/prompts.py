"""After a request's reply has been relayed, off its path: its prompt tokenised by the engine itself (chat
template applied), how much of it an earlier prompt to the same engine began with (the evidence of the prefix
cache findings, tui.findings), and its trace line when a trace is kept.

One task works through the queue, so the engine gets one tokenize call at a time, never beside the request it
was for. An engine that cannot tokenise (no /tokenize: a gateway, a hosted API) is asked no more after
GIVE_UP_AFTER failures in a row: its requests' sharing then stays unknown (None), never zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tui.findings.prefix import SharedPrefixes
from tui.proxy.trace import TraceItem, TraceWriter

Tokenize = Callable[[TraceItem], Awaitable[list[int] | None]]
# engine, the request's seq, its shared tokens (None: unknown)
Shared = Callable[[str, int, int | None], None]
GIVE_UP_AFTER = 3


class PromptTokens:
    def __init__(self, tokenize: Tokenize, on_shared: Shared, trace: TraceWriter | None = None) -> None:
        self.tokenize = tokenize
        self.on_shared = on_shared
        self.trace = trace
        self.prefixes: dict[str, SharedPrefixes] = {}
        self.cannot: dict[str, int] = {}  # engine -> tokenize failures in a row
        self.run_from: dict[str, int] = {}  # engine -> the first request (seq) of its current run
        self._queue: asyncio.Queue[TraceItem | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.trace is not None:
            self.trace.start()
        self._task = asyncio.create_task(self._run(), name="prompt tokens")

    def new_run(self, engine: str, first_seq: int) -> None:
        """The engine restarted: its cache holds none of the prompts before, so they are forgotten, and a
        prompt of a request before `first_seq` still queued is not remembered as one the next may share. It
        is asked to tokenise again."""
        self.prefixes.pop(engine, None)
        self.cannot.pop(engine, None)
        self.run_from[engine] = first_seq

    def submit(self, item: TraceItem) -> None:
        if self.trace is not None:
            self.trace.submitted(item)
        elif self.cannot.get(item.record.engine, 0) >= GIVE_UP_AFTER:
            return  # nothing to trace, and the engine does not tokenise
        self._queue.put_nowait(item)

    async def _run(self) -> None:
        while (item := await self._queue.get()) is not None:
            try:
                await self._one(item)
            except Exception as exc:  # a line lost is said, never the proxy stopped
                if self.trace is not None:
                    self.trace.failed(f"{item.record.engine} {item.path}: {type(exc).__name__}: {exc}")

    async def _one(self, item: TraceItem) -> None:
        engine = item.record.engine
        tokens = None
        if self.cannot.get(engine, 0) < GIVE_UP_AFTER:
            tokens = await self.tokenize(item)
            self.cannot[engine] = 0 if tokens is not None else self.cannot.get(engine, 0) + 1
        shared = None
        if tokens is not None and item.seq >= self.run_from.get(engine, 0):
            shared = self.prefixes.setdefault(engine, SharedPrefixes()).tokens(tokens)
        self.on_shared(engine, item.seq, shared)
        if self.trace is not None:
            self.trace.write(item, tokens)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Work through what is queued (each one still needs its tokenize call), then close the trace."""
        if self._task is not None:
            self._queue.put_nowait(None)
            try:
                await asyncio.wait_for(self._task, timeout_s)
            except TimeoutError:
                self._task.cancel()
                if self.trace is not None:
                    self.trace.failed(f"{self._queue.qsize()} requests not traced: the engine did not "
                                      "tokenise in time")
            self._task = None
        if self.trace is not None:
            self.trace.close()
