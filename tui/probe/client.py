"""Streams one OpenAI-compatible chat completion and records when each part of it arrived.

An Ollama server is asked on its native API instead (/api/chat, /api/generate: tui.probe.ollama), whose
NDJSON stream ends with the server's own counts and durations; whether a server is Ollama is asked once per
base URL and client (`ProbeClient._ollama_of`), or said by the target (`api`). Every other server gets the
OpenAI request and its SSE stream, unchanged.

Every request gets a fresh TCP connection (no keep-alive pool, `Connection: close`): llama-server closes
the connection after a streamed response while advertising keep-alive, and a pooled client then loses
requests. Failures of any kind become a `ProbeResult` with `error` set; only cancellation propagates.

Clock: `time.monotonic()`, the dashboard store's clock. TTFT and end-to-end time start when the request
is sent; setting up the connection (TCP connect, TLS) is timed apart (`connect_s`, `tls_s`).

Proxies follow tui.net.policy (environment proxies, loopback always direct, no secret in clear text
through a proxy). The HTTP itself is tui.net.http1: a streaming client far cheaper per read than httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from tui.base.secrets import redact
from tui.model.samples import PromptProgress
from tui.net.http1 import Exchange, HttpFailure, Phases
from tui.net.policy import InsecureSecret, error_text, public_url, target_headers
from tui.probe.ollama import (
    API_OLLAMA,
    API_OPENAI,
    NDJSON,
    OLLAMA_CHAT_PATH,
    OLLAMA_GENERATE_PATH,
    OllamaServer,
    ask_server,
    chunk_text,
)
from tui.probe.ollama import request_body as ollama_body
from tui.probe.results import (
    CHUNK_ESTIMATE_NOTE,
    FailureKind,
    ProbeResult,
    ServerTimings,
    TokenSource,
    cache_note,
)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"  # a raw prompt, no chat template: the tokens are exactly the text's


class ProbeTarget(Protocol):
    """Anything with a name, a base URL and an optional API key (e.g. tui.sources.engine.EngineTarget).

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

# Delta fields that carry generated text: reasoning (vLLM, SGLang, llama.cpp's reasoning format) and content.
TEXT_KEYS = ("reasoning_content", "reasoning", "content")


class _StreamError(Exception):
    """A stream that cannot be read on; the message is the result's error."""


@dataclass
class _Recorder:
    """Mutable state while one stream is read; frozen into a ProbeResult at the end."""

    max_event_bytes: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    chunks: int = 0
    events: int = 0
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    vllm_metrics: dict[str, Any] | None = None
    done: bool = False
    on_progress: Callable[[PromptProgress], None] | None = None
    text: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    _data: list[bytes] = field(default_factory=list)
    _data_bytes: int = 0
    _tail: bytes = b""  # an incomplete line carried to the next read

    def feed(self, data: bytes, now: float) -> None:
        """Bytes as they arrived (`now`: their arrival time, shared by every line in them).

        Lines are handled inline, not one method call each: this runs for every read of every probe."""
        if self._tail:
            data = self._tail + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self.max_event_bytes:
            raise _StreamError(f"stream line over {self.max_event_bytes} bytes; stopped")
        for line in lines:
            if not line:  # a blank line ends an event
                if self._data:
                    self._dispatch(now)
            elif line[:5] == b"data:":  # event:, id:, retry: and ": comments" carry nothing we need
                self._add_data(line[6:] if line[5:6] == b" " else line[5:])

    def finish(self, now: float) -> None:
        if self._tail.rstrip(b"\r")[:5] == b"data:":
            line = self._tail.rstrip(b"\r")
            self._add_data(line[6:] if line[5:6] == b" " else line[5:])
        self._tail = b""
        if self._data:
            self._dispatch(now)

    def _add_data(self, value: bytes) -> None:
        self._data_bytes += len(value)
        if self._data_bytes > self.max_event_bytes:
            raise _StreamError(
                f"stream event {self.events + 1} is over {self.max_event_bytes} bytes; stopped reading"
            )
        self._data.append(value)

    def _dispatch(self, now: float) -> None:
        payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        self._data.clear()
        self._data_bytes = 0
        self.events += 1
        if payload[:1] != b"{" and payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(payload)  # a stream event a token: ~3x cheaper than json's parser
        except ValueError:
            raise _StreamError(f"invalid JSON in stream event {self.events}: {_start(payload)}") from None
        if not isinstance(obj, dict):
            raise _StreamError(f"stream event {self.events} is not a JSON object: {_start(payload)}")
        if obj.get("error") is not None:
            raise _StreamError(f"server error in the stream after {self.chunks} chunks: {error_text(obj)}")
        self._take_chunk(obj, now)

    def _take_chunk(self, obj: dict[str, Any], now: float) -> None:
        if self.model is None and isinstance(model := obj.get("model"), str):
            self.model = model
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta")
                text = choice.get("text")  # /v1/completions
                piece = text if isinstance(text, str) else ""
                if isinstance(delta, dict):
                    for key in TEXT_KEYS:
                        if isinstance(value := delta.get(key), str):
                            piece += value
                if piece:
                    self.chunks += 1
                    if self.first_token_at is None:
                        self.first_token_at = now
                    self.last_token_at = now
                    self.text.append(piece)
                    self.token_times.append(now)
                if isinstance(reason := choice.get("finish_reason"), str):
                    self.finish_reason = reason
        if isinstance(usage := obj.get("usage"), dict):
            self.usage = usage
        if isinstance(timings := obj.get("timings"), dict):
            self.timings = timings
        if isinstance(metrics := obj.get("metrics"), dict):
            self.vllm_metrics = metrics
        if self.on_progress is not None and isinstance(progress := obj.get("prompt_progress"), dict):
            # a shape we do not know is passed over: the progress is a nicety, the result is what counts
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self.on_progress(PromptProgress(
                    int(progress["total"]), int(progress.get("cache") or 0), int(progress["processed"]),
                    float(progress.get("time_ms") or 0)))


