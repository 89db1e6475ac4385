"""The one way tests wait: until a condition holds, with a deadline, never a fixed sleep where the condition
can be asked. `until` for plain code, `until_async` on an event loop (Textual's pilot included)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05,
          detail: Callable[[], Any] | None = None) -> T:
    """Ask `condition` every `every` s until it returns something true, and return that; after `timeout` s,
    fail naming `what` (and `detail()`, when given: what was seen last)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"; last seen: {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(every)


async def until_async(condition: Callable[[], T | Awaitable[T]], what: str, timeout: float = 30.0,
                      every: float = 0.05, pause: Callable[[float], Awaitable[Any]] | None = None) -> T:
    """`until` on an event loop: between two asks, `pause(every)` (a Textual pilot's pause lets the app
    process its messages and redraw; asyncio.sleep by default). `condition` may be a coroutine function
    (asking a server)."""
    pause = pause or asyncio.sleep
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pause(every)
