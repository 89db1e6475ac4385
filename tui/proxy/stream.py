"""What the proxy reads in a response while it relays it: server-sent events split as they arrive, the time
of every event that carried generated text, usage and timings, and the reply text (for sessions).

When the proxy asked for usage on a client's behalf (`stream_options.include_usage`, which the client did
not ask for), it takes back what that changed, so the client gets the events it would have got: the extra
`choices: []` usage chunk is dropped, and what the engine moved onto it instead of the finish chunk
(llama.cpp's `timings`, vLLM's `system_fingerprint`) goes back onto the finish chunk. Every other event is
relayed byte for byte. Nothing here does I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

# Keys only the extra usage chunk carries that would not exist without it: dropped with it.
USAGE_ONLY_KEYS = frozenset({"choices", "usage", "metrics"})
_DATA = b"data:"


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete events (each with its blank-line terminator) and the incomplete rest. Engines end lines
    with \\n: one split. A read with a \\r in it (\\r\\n line ends, allowed by SSE) takes the slower walk."""
    if b"\r" not in buffer:
        parts = buffer.split(b"\n\n")
        rest = parts.pop()
        return [part + b"\n\n" for part in parts], rest
    events: list[bytes] = []
    start = 0
    while True:
        end = buffer.find(b"\n\n", start)
        crlf = buffer.find(b"\r\n\r\n", start)
        if crlf != -1 and (end == -1 or crlf < end):
            end, size = crlf, 4
        else:
            size = 2
        if end == -1:
            return events, buffer[start:]
        events.append(buffer[start:end + size])
        start = end + size


def event_json(event: bytes) -> dict[str, Any] | None:
    """The JSON object in an event's data lines, or None ([DONE], comments, pings, anything else)."""
    payload = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(_DATA))
    if not payload.startswith(b"{"):
        return None
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def generated_text(obj: dict[str, Any]) -> str | None:
    """The text (or tool-call arguments) an OpenAI chunk or a llama.cpp /completion event carries; None when
    it carries none (the role chunk, the finish chunk, usage)."""
    choices = obj.get("choices")
    if type(choices) is list and len(choices) == 1:  # the usual chunk, every event of a stream: fast
        delta = choices[0].get("delta") if type(choices[0]) is dict else None
        if type(delta) is dict and len(delta) == 1 and type(text := delta.get("content")) is str:
            return text or None
    if isinstance(choices, list):
        parts = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in ("content", "reasoning_content", "reasoning"):
                    text = delta.get(key)
                    if isinstance(text, str) and text:
                        parts.append(text)
                for call in delta.get("tool_calls") or ():
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict):
                        parts.append(str(fn.get("name") or "") + str(fn.get("arguments") or ""))
            text = choice.get("text")
            if isinstance(text, str) and text:
                parts.append(text)
        joined = "".join(parts)
        return joined or None
    message = obj.get("message")  # Ollama's /api/chat
    if isinstance(message, dict) and isinstance(text := message.get("content"), str):
        return text or None
    response = obj.get("response")  # Ollama's /api/generate
    if isinstance(response, str):
        return response or None
    content = obj.get("content")  # llama.cpp's own /completion
    return content if isinstance(content, str) and content else None


def _has_finish(obj: dict[str, Any]) -> bool:
    choices = obj.get("choices")
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)


def _finish_reason(obj: dict[str, Any]) -> str | None:
    """The OpenAI answers' `choices[].finish_reason`; llama.cpp's own /completion says `stop_type`
    ("eos", "word", "limit") beside `stop: true`."""
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and isinstance(reason := choice.get("finish_reason"), str):
            return reason
    if obj.get("stop") is True and isinstance(kind := obj.get("stop_type"), str) and kind != "none":
        return "length" if kind == "limit" else "stop"
    if obj.get("done") is True and isinstance(reason := obj.get("done_reason"), str):
        return reason  # Ollama's native API: "stop", "length" (and "load"/"unload" for no prompt)
    return None


def lmstudio_timings(obj: dict[str, Any]) -> dict[str, Any] | None:
    """LM Studio's `stats` on an answer of its REST API (/api/v0/...: tokens_per_second,
    time_to_first_token and generation_time in seconds) as llama.cpp's `timings` say the same figures."""
    stats = obj.get("stats")
    if not isinstance(stats, dict) or not isinstance(stats.get("generation_time"), int | float):
        return None
    usage: dict[str, Any] = obj["usage"] if isinstance(obj.get("usage"), dict) else {}
    ttft = stats.get("time_to_first_token")
    return {"prompt_n": usage.get("prompt_tokens") or 0,
            "prompt_ms": ttft * 1000 if isinstance(ttft, int | float) else None,
            "predicted_n": usage.get("completion_tokens") or 0,
            "predicted_ms": stats["generation_time"] * 1000,
            "predicted_per_second": stats.get("tokens_per_second")}


