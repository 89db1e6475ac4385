"""The proxy's connections to its engines: one opened ahead of each engine's next request.

llama-server closes its connection after every stream, so a proxy in front of it connects once per request,
and that connect (a turn of the event loop, the engine's accept) sat on every request's TTFT: 0.2-0.5 ms on
these machines. `SpareConnector` opens the next connection to an engine once the request that took the last
one has had its first bytes relayed (`replenish`), so the next request finds it made and the opening is on
no request's path (opened at once, it cost the engine an accept just as it should answer). A spare is handed
out only while younger than SPARE_MAX_AGE_S, inside the 5 s that llama.cpp's HTTP server waits for a request
on a new connection (httplib's keep-alive timeout), so an engine never closes a spare under a request; an
older one is closed and the request connects as before.

It overrides aiohttp's `_create_connection`, the one method every new connection goes through (its signature
has not changed since aiohttp 3.3; the proxy tests run through it on every request).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

SPARE_MAX_AGE_S = 3.0


class SpareConnector(aiohttp.TCPConnector):
    """No pool (every request gets a new connection, as `force_close` does) and one spare per engine."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(limit=0, force_close=True, **kwargs)
        self._spares: dict[Any, tuple[asyncio.Task[ResponseHandler], float]] = {}
        self._taken: dict[Any, tuple[Any, Any]] = {}  # engines whose spare was taken: how to open the next

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> ResponseHandler:
        key = req.connection_key
        self._taken[key] = (req, timeout)
        spare = self._spares.pop(key, None)
        if spare is not None and (proto := _made(*spare, self._loop.time())) is not None:
            return proto
        return await super()._create_connection(req, traces, timeout)

    def replenish(self) -> None:
        """Open a spare for every engine whose spare was taken."""
        if self.closed:
            return
        for key, (req, timeout) in self._taken.items():
            task = asyncio.ensure_future(super()._create_connection(req, [], timeout))
            task.add_done_callback(_quiet)
            self._spares[key] = (task, self._loop.time())
        self._taken.clear()

    async def close(self, *, abort_ssl: bool = False) -> None:
        for task, _ in self._spares.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result().close()
            task.cancel()
        self._spares.clear()
        await super().close(abort_ssl=abort_ssl)


def _made(task: asyncio.Task[ResponseHandler], opened: float, now: float) -> ResponseHandler | None:
    """The spare's connection if it is made, still open and young enough; otherwise it is dropped."""
    if not task.done():
        task.cancel()  # still connecting: the request connects itself rather than wait behind it
        return None
    if task.cancelled() or task.exception() is not None:
        return None  # the engine was not reachable then; the request's own connect says why, now
    proto = task.result()
    if proto.is_connected() and now - opened < SPARE_MAX_AGE_S:
        return proto
    proto.close()
    return None


def _quiet(task: asyncio.Task[ResponseHandler]) -> None:
    if not task.cancelled():
        task.exception()  # a spare that failed to connect is not an error anyone waits for
