"""Streams one OpenAI-compatible chat completion and records when each part of it arrived.

An Ollama server is asked on its native API instead (/api/chat, /api/generate: tui.probe.ollama), whose
NDJSON stream ends with the server's own counts and durations; whether a server is Ollama is asked once per
base URL and client (`ProbeClient._ollama_of`), or said by the target (`api`). Every other server gets the
OpenAI request and its SSE stream, unchanged.

Every request gets a fresh TCP connection (no keep-alive pool, `Connection: close`): llama-server closes
the connection after a streamed response while advertising keep-alive, and a pooled client then loses
requests. Failures of any kind become a `ProbeResult` with `error` set; only cancellation propagates.
The answer is read as it streams, and made a result, by tui.probe.stream; this module is the HTTP.

Clock: `time.monotonic()`, the dashboard store's clock. TTFT and end-to-end time start when the request
is sent; setting up the connection (TCP connect, TLS) is timed apart (`connect_s`, `tls_s`).

Proxies follow tui.net.policy (environment proxies, loopback always direct, no secret in clear text
through a proxy). The HTTP itself is tui.net.http1: a streaming client far cheaper per read than httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from tui.model.samples import PromptProgress
from tui.net.http1 import Exchange, HttpFailure
from tui.net.policy import InsecureSecret, error_text, target_headers
from tui.probe.ollama import (
    API_OLLAMA,
    API_OPENAI,
    NDJSON,
    OLLAMA_CHAT_PATH,
    OLLAMA_GENERATE_PATH,
    OllamaServer,
    ask_server,
)
from tui.probe.ollama import request_body as ollama_body
from tui.probe.results import FailureKind, ProbeResult
from tui.probe.stream import OllamaRecorder, Recorder, StreamError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"  # a raw prompt, no chat template: the tokens are exactly the text's


class ProbeTarget(Protocol):
    """Anything with a name, a base URL and an optional API key (e.g. tui.model.targets.EngineTarget).

    It may also have `api`: "ollama" (the server is Ollama: its native API without asking), "openai" (never
    ask whether it is Ollama), or None / absent (ask once: ProbeClient._ollama_of)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def api_key(self) -> str | None: ...

    @property
    def model(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ProbeLimits:
    connect_s: float = 5.0
    read_s: float = 120.0  # longest silence allowed between two reads (a long prefill is silent)
    total_s: float = 900.0  # whole request, however it trickles
    max_event_bytes: int = 1 << 20  # one SSE event; a bigger one is refused, not buffered without end
    max_error_body_bytes: int = 4096


def chat_url(base: str, path: str = CHAT_PATH) -> str:
    """The chat (or completions) endpoint under a base URL given with or without a trailing /v1."""
    base = base.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + path


_FAILURE_OF_KIND: dict[str, FailureKind] = {
    "connect": "refused", "connect-timeout": "timeout", "silent": "timeout", "dropped": "dropped",
    "protocol": "protocol", "tls": "tls", "proxy": "proxy", "url": "config",
}

class ProbeClient:
    """Probes one request at a time or many at once; each request opens its own connection."""

    def __init__(self, limits: ProbeLimits | None = None) -> None:
        self.limits = limits or ProbeLimits()
        # Whether each base URL is Ollama, as its answers said ((base, target said so) -> server or None),
        # and the checks under way, which every probe of that URL meanwhile waits for.
        self._ollama: dict[tuple[str, bool], OllamaServer | None] = {}
        self._checks: dict[tuple[str, bool], asyncio.Task[OllamaServer | None]] = {}

    async def aclose(self) -> None:
        """Nothing is pooled: every connection is closed when its request ends. Kept for `async with`; a check
        of a server still under way is stopped."""
        checks, self._checks = list(self._checks.values()), {}
        for task in checks:
            task.cancel()
        for task in checks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def chat(
        self,
        target: ProbeTarget,
        body: dict[str, Any],
        *,
        workload: str = "custom",
        index: int = 0,
        turn: int | None = None,
        path: str = CHAT_PATH,
        on_progress: Callable[[PromptProgress], None] | None = None,
    ) -> ProbeResult:
        """Send `body` (stream and include_usage are forced on) and time the streamed answer; `path`
        COMPLETIONS_PATH for a raw prompt. `on_progress` sees llama-server's prompt progress when the body
        asks for it (`return_progress`). An Ollama server gets the same request in its native shape
        (tui.probe.ollama.request_body: /api/chat, or /api/generate with raw for a raw prompt)."""
        ollama = await self._ollama_of(target, body)
        rec: Recorder
        if ollama is not None:
            raw = path == COMPLETIONS_PATH
            model = body.get("model") or getattr(target, "model", None) or ollama.model
            content = orjson.dumps(ollama_body(body, raw, model))
            url = chat_url(target.url, OLLAMA_GENERATE_PATH if raw else OLLAMA_CHAT_PATH)
            headers = {"Content-Type": "application/json", "Accept": NDJSON, "Connection": "close",
                       "Accept-Encoding": "identity"}
            rec = OllamaRecorder(max_event_bytes=self.limits.max_event_bytes)
        else:
            body = {**body, "stream": True}
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            # Encoded before the clock starts, so the client's own JSON work is not counted as server time.
            content = orjson.dumps(body)
            url = chat_url(target.url, path)
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       "Connection": "close", "Accept-Encoding": "identity"}
            rec = Recorder(max_event_bytes=self.limits.max_event_bytes, on_progress=on_progress)
        key = target.api_key
        exchange = Exchange(self.limits.read_s)
        status: int | None = None
        error: str | None = None
        failure: FailureKind | None = None
        wall_start = time.time()
        started_at = time.monotonic()
        try:
            headers.update(target_headers(target))  # refuses a secret in clear text through a proxy
            async with asyncio.timeout(self.limits.total_s):
                await exchange.open(url, headers, content, self.limits.connect_s)
                status, response_headers = await exchange.head()
                error, failure = await self._read(exchange, status, response_headers, rec)
        except TimeoutError:
            error = f"request took longer than {self.limits.total_s:g}s in all; cancelled"
            failure = "timeout"
        except StreamError as exc:
            error, failure = str(exc), "protocol"
        except HttpFailure as exc:
            error = self._transport_error(exc, status, rec)
            failure = _FAILURE_OF_KIND.get(exc.kind, "protocol")
        except InsecureSecret as exc:
            error, failure = str(exc), "config"
        finally:
            exchange.close()
        ended_at = time.monotonic()
        phases = exchange.phases
        if phases.sent_at is not None:
            wall_start += phases.sent_at - started_at  # the wall clock at the send, like sent_at
        return rec.result(target.name, target.url, workload, index, turn, wall_start, phases, ended_at,
                          status, (error, failure), key)

    async def speaks_ollama(self, target: ProbeTarget, body: dict[str, Any] | None = None) -> bool:
        """Whether probes of `target` (with `body`'s model) go to Ollama's native API: the check a first
        probe makes, for a caller that wants it made before its clock starts (a bench's ready())."""
        return await self._ollama_of(target, body or {}) is not None

    async def _ollama_of(self, target: ProbeTarget, body: dict[str, Any]) -> OllamaServer | None:
        """The Ollama server behind `target`, or None: speak OpenAI to it.

        A target that says `api="openai"` is never asked. One that says "ollama" is not asked either, unless
        neither the body nor the target names a model: Ollama wants one, and its /api/ps (/api/tags) says
        which (one or two GETs, once). Any other is asked once per base URL and client, before its first
        probe and outside its clock (tui.probe.ollama.ask_server: one GET of /api/version for a server that
        is not Ollama, two or three for Ollama); a check that got no answer (refused, timed out) is not
        kept, and the probe then fails on its own."""
        api = getattr(target, "api", None)
        if api == API_OPENAI:
            return None
        known = api == API_OLLAMA
        if known and (body.get("model") or getattr(target, "model", None)):
            return OllamaServer(None, None)
        base = chat_url(target.url, "")
        if (base, known) in self._ollama:
            return self._ollama[base, known]
        task = self._checks.get((base, known))
        if task is None:
            task = asyncio.ensure_future(self._check(target, base, known))
            self._checks[base, known] = task
        # shielded: a probe cancelled while it waits does not cancel the check the others wait for
        server = await asyncio.shield(task)
        return OllamaServer(None, None) if known and server is None else server

    async def _check(self, target: ProbeTarget, base: str, known: bool) -> OllamaServer | None:
        try:
            try:
                headers = target_headers(target)
            except InsecureSecret:
                return None  # the probe itself says why nothing is sent
            answered, server = await ask_server(base, headers, self.limits.connect_s, known)
            if answered:
                self._ollama[base, known] = server
            return server
        finally:
            self._checks.pop((base, known), None)

    async def _read(
        self, exchange: Exchange, status: int, headers: dict[str, str], rec: Recorder
    ) -> tuple[str | None, FailureKind | None]:
        if status != 200:
            limit = self.limits.max_error_body_bytes
            raw = bytearray()

            def keep(data: bytes, _now: float) -> bool:
                raw.extend(data)
                return len(raw) >= limit

            await exchange.body(keep)
            return f"HTTP {status}: {error_text(bytes(raw[:limit]))}", "http"
        if (refused := rec.refuse(headers.get("content-type", ""))) is not None:
            return refused, "protocol"
        await exchange.body(rec.take)
        rec.finish(time.monotonic())
        if (early := rec.ended_early()) is not None:
            return early, "dropped"
        return None, None

    def _transport_error(self, exc: HttpFailure, status: int | None, rec: Recorder) -> str:
        where = "before the response" if status is None else f"after {rec.chunks} chunks"
        if exc.kind == "connect":
            return f"cannot connect: {exc.detail}"
        if exc.kind == "connect-timeout":
            return f"connect timed out after {self.limits.connect_s:g}s"
        if exc.kind == "silent":
            return f"server silent for {self.limits.read_s:g}s {where}"
        if exc.kind == "dropped":
            return f"connection dropped {where}: {exc.detail}"
        if exc.kind == "protocol":
            return f"bad HTTP response {where}: {exc.detail}"
        return exc.detail  # url, tls, proxy: the detail says it all
