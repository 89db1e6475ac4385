"""Findings: the traps of the field report, each detected from an engine's own figures and the traffic
enginetop sees, with the numbers it rests on, since when it holds, and what to try next (tui.findings
judges them).

The evidence a judge reads is plain values too: what the requests showed (TrafficFacts, from the proxy's
requests or a bench run's), what speculative decoding accepted position by position (SpecFacts), and what an
engine's start cost the host (StartMemory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tui.model.config import EngineConfig

FindingSeverity = Literal["info", "warning", "error"]
Figure = float | int | str | bool | None


@dataclass(frozen=True, slots=True)
class Finding:
    id: str  # stable across reads: "prefix-cache-off", "slots-split", ...
    engine: str
    severity: FindingSeverity
    title: str  # the finding and its figures, in one sentence
    suggestion: str  # the command or flag to try next
    evidence: tuple[str, ...] = ()  # the figures it rests on, where each came from
    figures: tuple[tuple[str, Figure], ...] = ()  # the same, machine-readable (JSON, the exporter)
    since_wall: float | None = None  # when it first held (tui.findings.tracker)

    def json(self) -> dict[str, object]:
        return {"id": self.id, "engine": self.engine, "severity": self.severity, "title": self.title,
                "suggestion": self.suggestion, "evidence": list(self.evidence), "figures": dict(self.figures),
                "since_wall": self.since_wall}


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What one request showed that a finding may rest on."""

    ok: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # served from the engine's prompt/prefix cache, as the engine said
    # Prompt tokens that an earlier request's prompt already began with (from the prompt's tokens, or a
    # workload's hash ids); None while not known (the proxy tokenises after the reply)
    shared_tokens: int | None = None
    ttft_s: float | None = None  # as the client got it
    engine_prompt_s: float | None = None  # the engine's own prefill time for it (llama.cpp prompt_ms)
    refused_for_length: str | None = None  # the engine's own words when it refused the request for its length
    refused_prompt_tokens: int | None = None  # the prompt length the engine said it refused


@dataclass(frozen=True, slots=True)
class TrafficFacts:
    """The evidence of the last `requests` requests (ok ones, and refusals for length)."""

    requests: int = 0  # ok requests
    shared_known: int = 0  # of them, those whose sharing is known
    prompt_tokens: int = 0  # over the requests whose sharing is known
    shared_tokens: int = 0
    cached_tokens: int | None = None  # over the same requests; None when the engine did not say
    prefill_s: float | None = None  # the engine's prefill time over the same requests
    prefill_source: str | None = None  # "engine timings", or "TTFT" (then an upper bound)
    longest_tokens: int | None = None  # prompt + output of the longest request that ran
    refused_for_length: int = 0
    refused_words: str | None = None  # the engine's own words, the last time
    refused_prompt_tokens: int | None = None  # the longest prompt refused
    ttft_p50_s: float | None = None  # over requests with the engine's own prompt time too
    engine_prompt_p50_s: float | None = None
    timed_requests: int = 0  # requests with both
    max_in_flight: int | None = None  # most requests in flight at once (the proxy's count)

    @property
    def computed_rate(self) -> float | None:
        """Prompt tokens prefilled per second of prefill, over the requests whose sharing is known."""
        if self.prefill_s is None or self.prefill_s <= 0:
            return None
        computed = self.prompt_tokens - (self.cached_tokens or 0)
        return computed / self.prefill_s if computed > 0 else None


@dataclass(frozen=True, slots=True)
class SpecFacts:
    """Speculative decoding since the engine started: drafts, drafted and accepted tokens, and accepted tokens
    per draft position (position 0 first)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...] = ()

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Share of drafts whose token at each position was accepted."""
        return tuple(a / self.drafts for a in self.per_position) if self.drafts > 0 else ()


@dataclass(frozen=True, slots=True)
class StartMemory:
    """What an engine's start cost this machine: its process tree's peak RSS and swap while it started,
    against the RAM, and how the start ended (a kill named, and whether the out-of-memory killer did it)."""

    peak_rss_bytes: int
    peak_swap_bytes: int  # the tree's own pages in swap (VmSwap) at the peak
    peak_after_s: float  # seconds after launch
    ram_total_bytes: int
    ram_used_bytes: int  # the host's, at the peak
    swap_used_bytes: int  # the host's, at the peak
    ended: str = "ready"  # "ready", "killed by SIGKILL", "exit code 1", "stopped"
    oom: bool | None = None  # the out-of-memory killer ended it (None: cannot tell, or not killed)
    oom_evidence: str | None = None  # where that was read, or why it cannot be told
    ram_used_at_end_bytes: int | None = None  # the host's when it ended (a kill)
    swap_used_at_end_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything a judge reads about one engine; what is missing is None and never fires a finding."""

    engine: str
    config: EngineConfig | None = None
    traffic: TrafficFacts | None = None
    spec: SpecFacts | None = None
    start: StartMemory | None = None
    concurrency_max: int | None = None  # most requests the engine ran at once while watched
    waiting_max: int | None = None  # most requests waiting at once while watched
    watched_s: float = 0.0  # how long its figures have been read
