"""The engine's own timing of one probe request, read from what each server sends beside the stream:
llama.cpp's `timings`, vLLM's per-request `metrics`, Ollama's final answer (`ServerTimings`); and how every
view names them (`SERVER_LABELS`).

A figure a server did not send, or sent as no number (a bool, NaN, a negative), is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal


def _num(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    # bool is an int in Python; a server sending true is not sending a number.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = _num(obj, key)
    return None if value is None else int(value)


def _ns_ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _per_second(count: int | None, ns: float | None) -> float | None:
    return count / ns * 1e9 if count is not None and ns else None


def _read(obj: dict[str, Any], counts: tuple[str, ...], figures: dict[str, str]) -> dict[str, Any]:
    """ServerTimings' fields from a server's object: `counts`, integers each named as the server names it;
    `figures`, numbers by field -> the server's key."""
    return {**{name: _int(obj, name) for name in counts},
            **{name: _num(obj, key) for name, key in figures.items()}}


# llama.cpp's `timings`, named as here
_LLAMACPP_COUNTS = ("cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted")
_LLAMACPP_FIGURES = {name: name for name in
                     ("prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second")}
# vLLM's per-request `metrics` (--enable-per-request-metrics), by this class's names
_VLLM_FIGURES = {"ttft_ms": "time_to_first_token_ms", "queue_ms": "queue_time_ms",
                 "generation_ms": "generation_time_ms", "mean_itl_ms": "mean_itl_ms",
                 "tokens_per_second": "tokens_per_second"}


TimingSource = Literal["llamacpp", "vllm", "ollama"]
# How every view names the server side of a probe, by whose figures it is.
SERVER_LABELS: dict[str, str] = {"llamacpp": "server (llama.cpp)", "vllm": "server (vLLM)",
                                 "ollama": "server (Ollama)"}
# Sources whose figures are llama.cpp-shaped (a prompt time and count, a decode time, count and rate): the
# engine's own TTFT is its prompt time, its decode and prefill rates are its own.
PROMPT_TIMED: tuple[str, ...] = ("llamacpp", "ollama")


@dataclass(frozen=True, slots=True)
class ServerTimings:
    """Server-side timing of one request, as the engine reported it (llama.cpp `timings`, vLLM `metrics`,
    Ollama's final answer: from_ollama)."""

    source: TimingSource
    # llama.cpp `timings`
    cache_n: int | None = None  # prompt tokens reused from the cache
    prompt_n: int | None = None  # prompt tokens actually processed (Ollama: the whole prompt, cache and all)
    prompt_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None  # first token -> last token
    # llama.cpp: (predicted_n - 1) / predicted_ms; Ollama: eval_count / eval_duration (every token)
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    # vLLM per-request `metrics` (--enable-per-request-metrics)
    ttft_ms: float | None = None  # scheduled -> first token: excludes queueing
    queue_ms: float | None = None
    generation_ms: float | None = None
    mean_itl_ms: float | None = None
    tokens_per_second: float | None = None  # vLLM: all generated tokens / inference interval
    # Ollama's final answer (api.Metrics), besides the counts and times above
    load_ms: float | None = None  # load_duration: the model loaded (or found loaded) for this request
    total_ms: float | None = None  # total_duration: the request's whole time in the server

    @classmethod
    def from_llamacpp(cls, timings: dict[str, Any]) -> ServerTimings:
        return cls(source="llamacpp", **_read(timings, _LLAMACPP_COUNTS, _LLAMACPP_FIGURES))

    @classmethod
    def from_vllm(cls, metrics: dict[str, Any]) -> ServerTimings:
        return cls(source="vllm", **_read(metrics, (), _VLLM_FIGURES))

    @classmethod
    def from_ollama(cls, final: dict[str, Any]) -> ServerTimings:
        """Ollama's last streamed answer (done: true), its api.Metrics in nanoseconds, as llama.cpp's fields:
        prompt_n = prompt_eval_count (the whole prompt, cached tokens included: Ollama does not say how many
        were cached), prompt_ms = prompt_eval_duration, predicted_n = eval_count, predicted_ms =
        eval_duration, load_ms = load_duration, total_ms = total_duration.

        The rates are Ollama's own (api.Metrics.Summary, `ollama run --verbose`): its eval rate counts every
        token over eval_duration, eval_count / eval_duration, where llama.cpp's counts the tokens after the
        first, (predicted_n - 1) / predicted_ms; its prompt eval rate is prompt_eval_count /
        prompt_eval_duration, cached tokens counted over the time of those that were not."""
        # Go's `omitempty` leaves a zero out: on a final answer with its durations, a count left out is 0.
        zero = 0 if _num(final, "total_duration") is not None else None
        prompt_n = _int(final, "prompt_eval_count")
        if prompt_n is None:
            prompt_n = zero
        predicted_n = _int(final, "eval_count")
        if predicted_n is None:
            predicted_n = zero
        prompt_ns, eval_ns = _num(final, "prompt_eval_duration"), _num(final, "eval_duration")
        return cls(
            source="ollama",
            prompt_n=prompt_n,
            prompt_ms=_ns_ms(prompt_ns),
            prompt_per_second=_per_second(prompt_n, prompt_ns),
            predicted_n=predicted_n,
            predicted_ms=_ns_ms(eval_ns),
            predicted_per_second=_per_second(predicted_n, eval_ns),
            load_ms=_ns_ms(_num(final, "load_duration")),
            total_ms=_ns_ms(_num(final, "total_duration")),
        )

    @property
    def label(self) -> str:
        """Whose figures these are, in the words every view uses: "server (llama.cpp)", "server (Ollama)"."""
        return SERVER_LABELS.get(self.source, f"server ({self.source})")

    @property
    def ttft_s(self) -> float | None:
        """The engine's own time to first token: llama.cpp's prompt_ms (slot start -> prompt done; the first
        token is sampled from that last batch), Ollama's prompt_eval_duration (the same, from the runner),
        vLLM's time_to_first_token_ms (scheduled -> first token)."""
        ms = self.prompt_ms if self.source in PROMPT_TIMED else self.ttft_ms
        return None if ms is None else ms / 1000.0

    @property
    def queue_s(self) -> float | None:
        """Time the request waited before the engine scheduled it (vLLM only; llama.cpp does not say)."""
        return None if self.queue_ms is None else self.queue_ms / 1000.0

    @property
    def decode_tps(self) -> float | None:
        """Server-side decode rate: llama.cpp's and Ollama's own figure; for vLLM 1 / mean inter-token
        latency."""
        if self.source in PROMPT_TIMED:
            return self.predicted_per_second or None
        if self.mean_itl_ms:
            return 1000.0 / self.mean_itl_ms
        return None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}
