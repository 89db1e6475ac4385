"""The effective configuration of one engine polled (tui.sources.config), read through the poller's own
transport and with its key, every message scrubbed of secrets.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import httpx

from tui.model.config import EngineConfig
from tui.model.slots import SlotsReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transport, exchange
from tui.net.policy import InsecureSecret, target_headers
from tui.sources.config import read_config
from tui.sources.engine_http import (
    ERROR_BODY_BYTES,
    Failed,
    address_of,
    fetch_path,
    scrub,
    secrets_of,
    transport_failure,
)


async def poll_config(transport: Transport, target: EngineTarget, dialect: str, *,
                      slots: SlotsReading | None = None, pid: int | None = None, remote: bool = False,
                      timeout: float = 2.0, no_pid: str | None = None) -> EngineConfig | None:
    """The engine's effective configuration (tui.sources.config), read with the poller's own transport and
    key; every message scrubbed of secrets. `no_pid`: why no process of this machine is the engine's (the
    port's holder is a tunnel or a forwarder: tui.sources.port_holder)."""
    try:
        headers = target_headers(target)
    except InsecureSecret:
        return None

    async def fetch(path: str) -> tuple[int, bytes]:
        try:
            status, body, over = await fetch_path(transport, target, path, headers, timeout, 8 * 2**20)
        except Failed as exc:
            raise ValueError(scrub(str(exc), target)) from None
        if over:
            raise ValueError("the answer is larger than 8 MiB; not read")
        return status, body

    async def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """A POST that only reads (Ollama's /api/show), within the poll's timeout."""
        try:
            async with asyncio.timeout(timeout):
                status, data, over = await exchange(transport, "POST", target.base + path,
                                                    {**headers, "Content-Type": "application/json"},
                                                    8 * 2**20, timeout, json.dumps(body).encode(),
                                                    error_cap=ERROR_BODY_BYTES)
        except (httpx.HTTPError, TimeoutError, OSError, ValueError) as exc:
            raise ValueError(scrub(str(transport_failure(exc, address_of(target.url), timeout, path)),
                                   target)) from None
        if over:
            raise ValueError("the answer is larger than 8 MiB; not read")
        return status, data

    config = await read_config(fetch, dialect, slots=slots, pid=pid, remote=remote,
                               secrets=secrets_of(target), no_pid=no_pid, post=post)
    if config is None or not config.lacks:
        return config
    return replace(config, lacks=tuple(scrub(x, target) or "" for x in config.lacks))

