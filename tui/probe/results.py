"""Immutable results of probe requests, and the figures derived from them.

Token counts come from the server (`usage`, llama.cpp `timings`, or Ollama's final answer); when a server
sends none, the count of non-empty stream chunks stands in and the result says so (`token_source ==
"chunks"`).
Client-clock times and server-side times are kept apart and labelled; "not available" is None.

Client times are `time.monotonic()` seconds (the dashboard store's clock). TTFT and end-to-end time start
when the request was sent, after the connection was set up; the set-up itself is `connect_s` / `tls_s`.
A figure describes a span, so a plot marker for it belongs at the span's middle: `ttft_at` (send -> first
token: TTFT and client prefill), `decode_at` (first -> last token: decode tok/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from tui.base.stats import median, quantile

TokenSource = Literal["server", "chunks"]
# Why a request failed, in few enough words to be a metric label (the exporter counts failures by it):
# refused (no connection: refused, unreachable, unresolved), timeout (connect, silence or the whole request),
# http (an answer other than 200; `status` says which), dropped (the stream ended before its end),
# protocol (not HTTP, not SSE, bad JSON, an error event), tls, proxy, config (bad URL, a secret in clear).
FailureKind = Literal["refused", "timeout", "http", "dropped", "protocol", "tls", "proxy", "config"]
PrefillSource = Literal["server", "client-lower-bound"]

CHUNK_ESTIMATE_NOTE = "completion tokens estimated from chunks: the server sent no token counts"

# A request not meant to measure the prompt cache with at least this share of its prompt served from it
# measured a cache hit: its TTFT and prefill say nothing about prefill.
CACHE_SERVED_SHARE = 0.5
# Client TTFT over the engine's own TTFT above this is flagged (enginetop probe --ttft-gap-factor).
DEFAULT_TTFT_GAP_FACTOR = 2.0
# Below a few milliseconds a gap is HTTP framing and scheduling noise on any host, whatever the ratio.
MIN_TTFT_GAP_S = 0.005
# A measured cause explains a gap when it is at least this share of it.
CAUSE_SHARE = 0.5


def cache_note(workload: str, turn: int | None, cached: int | None, prompt: int | None) -> str | None:
    """The warning for a probe served from the prompt cache though it meant to measure prefill, or None.

    Agent turns after the first are meant to hit the cache (the conversation grows): no warning there."""
    if cached is None or not prompt or (workload == "agent" and (turn or 1) > 1):
        return None
    if cached / prompt < CACHE_SERVED_SHARE:
        return None
    return f"prompt cache served {cached} of {prompt} prompt tokens: TTFT/prefill measure a cache hit"


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
        return cls(
            source="llamacpp",
            cache_n=_int(timings, "cache_n"),
            prompt_n=_int(timings, "prompt_n"),
            prompt_ms=_num(timings, "prompt_ms"),
            prompt_per_second=_num(timings, "prompt_per_second"),
            predicted_n=_int(timings, "predicted_n"),
            predicted_ms=_num(timings, "predicted_ms"),
            predicted_per_second=_num(timings, "predicted_per_second"),
            draft_n=_int(timings, "draft_n"),
            draft_n_accepted=_int(timings, "draft_n_accepted"),
        )

    @classmethod
    def from_vllm(cls, metrics: dict[str, Any]) -> ServerTimings:
        return cls(
            source="vllm",
            ttft_ms=_num(metrics, "time_to_first_token_ms"),
            queue_ms=_num(metrics, "queue_time_ms"),
            generation_ms=_num(metrics, "generation_time_ms"),
            mean_itl_ms=_num(metrics, "mean_itl_ms"),
            tokens_per_second=_num(metrics, "tokens_per_second"),
        )

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


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One streamed chat completion (or Ollama chat or generate). Times are `time.monotonic()` seconds;
    None = did not happen."""

    engine: str
    url: str
    workload: str
    index: int  # request number within its run
    wall_start: float  # time.time() at send (at the start when nothing was sent), for reports
    sent_at: float | None  # request headers went out, after connecting; None: never sent
    connect_s: float | None = None  # TCP connect (to the proxy, if any)
    tls_s: float | None = None  # TLS handshake(s); None for http://
    first_token_at: float | None = None  # first chunk carrying content or reasoning text
    last_token_at: float | None = None
    ended_at: float | None = None
    status: int | None = None  # HTTP status; None if no response arrived
    error: str | None = None
    failure: FailureKind | None = None  # set with `error`
    model: str | None = None  # the model id the stream's chunks named
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    token_source: TokenSource = "server"
    chunks: int = 0  # chunks with non-empty content/reasoning text
    server: ServerTimings | None = None
    turn: int | None = None  # agent workload: 1-based turn number
    notes: tuple[str, ...] = ()
    text: str = field(default="", repr=False)  # the reply; the agent workload appends it to the chat
    # Between chunks with text, for a bench's percentiles. Not recorded, so not part of what makes two results
    # equal (a replayed probe equals the live one).
    gaps_s: tuple[float, ...] = field(default=(), repr=False, compare=False)
    # The energy its span cost (send to end), set by the store from the device's energy readings around it
    # (tui.live.store): joules, counter or power x time, whose (the engine's GPUs, shared GPUs, the CPU
    # package), or why not ("too short to read": the counter moves every 20-100 ms and is read every second).
    # Derived, like a window's rate: not part of what makes two results equal (a recorded probe has none)
    energy_j: float | None = field(default=None, compare=False)
    energy_source: str | None = field(default=None, compare=False)
    energy_scope: str | None = field(default=None, compare=False)
    energy_note: str | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def estimated(self) -> bool:
        return self.token_source == "chunks"

    @property
    def ttft_s(self) -> float | None:
        """Send -> first token: excludes connecting, includes the network, queueing and prefill."""
        if self.first_token_at is None or self.sent_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def e2e_s(self) -> float | None:
        if self.ended_at is None or self.sent_at is None:
            return None
        return self.ended_at - self.sent_at

    @property
    def ttft_at(self) -> float | None:
        """The monotonic instant TTFT (and client prefill) describe: the middle of send -> first token."""
        if self.first_token_at is None or self.sent_at is None:
            return None
        return (self.sent_at + self.first_token_at) / 2

    @property
    def decode_at(self) -> float | None:
        """The monotonic instant decode tok/s describes: the middle of first -> last token."""
        if self.first_token_at is None or self.last_token_at is None:
            return None
        return (self.first_token_at + self.last_token_at) / 2

    @property
    def server_ttft_s(self) -> float | None:
        """The engine's own TTFT for this request (ServerTimings.ttft_s), when it reported one."""
        return self.server.ttft_s if self.server is not None and self.ok else None

    @property
    def server_queue_s(self) -> float | None:
        return self.server.queue_s if self.server is not None and self.ok else None

    def ttft_gap(self, factor: float = DEFAULT_TTFT_GAP_FACTOR) -> TtftGap | None:
        """The client's TTFT against the engine's, when the client's is over `factor` times larger."""
        client, server = self.ttft_s, self.server_ttft_s
        if client is None or server is None or client - server < MIN_TTFT_GAP_S:
            return None
        if client <= factor * server:
            return None
        return TtftGap(client_s=client, server_s=server, factor=factor,
                       cause=_gap_cause(client - server, server, self.server_queue_s, self.connect_s))

    @property
    def cache_note(self) -> str | None:
        """Set when a request not meant to measure caching was served from the prompt cache anyway."""
        return cache_note(self.workload, self.turn, self.cached_tokens, self.prompt_tokens)

    @property
    def cache_served(self) -> bool:
        return self.cache_note is not None

    @property
    def decode_s(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None:
            return None
        return self.last_token_at - self.first_token_at

    @property
    def decode_tps(self) -> float | None:
        """(completion_tokens - 1) / (last - first): the first token is prefill's, the rest are decode's."""
        span = self.decode_s
        if not self.ok or span is None or span <= 0 or self.completion_tokens is None:
            return None
        if self.completion_tokens < 2:
            return None
        return (self.completion_tokens - 1) / span

    @property
    def server_decode_tps(self) -> float | None:
        return self.server.decode_tps if self.server is not None else None

    @property
    def server_label(self) -> str | None:
        """Whose server-side figures these are ("server (llama.cpp)", "server (Ollama)"), or None."""
        return self.server.label if self.server is not None else None

    @property
    def prefill_source(self) -> PrefillSource | None:
        if self.server_prefill_tps is not None:
            return "server"
        if self._client_prefill_tps() is not None:
            return "client-lower-bound"
        return None

    @property
    def server_prefill_tps(self) -> float | None:
        if self.server is None or not self.ok:
            return None
        if self.server.source in PROMPT_TIMED:
            return self.server.prompt_per_second or None
        if self.server.ttft_ms and self.prompt_tokens is not None and self._uncached_prompt_tokens():
            return self._uncached_prompt_tokens() / (self.server.ttft_ms / 1000.0)
        return None

    def _uncached_prompt_tokens(self) -> int:
        assert self.prompt_tokens is not None
        return max(0, self.prompt_tokens - (self.cached_tokens or 0))

    def _client_prefill_tps(self) -> float | None:
        # Client TTFT includes connect, queueing and the first decode step, so this is a lower bound.
        # Cached tokens are not prefilled; counting them would inflate the figure past any bound.
        ttft = self.ttft_s
        if not self.ok or ttft is None or ttft <= 0 or self.prompt_tokens is None:
            return None
        # A fully cached prompt was not prefilled at all: there is no rate to report.
        return (self._uncached_prompt_tokens() / ttft) or None

    @property
    def prefill_tps(self) -> float | None:
        """Server-side prefill rate when given, else uncached prompt tokens / TTFT (a lower bound)."""
        server = self.server_prefill_tps
        return server if server is not None else self._client_prefill_tps()

    @property
    def cached_share(self) -> float | None:
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens

    @property
    def joules_per_token(self) -> float | None:
        """The probe's energy over the tokens it generated (its prefill's energy included)."""
        if self.energy_j is None or not self.completion_tokens:
            return None
        return self.energy_j / self.completion_tokens

    @property
    def chunk_gap(self) -> int | None:
        """completion_tokens - chunks: tokens that arrived several to a chunk (or as empty chunks)."""
        if self.token_source != "server" or self.completion_tokens is None:
            return None
        return self.completion_tokens - self.chunks

    def to_json(self, ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR) -> dict[str, Any]:
        return {
            "type": "request",
            "engine": self.engine,
            "url": self.url,
            "workload": self.workload,
            "index": self.index,
            "turn": self.turn,
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "finish_reason": self.finish_reason,
            "ttft_s": self.ttft_s,
            "server_ttft_s": self.server_ttft_s,
            "server_queue_s": self.server_queue_s,
            "ttft_gap": gap.to_json() if (gap := self.ttft_gap(ttft_gap_factor)) is not None else None,
            "connect_s": self.connect_s,
            **({"tls_s": self.tls_s} if self.tls_s is not None else {}),
            "decode_tps": self.decode_tps,
            "prefill_tps": self.prefill_tps,
            "prefill_source": self.prefill_source,
            "e2e_s": self.e2e_s,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_share": self.cached_share,
            "cache_served": self.cache_served,
            "chunks": self.chunks,
            "chunk_gap": self.chunk_gap,
            "token_source": self.token_source,
            "estimated_from_chunks": self.estimated,
            "server_decode_tps": self.server_decode_tps,
            "server_prefill_tps": self.server_prefill_tps,
            "server_timings": self.server.to_json() if self.server is not None else None,
            "wall_start": self.wall_start,
            "notes": list(self.notes),
            "energy_j": self.energy_j,
            "joules_per_token": self.joules_per_token,
            "energy_source": self.energy_source,
            "energy_scope": self.energy_scope,
            "energy_note": self.energy_note,
        }


@dataclass(frozen=True, slots=True)
class TtftGap:
    """The client saw the first token much later than the engine says it made it, and the likely cause."""

    client_s: float
    server_s: float
    factor: float  # the threshold it exceeded
    cause: str

    @property
    def ratio(self) -> float:
        return self.client_s / self.server_s if self.server_s > 0 else math.inf

    def text(self) -> str:
        ratio = f"{self.ratio:.1f}x" if math.isfinite(self.ratio) else "engine reported 0"
        return (f"client TTFT {self.client_s * 1000:.0f} ms vs the engine's {self.server_s * 1000:.0f} ms "
                f"({ratio}, flagged above {self.factor:g}x): likely {self.cause}")

    def to_json(self) -> dict[str, Any]:
        return {"client_s": self.client_s, "server_s": self.server_s, "factor": self.factor,
                "ratio": self.ratio if math.isfinite(self.ratio) else None, "cause": self.cause,
                "text": self.text()}


def _gap_cause(gap: float, server: float, queue: float | None, connect: float | None) -> str:
    """Words for the most likely cause of a TTFT gap, chosen from what was measured."""
    if queue is not None and queue >= CAUSE_SHARE * gap:
        return f"queueing: the request waited {queue * 1000:.0f} ms before the engine scheduled it"
    if connect is not None and connect >= CAUSE_SHARE * gap:
        # TTFT starts after the connect, but whatever made connecting slow (a network round trip, or a host
        # too busy to answer promptly) delays the answer too.
        return (f"a slow connection path: connecting alone took {connect * 1000:.0f} ms (a network round "
                "trip, or a host too busy to answer), a delay the request pays again after it is sent")
    measured = f"connect {connect * 1000:.1f} ms" if connect is not None else "connect not measured"
    if queue is not None:
        measured += f", queue {queue * 1000:.1f} ms"
    else:
        # llama.cpp's prompt_ms starts when a slot takes the request: a wait for a free slot is not in it.
        measured += "; the engine reports no queue time: a wait for a free slot would look the same"
    return (f"frontend or detokenizer bound: the engine had the first token after {server * 1000:.0f} ms, "
            f"the stream delivered it {gap * 1000:.0f} ms later ({measured})")


def _one_label(labels: set[str]) -> str | None:
    if not labels:
        return None
    return labels.pop() if len(labels) == 1 else "server (mixed)"


def token_source_of(results: list[ProbeResult]) -> str | None:
    sources = {r.token_source for r in results if r.ok}
    if not sources:
        return None
    return sources.pop() if len(sources) == 1 else "mixed"


@dataclass(frozen=True, slots=True)
class ProbeSummary:
    """Medians over the successful requests of one run; failures are counted, never averaged in."""

    requests: int
    ok: int
    ttft_s_p50: float | None
    ttft_s_p90: float | None
    decode_tps_p50: float | None
    prefill_tps_p50: float | None
    prefill_source: str | None
    server_decode_tps_p50: float | None
    server_ttft_s_p50: float | None
    e2e_s_p50: float | None
    completion_tokens: int
    chunks: int
    token_source: str | None  # "server", "chunks", "mixed", or None when nothing succeeded
    errors: tuple[str, ...]  # distinct error texts, first few
    cache_served: int = 0  # requests a prompt cache served though they meant to measure prefill
    # Whose the server-side medians are ("server (llama.cpp)", "server (Ollama)"; "server (mixed)" when the
    # requests' engines differ), None when no request had any
    server_label: str | None = None

    @property
    def failed(self) -> int:
        return self.requests - self.ok

    @classmethod
    def of(cls, results: list[ProbeResult]) -> ProbeSummary:
        good = [r for r in results if r.ok]
        errors: list[str] = []
        for r in results:
            if r.error is not None and r.error not in errors and len(errors) < 5:
                errors.append(r.error)
        prefill_sources = {r.prefill_source for r in good if r.prefill_source is not None}
        return cls(
            requests=len(results),
            ok=len(good),
            ttft_s_p50=median(r.ttft_s for r in good),
            ttft_s_p90=quantile((r.ttft_s for r in good), 0.9),
            decode_tps_p50=median(r.decode_tps for r in good),
            prefill_tps_p50=median(r.prefill_tps for r in good),
            prefill_source=(prefill_sources.pop() if len(prefill_sources) == 1 else "mixed")
            if prefill_sources
            else None,
            server_decode_tps_p50=median(r.server_decode_tps for r in good),
            server_ttft_s_p50=median(r.server_ttft_s for r in good),
            e2e_s_p50=median(r.e2e_s for r in good),
            completion_tokens=sum(r.completion_tokens or 0 for r in good),
            chunks=sum(r.chunks for r in good),
            token_source=token_source_of(good),
            errors=tuple(errors),
            cache_served=sum(r.cache_served for r in good),
            server_label=_one_label({r.server_label for r in good if r.server_label is not None}),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.failed,
            "ttft_s_p50": self.ttft_s_p50,
            "ttft_s_p90": self.ttft_s_p90,
            "decode_tps_p50": self.decode_tps_p50,
            "prefill_tps_p50": self.prefill_tps_p50,
            "prefill_source": self.prefill_source,
            "server_decode_tps_p50": self.server_decode_tps_p50,
            "server_ttft_s_p50": self.server_ttft_s_p50,
            "e2e_s_p50": self.e2e_s_p50,
            "completion_tokens": self.completion_tokens,
            "chunks": self.chunks,
            "token_source": self.token_source,
            "estimated_from_chunks": self.token_source in ("chunks", "mixed"),
            "errors": list(self.errors),
            "cache_served": self.cache_served,
        }
