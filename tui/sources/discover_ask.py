"""Asking each candidate (tui.sources.discover_listeners) whether it is an engine: GET /health and /v1/models,
all candidates at once, within one deadline for them all and a cap on each answer's body.

Why a deadline and a cap, and not only httpx's timeout: httpx's timeout bounds each read, not a response, so
a port that sends its headers and then a byte of body every half second held discovery (and so the start of
`enginetop` and `enginetop snapshot`) for as long as it kept sending. Whatever a port does, asking ends at
the deadline; what had not answered by then is said ("did not answer in time") and not watched.

Why these figures: an engine answers /health and /v1/models from memory in milliseconds (llama-server from
its HTTP threads even while every slot is busy), and a model list is a few kB (a router's or Ollama's hundred
models: ~20 kB). DEADLINE_S, 3 s, is one bound for everything a port may do (connect, headers, body): it
leaves room for an engine whose API server is busy on a loaded 2-core machine (vLLM's event loop tokenizing a
long prompt stalls for a second or more), and it is as long as the start of the dashboard or of a snapshot
should ever wait for a port that misbehaves. A port that accepts and then says nothing is late the same way
as one that trickles. MAX_BODY_BYTES, 256 KiB, is ten times the largest model list seen.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

# TRAFFIC_PATH: what `enginetop proxy` (and a dashboard's --proxy-listen) answers itself, never relaying it:
# a listener whose process cannot be read is told apart by it.
from tui.base.defaults import TRAFFIC_PATH
from tui.sources.discover_found import FoundEngine, How
from tui.sources.discover_listeners import UNREAD, Candidate
from tui.sources.native_servers import LMSTUDIO_GREETING, OLLAMA_PS, is_lmstudio

DEADLINE_S = 3.0
MAX_BODY_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Reply:
    status: int | None = None  # None: no answer (refused, reset, or late)
    body: Any = None  # the JSON of a 200 answer within MAX_BODY_BYTES, else None
    late: bool = False  # the deadline came first


@dataclass(frozen=True, slots=True)
class Late:
    """A candidate that had not answered when the deadline came."""

    candidate: Candidate


async def get(client: httpx.AsyncClient, url: str, deadline: float) -> Reply:
    """GET `url`, its body read up to MAX_BODY_BYTES (more: not a model list), all before `deadline` (the
    running loop's clock)."""
    try:
        async with asyncio.timeout_at(deadline), client.stream("GET", url) as response:
            if response.status_code != 200:
                return Reply(response.status_code)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    return Reply(response.status_code)
    except (TimeoutError, httpx.TimeoutException):  # the deadline, or httpx's own (set to the same)
        return Reply(late=True)
    except httpx.HTTPError:
        return Reply()
    try:
        return Reply(response.status_code, json.loads(body))
    except ValueError:  # not JSON (UnicodeDecodeError is one too)
        return Reply(response.status_code)


def _fingerprint(lmstudio: Reply, ollama: Reply) -> str | None:
    """LM Studio (its greeting, {"lmstudio": true}) or Ollama (/api/ps: its loaded models), by their own
    routes: neither has a command line enginetop reads (LM Studio is an app; an Ollama of another user or in
    a VM). A `version` alone is no fingerprint: other web apps answer /api/version so."""
    if is_lmstudio(lmstudio.body, None):
        return "LM Studio"
    if isinstance(ollama.body, dict) and isinstance(ollama.body.get("models"), list):
        return "Ollama"
    return None


def model_ids(body: Any) -> tuple[str, ...] | None:
    """The ids of an OpenAI model list, or None when `body` is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    return tuple(str(m["id"]) for m in body["data"] if isinstance(m, dict) and m.get("id"))


async def confirm(client: httpx.AsyncClient, c: Candidate, deadline: float) -> FoundEngine | Late | None:
    """The engine `c` is, from its answers; Late when it had not answered by `deadline`; None when it is
    no engine (no answer, not OpenAI-compatible, or enginetop's own proxy)."""
    base = ""
    replies: list[Reply] = []
    for host in c.hosts:  # the first address whose server answers at all
        base = f"http://{host}:{c.port}"
        asks = [get(client, f"{base}/health", deadline), get(client, f"{base}/v1/models", deadline)]
        if c.program is None:  # not an engine by its command line: enginetop's proxy, LM Studio, Ollama?
            asks += [get(client, f"{base}{path}", deadline)
                     for path in (TRAFFIC_PATH, LMSTUDIO_GREETING, OLLAMA_PS)]
        replies = await asyncio.gather(*asks)
        if any(r.status is not None or r.late for r in replies):
            break
    if not replies:
        return None
    health, listed = replies[0], replies[1]
    models = model_ids(listed.body)
    if c.program is not None:
        # its command line says what it is: any answer of its HTTP server confirms it (503: still loading)
        if health.status is None and listed.status is None:
            return Late(c) if health.late or listed.late else None
        program = c.program
        how: How = "command line"
    else:
        traffic = replies[2]
        if traffic.status == 200 and isinstance(traffic.body, list):
            return None  # enginetop's proxy: it relays the engine behind it, which is found by itself
        keyed = listed.status in (401, 403) and health.status == 200  # an OpenAI server that wants a key
        if models is None and not keyed:
            waiting_on_key = listed.status in (401, 403) and health.late
            return Late(c) if listed.late or waiting_on_key else None
        program = _fingerprint(replies[3], replies[4]) or c.process or UNREAD
        how = "usual port"
    return FoundEngine(name="", url=base, port=c.port, pid=c.pid, program=program, how=how,
                       models=models or (), children=c.children, uid=c.uid, container=c.container)