@dataclass
class _OllamaRecorder(_Recorder):
    """Ollama's NDJSON stream (tui.probe.ollama): a JSON object a line, timed like SSE chunks; the line with
    done: true ends it and carries the server's figures (`final`)."""

    final: dict[str, Any] | None = None

    def feed(self, data: bytes, now: float) -> None:
        if self._tail:
            data = self._tail + data
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self.max_event_bytes:
            raise _StreamError(f"stream line over {self.max_event_bytes} bytes; stopped")
        for line in lines:
            self._line(line, now)

    def finish(self, now: float) -> None:
        tail, self._tail = self._tail, b""
        self._line(tail, now)

    def _line(self, line: bytes, now: float) -> None:
        line = line.strip()
        if not line or self.done:  # nothing after the last answer counts
            return
        self.events += 1
        if len(line) > self.max_event_bytes:
            raise _StreamError(
                f"stream line {self.events} is over {self.max_event_bytes} bytes; stopped reading")
        try:
            obj = orjson.loads(line)
        except ValueError:
            raise _StreamError(f"invalid JSON in stream line {self.events}: {_start(line)}") from None
        if not isinstance(obj, dict):
            raise _StreamError(f"stream line {self.events} is not a JSON object: {_start(line)}")
        if obj.get("error") is not None:  # {"error": "..."}: streamResponse's words for a failure mid-stream
            raise _StreamError(f"server error in the stream after {self.chunks} chunks: {error_text(obj)}")
        if self.model is None and isinstance(model := obj.get("model"), str):
            self.model = model
        if piece := chunk_text(obj):  # the last answer may carry text too
            self.chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
            self.text.append(piece)
            self.token_times.append(now)
        if obj.get("done") is True:
            self.done = True
            if isinstance(reason := obj.get("done_reason"), str) and reason:
                self.finish_reason = reason  # "stop", "length" (as OpenAI's finish_reason)
            self.final = obj


