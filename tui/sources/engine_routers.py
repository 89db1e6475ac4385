"""Servers that route requests to models, polled through the poller's transport: llama-server in router
mode (`router_models`: its models and the figures of the loaded ones, tui.sources.router) and llama-swap
(`swap_states`, `swap_models`: its models, their states and the requests in flight, tui.sources.swap).
Each says why, in words, when it could not read them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tui.model.samples import RoutedModel
from tui.model.targets import EngineTarget
from tui.net.keepalive import StreamLines, Transport, exchange
from tui.sources import swap as swap_source
from tui.sources.engine_http import ERROR_BODY_BYTES, Failed, fetch_path, path_fetcher
from tui.sources.router import read_router


async def router_models(transport: Transport, target: EngineTarget, headers: dict[str, str],
                        timeout: float) -> tuple[RoutedModel, ...] | str:
    """The router's models (tui.sources.router), or why they could not be read."""
    fetch = path_fetcher(transport, target, headers, timeout)
    try:
        return await read_router(fetch, target.metrics_path)
    except (ValueError, TypeError) as exc:
        return str(exc)


async def swap_states(transport: Transport, target: EngineTarget, headers: dict[str, str],
                      timeout: float) -> dict[str, str] | None:
    """llama-swap's {model: state}, from its /running, or None: no answer, or not llama-swap's."""
    try:
        status, body, _ = await fetch_path(transport, target, swap_source.RUNNING_PATH, headers, timeout,
                                           1 << 20)
    except Failed:
        return None
    return swap_source.running_states(status, body)


async def swap_models(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                      states: dict[str, str] | None) -> tuple[tuple[RoutedModel, ...], str] | str:
    """llama-swap's models (tui.sources.swap), or why they could not be read."""
    fetch = path_fetcher(transport, target, headers, timeout)

    async def events() -> list[dict[str, Any]] | str:
        return await _inflight(transport, target, headers, timeout)

    try:
        if states is None:
            states = swap_source.running_states(*(await fetch(swap_source.RUNNING_PATH))[:2])
            if states is None:
                return f"{swap_source.RUNNING_PATH} is not llama-swap's answer any more"
        return await swap_source.read_swap(fetch, events, target.metrics_path, states)
    except (ValueError, TypeError) as exc:
        return str(exc)


async def _inflight(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                    cap: int = 4 * 2**20) -> list[dict[str, Any]] | str:
    """The first in-flight snapshot of llama-swap's event stream, which it sends on connect after its log
    history (hence the cap); the stream is dropped as soon as it came."""
    events = swap_source.EVENTS_PATH
    lines = StreamLines()
    found: list[list[dict[str, Any]]] = []

    def until(piece: bytes) -> bool:
        snapshots = (swap_source.inflight_snapshot(line) for line in lines.feed(piece))
        found.extend(r for r in snapshots if r is not None)
        return bool(found)

    try:
        async with asyncio.timeout(timeout):
            status, _, over = await exchange(transport, "GET", target.base + events, headers, cap, timeout,
                                             error_cap=ERROR_BODY_BYTES, until=until)
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        return f"{events}: {type(exc).__name__}"
    if status != 200:
        return f"{events} answered HTTP {status}"
    if found:
        return found[0]
    return f"no in-flight snapshot in the first {cap // 2**20} MiB of {events}" if over else \
        f"{events} ended without an in-flight snapshot"

