"""Immutable results of probe requests, the figures derived from them, and their summary over a run.

Token counts come from the server (`usage`, llama.cpp `timings`, or Ollama's final answer); when a server
sends none, the count of non-empty stream chunks stands in and the result says so (`token_source ==
"chunks"`).
Client-clock times and server-side times are kept apart and labelled; "not available" is None.

Client times are `time.monotonic()` seconds (the dashboard store's clock). TTFT and end-to-end time start
when the request was sent, after the connection was set up; the set-up itself is `connect_s` / `tls_s`.
A figure describes a span, so a plot marker for it belongs at the span's middle: `ttft_at` (send -> first
token: TTFT and client prefill), `decode_at` (first -> last token: decode tok/s).

The engine's own figures for a request are tui.probe.timings; a client TTFT flagged against them,
tui.probe.ttft_gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tui.base.stats import median, quantile
from tui.probe.timings import PROMPT_TIMED, ServerTimings
from tui.probe.ttft_gap import TtftGap, flag_ttft_gap

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


def cache_note(workload: str, turn: int | None, cached: int | None, prompt: int | None) -> str | None:
    """The warning for a probe served from the prompt cache though it meant to measure prefill, or None.

    Agent turns after the first are meant to hit the cache (the conversation grows): no warning there."""
    if cached is None or not prompt or (workload == "agent" and (turn or 1) > 1):
        return None
    if cached / prompt < CACHE_SERVED_SHARE:
        return None
    return f"prompt cache served {cached} of {prompt} prompt tokens: TTFT/prefill measure a cache hit"


def _span(start: float | None, end: float | None) -> float | None:
    """Seconds from `start` to `end`; None unless both happened."""
    return None if start is None or end is None else end - start


def _middle(start: float | None, end: float | None) -> float | None:
    """The instant halfway from `start` to `end`, where a figure of that span is plotted; None unless both
    happened."""
    return None if start is None or end is None else (start + end) / 2


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
        return _span(self.sent_at, self.first_token_at)

    @property
    def e2e_s(self) -> float | None:
        return _span(self.sent_at, self.ended_at)

    @property
    def ttft_at(self) -> float | None:
        """The monotonic instant TTFT (and client prefill) describe: the middle of send -> first token."""
        return _middle(self.sent_at, self.first_token_at)

    @property
    def decode_at(self) -> float | None:
        """The monotonic instant decode tok/s describes: the middle of first -> last token."""
        return _middle(self.first_token_at, self.last_token_at)

    @property
    def server_ttft_s(self) -> float | None:
        """The engine's own TTFT for this request (ServerTimings.ttft_s), when it reported one."""
        return self.server.ttft_s if self.server is not None and self.ok else None

    @property
    def server_queue_s(self) -> float | None:
        return self.server.queue_s if self.server is not None and self.ok else None

    def ttft_gap(self, factor: float = DEFAULT_TTFT_GAP_FACTOR) -> TtftGap | None:
        """The client's TTFT against the engine's, when the client's is over `factor` times larger."""
        return flag_ttft_gap(self.ttft_s, self.server_ttft_s, factor, self.server_queue_s, self.connect_s)

    @property
    def cache_note(self) -> str | None:
        """Set when a request not meant to measure caching was served from the prompt cache anyway."""
        return cache_note(self.workload, self.turn, self.cached_tokens, self.prompt_tokens)

    @property
    def cache_served(self) -> bool:
        return self.cache_note is not None

    @property
    def decode_s(self) -> float | None:
        return _span(self.first_token_at, self.last_token_at)

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
