"""Reading one streamed answer as it arrives, and the result it makes.

A recorder is fed the body's bytes with their arrival times (tui.net.http1.Exchange.body): `Recorder` reads
an OpenAI-compatible SSE stream (chat or completions), `OllamaRecorder` Ollama's NDJSON (tui.probe.ollama).
Each keeps when text first and last came, the text, the server's token counts and timings, and how the stream
ended; `Recorder.result` freezes that, with the exchange's phases and its failure, into a `ProbeResult`.
A stream that cannot be read on raises `StreamError`, whose message is the result's error.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from tui.base.secrets import redact
from tui.model.samples import PromptProgress
from tui.net.http1 import Phases
from tui.net.policy import error_text, public_url
from tui.probe.ollama import chunk_text
from tui.probe.results import CHUNK_ESTIMATE_NOTE, FailureKind, ProbeResult, TokenSource, cache_note
from tui.probe.timings import ServerTimings

# Delta fields that carry generated text: reasoning (vLLM, SGLang, llama.cpp's reasoning format) and content.
TEXT_KEYS = ("reasoning_content", "reasoning", "content")


class StreamError(Exception):
    """A stream that cannot be read on; the message is the result's error."""


@dataclass
class Recorder:
    """Mutable state while one SSE stream is read; frozen into a ProbeResult at the end (`result`)."""

    # Whether a stream that ended well without usage is worth a note (Ollama never sends usage)
    USAGE_EXPECTED: ClassVar[bool] = True

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

    def refuse(self, ctype: str) -> str | None:
        """Why an answer of content type `ctype` is not this stream, or None."""
        if "text/event-stream" in ctype:
            return None
        return f"expected an event stream but the server answered {ctype or 'no content type'}"

    def take(self, data: bytes, now: float) -> bool:
        """The body's reader (Exchange.body): feed `data`; True once the stream said it ended, so nothing
        after it is read ([DONE], or Ollama's last answer)."""
        self.feed(data, now)
        return self.done

    def ended_early(self) -> str | None:
        """Why the stream, read to its end, ended before it said so, or None."""
        if not self.done and self.finish_reason is None:
            return f"stream ended early after {self.chunks} chunks (no finish_reason, no [DONE])"
        return None

    def feed(self, data: bytes, now: float) -> None:
        """Bytes as they arrived (`now`: their arrival time, shared by every line in them).

        Lines are handled inline, not one method call each: this runs for every read of every probe."""
        for line in self._lines(data):
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

    def _lines(self, data: bytes) -> list[bytes]:
        """The complete lines so far, the line carried from the last read first; the incomplete one at the end
        is carried to the next."""
        if self._tail:
            data = self._tail + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > self.max_event_bytes:
            raise StreamError(f"stream line over {self.max_event_bytes} bytes; stopped")
        return lines

    def _add_data(self, value: bytes) -> None:
        self._data_bytes += len(value)
        if self._data_bytes > self.max_event_bytes:
            raise StreamError(
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
        self._take_chunk(self._object(payload, "event"), now)

    def _object(self, payload: bytes, unit: str) -> dict[str, Any]:
        """The JSON object of stream `unit` (event, line) number `self.events`; an error the server sent in
        it ends the stream."""
        try:
            obj = orjson.loads(payload)  # a stream event a token: ~3x cheaper than json's parser
        except ValueError:
            raise StreamError(f"invalid JSON in stream {unit} {self.events}: {_start(payload)}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"stream {unit} {self.events} is not a JSON object: {_start(payload)}")
        # Ollama's {"error": "..."} is streamResponse's words for a failure mid-stream
        if obj.get("error") is not None:
            raise StreamError(f"server error in the stream after {self.chunks} chunks: {error_text(obj)}")
        return obj

    def _text(self, piece: str, now: float) -> None:
        """A chunk that carried generated text."""
        self.chunks += 1
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.text.append(piece)
        self.token_times.append(now)

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
                    self._text(piece, now)
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

    def server_timings(self) -> ServerTimings | None:
        """The engine's own figures for the request: llama.cpp's `timings`, else vLLM's `metrics`."""
        if self.timings is not None:
            return ServerTimings.from_llamacpp(self.timings)
        if self.vllm_metrics is not None:
            return ServerTimings.from_vllm(self.vllm_metrics)
        return None

    def result(
        self,
        engine: str,
        url: str,
        workload: str,
        index: int,
        turn: int | None,
        wall_start: float,
        phases: Phases,
        ended_at: float,
        status: int | None,
        failed: tuple[str | None, FailureKind | None],
        key: str | None,
    ) -> ProbeResult:
        """The request's result: what was recorded, the exchange's `phases`, and why it `failed` (error text,
        kind), its text scrubbed of `key`."""
        error, failure = failed
        notes: list[str] = []
        usage = self.usage or {}
        server = self.server_timings()

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
            if error is None or self.chunks:
                completion = self.chunks
                notes.append(CHUNK_ESTIMATE_NOTE)
        if self.usage is None and error is None and self.USAGE_EXPECTED:
            notes.append("no usage in the stream")
        if error is None and not self.done:
            notes.append("stream ended without [DONE]")
        if error is not None:
            error = redact(error, key)
        if (note := cache_note(workload, turn, cached, prompt)) is not None:
            notes.append(note)
        return ProbeResult(
            engine=engine,
            url=public_url(url),
            workload=workload,
            index=index,
            turn=turn,
            wall_start=wall_start,
            connect_s=phases.connect_s,
            tls_s=phases.tls_s,
            sent_at=phases.sent_at,
            first_token_at=self.first_token_at,
            last_token_at=self.last_token_at,
            ended_at=ended_at,
            status=status,
            error=error,
            failure=failure if error is not None else None,
            model=self.model,
            finish_reason=self.finish_reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            token_source=source,
            chunks=self.chunks,
            server=server,
            notes=tuple(notes),
            text="".join(self.text),
            gaps_s=tuple(b - a for a, b in itertools.pairwise(self.token_times)),
        )


@dataclass
class OllamaRecorder(Recorder):
    """Ollama's NDJSON stream (tui.probe.ollama): a JSON object a line, timed like SSE chunks; the line with
    done: true ends it and carries the server's figures (`final`)."""

    USAGE_EXPECTED: ClassVar[bool] = False

    final: dict[str, Any] | None = None

    def refuse(self, ctype: str) -> str | None:
        # Ollama streams application/x-ndjson; a single JSON answer (application/json) reads the same way.
        if "ndjson" in ctype or "application/json" in ctype:
            return None
        return f"expected Ollama's NDJSON stream but the server answered {ctype or 'no content type'}"

    def ended_early(self) -> str | None:
        if not self.done:
            return f"stream ended early after {self.chunks} chunks (no final line with done: true)"
        return None

    def feed(self, data: bytes, now: float) -> None:
        for line in self._lines(data):
            self._line(line, now)

    def finish(self, now: float) -> None:
        tail, self._tail = self._tail, b""
        self._line(tail, now)

    def server_timings(self) -> ServerTimings | None:
        return ServerTimings.from_ollama(self.final) if self.final is not None else None

    def _line(self, line: bytes, now: float) -> None:
        line = line.strip()
        if not line or self.done:  # nothing after the last answer counts
            return
        self.events += 1
        if len(line) > self.max_event_bytes:
            raise StreamError(
                f"stream line {self.events} is over {self.max_event_bytes} bytes; stopped reading")
        obj = self._object(line, "line")
        if self.model is None and isinstance(model := obj.get("model"), str):
            self.model = model
        if piece := chunk_text(obj):  # the last answer may carry text too
            self._text(piece, now)
        if obj.get("done") is True:
            self.done = True
            if isinstance(reason := obj.get("done_reason"), str) and reason:
                self.finish_reason = reason  # "stop", "length" (as OpenAI's finish_reason)
            self.final = obj


def _start(payload: bytes) -> str:
    return repr(payload[:80].decode("utf-8", "replace"))


def _count(obj: Any, key: str) -> int | None:
    if not isinstance(obj, dict):
        return None
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
