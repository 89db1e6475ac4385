"""Findings: the traps of the field report, each detected from an engine's own figures and the traffic
enginetop sees, with the numbers it rests on, since when it holds, and what to try next (tui.findings
judges them).

The evidence a judge reads is plain values too: what the requests showed (TrafficFacts, from the proxy's
requests or a bench run's), what speculative decoding accepted position by position (SpecFacts), and what an
engine's start cost the host (StartMemory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tui.model.config import EngineConfig
from tui.model.samples import RequestStats

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


def accepted_shares(accepted: Sequence[float] | None, drafts: float | None) -> tuple[float, ...] | None:
    """Accepted tokens per draft position as shares of the drafts: the share of drafts whose token at each
    position was accepted (position 1 first). None without drafts. The one place every figure per position is
    made (the dashboard, snapshot, the exporter, the reports)."""
    if accepted is None or drafts is None or drafts <= 0:
        return None
    return tuple(a / drafts for a in accepted)


@dataclass(frozen=True, slots=True)
class PositionAcceptance:
    """One draft position (1 first): its accepted tokens over the drafts that reached it."""

    position: int
    accepted: float
    # The drafts that reached the position: exactly known when every draft reached every position (drafted
    # tokens = drafts x depth); otherwise the least number the counters allow, so `rate` is then the highest
    # acceptance the position can have had
    reached: float
    exact: bool

    @property
    def rate(self) -> float | None:
        return min(1.0, self.accepted / self.reached) if self.reached > 0 else None


@dataclass(frozen=True, slots=True)
class SpecFacts:
    """Speculative decoding over a window (or since the engine started): drafts, drafted and accepted tokens,
    and accepted tokens per draft position (position 1 first). The engines do not publish how many drafts
    reached each position: a draft cut short (p-min, n-min, an n-gram lookup that found nothing) never drafted
    its later positions."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...] = ()

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Share of drafts whose token at each position was accepted."""
        return accepted_shares(self.per_position, self.drafts) or ()

    def positions(self, depth: int) -> tuple[PositionAcceptance, ...] | None:
        """Each position up to `depth` (the configured one) over the drafts that reached it. Those are known
        only when drafted tokens = drafts x depth; otherwise they are bounded: non-increasing with the
        position, at most the drafts, at least the accepted tokens, summing to the drafted tokens; so position
        k was reached by at least max(accepted_k, (drafted - (k-1) x drafts) / (depth - k + 1)) drafts (the
        positions before it full, the ones after as long as it). None when the counters contradict the depth
        (more drafted tokens than drafts x depth, or tokens accepted past it)."""
        d, drafted = self.drafts, self.draft_tokens
        if depth < 1 or d <= 0 or drafted > d * depth + 0.5 or any(a > 0 for a in self.per_position[depth:]):
            return None
        accepted = (*self.per_position[:depth], *(0.0,) * (depth - len(self.per_position)))
        exact = abs(drafted - d * depth) < 0.5
        out = []
        for k, a in enumerate(accepted, start=1):
            reached = d if exact else max(a, (drafted - (k - 1) * d) / (depth - k + 1), 0.0)
            out.append(PositionAcceptance(k, a, min(reached, d), exact))
        return tuple(out)


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
    # The tree's proportional set size at the peak (the pages its processes share counted once, as a sum of
    # RSS does not): None where it could not be read for every process of the tree
    peak_pss_bytes: int | None = None


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
    requests: RequestStats | None = None  # each request's life as the engine timed it (vLLM, SGLang)