def _start(payload: bytes) -> str:
    return repr(payload[:80].decode("utf-8", "replace"))


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
        rec: _Recorder
        if ollama is not None:
            raw = path == COMPLETIONS_PATH
            model = body.get("model") or getattr(target, "model", None) or ollama.model
            content = orjson.dumps(ollama_body(body, raw, model))
            url = chat_url(target.url, OLLAMA_GENERATE_PATH if raw else OLLAMA_CHAT_PATH)
            headers = {"Content-Type": "application/json", "Accept": NDJSON, "Connection": "close",
                       "Accept-Encoding": "identity"}
            rec = _OllamaRecorder(max_event_bytes=self.limits.max_event_bytes)
        else:
            body = {**body, "stream": True}
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            # Encoded before the clock starts, so the client's own JSON work is not counted as server time.
            content = orjson.dumps(body)
            url = chat_url(target.url, path)
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       "Connection": "close", "Accept-Encoding": "identity"}
            rec = _Recorder(max_event_bytes=self.limits.max_event_bytes, on_progress=on_progress)
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
        except _StreamError as exc:
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
        return self._result(target, workload, index, turn, wall_start, phases, ended_at, status,
                            (error, failure), rec, key)

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
        self, exchange: Exchange, status: int, headers: dict[str, str], rec: _Recorder
    ) -> tuple[str | None, FailureKind | None]:
        if status != 200:
            limit = self.limits.max_error_body_bytes
            raw = bytearray()

            def keep(data: bytes, _now: float) -> bool:
                raw.extend(data)
                return len(raw) >= limit

            await exchange.body(keep)
            return f"HTTP {status}: {error_text(bytes(raw[:limit]))}", "http"
        ctype = headers.get("content-type", "")
        if isinstance(rec, _OllamaRecorder):
            return await self._read_ndjson(exchange, ctype, rec)
        if "text/event-stream" not in ctype:
            got = ctype or "no content type"
            return f"expected an event stream but the server answered {got}", "protocol"

        def take(data: bytes, now: float) -> bool:
            rec.feed(data, now)
            return rec.done  # [DONE]: nothing after it is read

        await exchange.body(take)
        rec.finish(time.monotonic())
        if not rec.done and rec.finish_reason is None:
            return f"stream ended early after {rec.chunks} chunks (no finish_reason, no [DONE])", "dropped"
        return None, None

    async def _read_ndjson(
        self, exchange: Exchange, ctype: str, rec: _OllamaRecorder
    ) -> tuple[str | None, FailureKind | None]:
        # Ollama streams application/x-ndjson; a single JSON answer (application/json) reads the same way.
        if "ndjson" not in ctype and "application/json" not in ctype:
            got = ctype or "no content type"
            return f"expected Ollama's NDJSON stream but the server answered {got}", "protocol"

        def take(data: bytes, now: float) -> bool:
            rec.feed(data, now)
            return rec.done  # the last answer: nothing after it is read

        await exchange.body(take)
        rec.finish(time.monotonic())
        if not rec.done:
            return f"stream ended early after {rec.chunks} chunks (no final line with done: true)", "dropped"
        return None, None

    def _transport_error(self, exc: HttpFailure, status: int | None, rec: _Recorder) -> str:
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

    def _result(
        self,
        target: ProbeTarget,
        workload: str,
        index: int,
        turn: int | None,
        wall_start: float,
        phases: Phases,
        ended_at: float,
        status: int | None,
        failed: tuple[str | None, FailureKind | None],
        rec: _Recorder,
        key: str | None,
    ) -> ProbeResult:
        error, failure = failed
        notes: list[str] = []
        usage = rec.usage or {}
        server: ServerTimings | None = None
        ollama = isinstance(rec, _OllamaRecorder)
        if isinstance(rec, _OllamaRecorder):
            if rec.final is not None:
                server = ServerTimings.from_ollama(rec.final)
        elif rec.timings is not None:
            server = ServerTimings.from_llamacpp(rec.timings)
        elif rec.vllm_metrics is not None:
            server = ServerTimings.from_vllm(rec.vllm_metrics)

        completion = _count(usage, "completion_tokens")
        prompt = _count(usage, "prompt_tokens")
        details = usage.get("prompt_tokens_details")
        cached = _count(details, "cached_tokens") if isinstance(details, dict) else None
        if server is not None and server.source in ("llamacpp", "ollama"):
            # llama.cpp without include_usage support still sends its timings: same counts, server-side.
            # Ollama sends no usage: its counts are these (prompt_eval_count, eval_count; no cached count).
            if completion is None:
                completion = server.predicted_n
            if prompt is None and server.prompt_n is not None:
                prompt = server.prompt_n + (server.cache_n or 0)
            if cached is None:
                cached = server.cache_n
        source: TokenSource = "server"
        if completion is None:
            source = "chunks"
            # A request that failed before any text came has no count to estimate: None, not 0.
            if error is None or rec.chunks:
                completion = rec.chunks
                notes.append(CHUNK_ESTIMATE_NOTE)
        if rec.usage is None and error is None and not ollama:
            notes.append("no usage in the stream")
        if error is None and not rec.done:
            notes.append("stream ended without [DONE]")
        if error is not None:
            error = redact(error, key)
        if (note := cache_note(workload, turn, cached, prompt)) is not None:
            notes.append(note)
        return ProbeResult(
            engine=target.name,
            url=public_url(target.url),
            workload=workload,
            index=index,
            turn=turn,
            wall_start=wall_start,
            connect_s=phases.connect_s,
            tls_s=phases.tls_s,
            sent_at=phases.sent_at,
            first_token_at=rec.first_token_at,
            last_token_at=rec.last_token_at,
            ended_at=ended_at,
            status=status,
            error=error,
            failure=failure if error is not None else None,
            model=rec.model,
            finish_reason=rec.finish_reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            token_source=source,
            chunks=rec.chunks,
            server=server,
            notes=tuple(notes),
            text="".join(rec.text),
            gaps_s=tuple(b - a for a, b in itertools.pairwise(rec.token_times)),
        )


def _count(obj: Any, key: str) -> int | None:
    if not isinstance(obj, dict):
        return None
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