def ollama_timings(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Ollama's final line (api/types.go Metrics, nanoseconds) as llama.cpp's `timings` say the same
    figures (prompt_n, prompt_ms, predicted_n, predicted_ms): one shape for the proxy's per-request phases."""
    if obj.get("done") is not True or not isinstance(obj.get("eval_count"), int):
        return None
    ns = 1e6
    return {"prompt_n": obj.get("prompt_eval_count") or 0,
            "prompt_ms": (obj.get("prompt_eval_duration") or 0) / ns,
            "predicted_n": obj["eval_count"], "predicted_ms": (obj.get("eval_duration") or 0) / ns}


def _is_usage_chunk(obj: dict[str, Any]) -> bool:
    return obj.get("choices") == [] and "usage" in obj


@dataclass
class StreamReading:
    """What one response said, read as it passed."""

    started: float  # time.monotonic() when the request arrived
    token_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp
    metrics: dict[str, Any] | None = None  # vLLM --enable-per-request-metrics
    model: str | None = None
    error: str | None = None  # an error event inside a 200 stream, or an error answer's message
    error_prompt_tokens: int | None = None  # llama.cpp's n_prompt_tokens beside a refusal for length
    finish_reason: str | None = None  # the first choice's, as the engine gave it

    def take(self, obj: dict[str, Any], now: float) -> None:
        text = generated_text(obj)
        if self.finish_reason is None:
            self.finish_reason = _finish_reason(obj)
        if text is not None:
            self.token_times.append(now)
            self.text.append(text)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            self.timings = obj["timings"]
        elif (ollama := ollama_timings(obj)) is not None:
            self.timings = ollama
            self.usage = {"prompt_tokens": ollama["prompt_n"], "completion_tokens": ollama["predicted_n"]}
        elif (lmstudio := lmstudio_timings(obj)) is not None:
            self.timings = lmstudio
        if isinstance(obj.get("metrics"), dict):
            self.metrics = obj["metrics"]
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        if "error" in obj and isinstance(obj["error"], dict | str):
            err = obj["error"]
            self.error = str(err.get("message") if isinstance(err, dict) else err)
            n_prompt = err.get("n_prompt_tokens") if isinstance(err, dict) else None
            if isinstance(n_prompt, int) and not isinstance(n_prompt, bool):
                self.error_prompt_tokens = n_prompt

    def take_body(self, body: bytes) -> None:
        """A whole non-streamed JSON answer (Ollama's `"stream": false`: its one object)."""
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        self.take(obj, time.monotonic())
        # A whole answer's text is in message.content, not delta: keep it for sessions, no token time.
        for choice in obj.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                self.text.append(message["content"])
        self.token_times.clear()


class StreamRelay:
    """Turns the engine's bytes into the events to send to the client, reading each on the way.

    `injected`: the proxy added include_usage itself, so the usage chunk is the proxy's, not the client's.
    """

    def __init__(self, reading: StreamReading, injected: bool, ndjson: bool = False) -> None:
        self.reading = reading
        self.injected = injected
        self.ndjson = ndjson  # Ollama's native stream: a JSON object a line, not server-sent events
        self._rest = b""
        self._held: tuple[bytes, dict[str, Any]] | None = None  # a finish chunk waiting for the usage chunk

    def feed(self, data: bytes, now: float) -> list[bytes]:
        if self.ndjson:
            *lines, self._rest = (self._rest + data).split(b"\n")
            for line in lines:
                try:
                    obj = orjson.loads(line) if line.strip() else None
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict):
                    self.reading.take(obj, now)
            return [line + b"\n" for line in lines]
        events, self._rest = split_events(self._rest + data)
        out: list[bytes] = []
        for event in events:
            obj = event_json(event)
            if obj is not None:
                self.reading.take(obj, now)
            if not self.injected:
                out.append(event)
                continue
            if obj is not None and _is_usage_chunk(obj):
                out.extend(self._release(obj))
                continue
            out.extend(self._release(None))
            if obj is not None and _has_finish(obj):
                self._held = (event, obj)
            else:
                out.append(event)
        return out

    def close(self) -> list[bytes]:
        """What is left when the engine's stream ends."""
        out = self._release(None)
        if self._rest:
            out.append(self._rest)
            self._rest = b""
        return out

    def _release(self, usage_chunk: dict[str, Any] | None) -> list[bytes]:
        held, self._held = self._held, None
        if held is None:
            return []
        event, obj = held
        moved = {} if usage_chunk is None else {
            k: v for k, v in usage_chunk.items() if k not in USAGE_ONLY_KEYS and k not in obj}
        if not moved:
            return [event]
        return [b"data: " + orjson.dumps({**obj, **moved}) + b"\n\n"]
