"""The one loop that reads every source and feeds the store.

Every source (an engine polled directly, this machine's NVML and psutil, later Prometheus, dcgm-exporter
or a recording being replayed) is a `Source`: it says how often it wants to be read and turns what it
reads into typed samples (tui.model.samples). The feed reads each source that is due in its own task,
so a slow source delays nobody but itself, and hands every sample to `Store.add`. Widgets only ever see
the store; recorders listen to it (Store.listeners). Nothing here imports Textual.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tui.live.store import Sample, Store


class Source(Protocol):
    """Something the feed reads every `interval_s` seconds. `read` returns the samples it made (none is
    fine: a source may have nothing new); trouble with the data becomes a sample's error text, and only a
    bug raises (the feed reports it and reads the source again at its next turn)."""

    name: str

    @property
    def interval_s(self) -> float: ...  # read at each turn: a source's interval may change while it runs

    async def read(self) -> Iterable[Sample]: ...


class Feed:
    def __init__(self, store: Store, sources: Iterable[Source],
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.store = store
        self.sources = list(sources)
        self.on_error = on_error
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Read every source when due, for ever (cancel the task to stop)."""
        due = [0.0] * len(self.sources)
        try:
            while True:
                now = time.monotonic()
                for i, source in enumerate(self.sources):
                    if now < due[i]:
                        continue
                    due[i] = now + source.interval_s
                    task = self._tasks.get(i)
                    if task is None or task.done():  # a read still in flight is not stacked on
                        self._tasks[i] = asyncio.create_task(self._read(source), name=source.name)
                await asyncio.sleep(max(0.0, min(due, default=now + 1.0) - time.monotonic()))
        finally:
            self.cancel()

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def _read(self, source: Source) -> None:
        try:
            samples = await source.read()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a source: say so once per read, keep feeding the others
            if self.on_error is None:
                raise
            self.on_error(source.name, exc)
            return
        for sample in samples:
            self.store.add(sample)
