"""Streams one OpenAI-compatible chat completion and records when each part of it arrived.

Every request gets a fresh TCP connection (no keep-alive pool, `Connection: close`): llama-server closes
the connection after a streamed response while advertising keep-alive, and a pooled client then loses
requests. Failures of any kind become a `ProbeResult` with `error` set; only cancellation propagates.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from tui.probe.results import CHUNK_ESTIMATE_NOTE, ProbeResult, ServerTimings, TokenSource
from tui.secrets import redact

CHAT_PATH = "/v1/chat/completions"


class ProbeTarget(Protocol):
    """Anything with a name, a base URL and an optional API key (e.g. tui.sources.engine.EngineTarget)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def api_key(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ProbeLimits:
    connect_s: float = 5.0
    read_s: float = 120.0  # longest silence allowed between two reads (a long prefill is silent)
    total_s: float = 900.0  # whole request, however it trickles
    max_event_bytes: int = 1 << 20  # one SSE event; a bigger one is refused, not buffered without end
    max_error_body_bytes: int = 4096


def chat_url(base: str) -> str:
    """The chat endpoint under a base URL given with or without a trailing /v1."""
    base = base.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + CHAT_PATH


def public_url(url: str) -> str:
    """The URL without any user:password part, fit for results and screens."""
    try:
        return str(httpx.URL(url).copy_with(userinfo=b""))
    except (httpx.InvalidURL, TypeError, ValueError):
        return url


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
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    vllm_metrics: dict[str, Any] | None = None
    done: bool = False
    text: list[str] = field(default_factory=list)
    _data: list[str] = field(default_factory=list)
    _data_bytes: int = 0

    def feed_line(self, line: str, now: float) -> None:
        """One SSE line (without its newline). A blank line ends an event."""
        if not line:
            self._dispatch(now)
            return
        if line.startswith(":"):
            return  # comment / keep-alive ping
        name, _, value = line.partition(":")
        if name != "data":
            return  # event:, id:, retry: carry nothing a chat stream needs
        value = value.removeprefix(" ")
        self._data_bytes += len(value)
        if self._data_bytes > self.max_event_bytes:
            raise _StreamError(
                f"stream event {self.events + 1} is over {self.max_event_bytes} bytes; stopped reading"
            )
        self._data.append(value)

    def finish(self, now: float) -> None:
        self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        if not self._data:
            return
        payload = "\n".join(self._data)
        self._data.clear()
        self._data_bytes = 0
        self.events += 1
        if payload.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            raise _StreamError(f"invalid JSON in stream event {self.events}: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise _StreamError(f"stream event {self.events} is not a JSON object: {payload[:80]!r}")
        if obj.get("error") is not None:
            raise _StreamError(f"server error in the stream after {self.chunks} chunks: {_error_text(obj)}")
        self._take_chunk(obj, now)

    def _take_chunk(self, obj: dict[str, Any], now: float) -> None:
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    piece = "".join(
                        v
                        for k in ("reasoning_content", "reasoning", "content")
                        if isinstance(v := delta.get(k), str)
                    )
                    if piece:
                        self.chunks += 1
                        if self.first_token_at is None:
                            self.first_token_at = now
                        self.last_token_at = now
                        self.text.append(piece)
                if isinstance(reason := choice.get("finish_reason"), str):
                    self.finish_reason = reason
        if isinstance(usage := obj.get("usage"), dict):
            self.usage = usage
        if isinstance(timings := obj.get("timings"), dict):
            self.timings = timings
        if isinstance(metrics := obj.get("metrics"), dict):
            self.vllm_metrics = metrics


def _error_text(obj: Any) -> str:
    """The human part of an OpenAI-style error body: {"error": {"message"}}, {"message"} or {"detail"}."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(err.get(key), str):
                    return err[key]
        if isinstance(err, str):
            return err
        if isinstance(obj.get("detail"), str):
            return obj["detail"]
    return json.dumps(obj)[:200]


def _body_error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        return _error_text(json.loads(text))
    except ValueError:
        return text[:200] or "(empty body)"


class ProbeClient:
    """One httpx.AsyncClient for many probes; each request still opens its own connection."""

    def __init__(self, limits: ProbeLimits | None = None) -> None:
        self.limits = limits or ProbeLimits()
        self._http = httpx.AsyncClient(
            # No keep-alive pool: a connection is closed once its response ends (see module docstring).
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            timeout=httpx.Timeout(self.limits.read_s, connect=self.limits.connect_s),
            # Probes go straight to the engine: no proxy from the environment, no .netrc credentials.
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

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
    ) -> ProbeResult:
        """Send `body` (stream and include_usage are forced on) and time the streamed answer."""
        body = {**body, "stream": True}
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        # Encoded before the clock starts, so the client's own JSON work is not counted as server time.
        content = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Connection": "close"}
        key = target.api_key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        rec = _Recorder(max_event_bytes=self.limits.max_event_bytes)
        status: int | None = None
        error: str | None = None
        wall_start = time.time()
        sent_at = time.perf_counter()
        try:
            async with asyncio.timeout(self.limits.total_s):
                async with self._http.stream(
                    "POST", chat_url(target.url), content=content, headers=headers
                ) as resp:
                    status = resp.status_code
                    error = await self._read(resp, rec)
        except TimeoutError:
            error = f"request took longer than {self.limits.total_s:g}s in all; cancelled"
        except _StreamError as exc:
            error = str(exc)
        except httpx.HTTPError as exc:
            error = self._transport_error(exc, status, rec)
        ended_at = time.perf_counter()
        return self._result(
            target, workload, index, turn, wall_start, sent_at, ended_at, status, error, rec, key
        )

    async def _read(self, resp: httpx.Response, rec: _Recorder) -> str | None:
        if resp.status_code != 200:
            raw = b""
            async for part in resp.aiter_bytes():
                raw += part
                if len(raw) >= self.limits.max_error_body_bytes:
                    break
            return f"HTTP {resp.status_code}: {_body_error_text(raw[: self.limits.max_error_body_bytes])}"
        ctype = resp.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            return f"expected an event stream but the server answered {ctype or 'no content type'}"
        buf = b""
        async for data in resp.aiter_bytes():
            now = time.perf_counter()  # arrival time of these bytes, shared by every line in them
            buf += data
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                line = buf[start:nl]
                start = nl + 1
                rec.feed_line(line.rstrip(b"\r").decode("utf-8", "replace"), now)
            buf = buf[start:]
            if len(buf) > self.limits.max_event_bytes:
                raise _StreamError(f"stream line over {self.limits.max_event_bytes} bytes; stopped")
            if rec.done:
                break
        if buf:
            rec.feed_line(buf.rstrip(b"\r").decode("utf-8", "replace"), time.perf_counter())
        rec.finish(time.perf_counter())
        if not rec.done and rec.finish_reason is None:
            return f"stream ended early after {rec.chunks} chunks (no finish_reason, no [DONE])"
        return None

    def _transport_error(self, exc: httpx.HTTPError, status: int | None, rec: _Recorder) -> str:
        where = "before the response" if status is None else f"after {rec.chunks} chunks"
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.ConnectTimeout):
            return f"connect timed out after {self.limits.connect_s:g}s"
        if isinstance(exc, httpx.ConnectError):
            return f"cannot connect: {detail}"
        if isinstance(exc, httpx.ReadTimeout):
            return f"server silent for {self.limits.read_s:g}s {where}"
        if isinstance(exc, httpx.RemoteProtocolError):
            return f"connection dropped {where}: {detail}"
        return f"{type(exc).__name__} {where}: {detail}"

    def _result(
        self,
        target: ProbeTarget,
        workload: str,
        index: int,
        turn: int | None,
        wall_start: float,
        sent_at: float,
        ended_at: float,
        status: int | None,
        error: str | None,
        rec: _Recorder,
        key: str | None,
    ) -> ProbeResult:
        notes: list[str] = []
        usage = rec.usage or {}
        server: ServerTimings | None = None
        if rec.timings is not None:
            server = ServerTimings.from_llamacpp(rec.timings)
        elif rec.vllm_metrics is not None:
            server = ServerTimings.from_vllm(rec.vllm_metrics)

        completion = _count(usage, "completion_tokens")
        prompt = _count(usage, "prompt_tokens")
        details = usage.get("prompt_tokens_details")
        cached = _count(details, "cached_tokens") if isinstance(details, dict) else None
        if server is not None and server.source == "llamacpp":
            # llama.cpp without include_usage support still sends its timings: same counts, server-side.
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
        if rec.usage is None and error is None:
            notes.append("no usage in the stream")
        if error is None and not rec.done:
            notes.append("stream ended without [DONE]")
        if error is not None:
            error = redact(error, key)
        return ProbeResult(
            engine=target.name,
            url=public_url(target.url),
            workload=workload,
            index=index,
            turn=turn,
            wall_start=wall_start,
            sent_at=sent_at,
            first_token_at=rec.first_token_at,
            last_token_at=rec.last_token_at,
            ended_at=ended_at,
            status=status,
            error=error,
            finish_reason=rec.finish_reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            token_source=source,
            chunks=rec.chunks,
            server=server,
            notes=tuple(notes),
            text="".join(rec.text),
        )


def _count(obj: Any, key: str) -> int | None:
    if not isinstance(obj, dict):
        return None
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
