"""Counter semantics over an engine's readings, as plain functions of values: which fields are counters,
whether the engine restarted between two readings, and speculative decoding over a window, draft position by
draft position.

Prometheus' rule: a counter that went down means the engine restarted, and then nothing in the window between
the two readings can be compared (tui.sources.rates voids the whole window). The accepted tokens per draft
position that `spec_window` takes between two readings are what every figure per position is made from
(tui.model.findings.accepted_shares, SpecFacts.positions).
"""

from __future__ import annotations

import operator

from tui.model.findings import SpecFacts
from tui.model.samples import EngineReading

COUNTERS = (
    "prompt_tokens_processed_total",
    "prompt_tokens_computed_total",
    "prompt_tokens_cached_total",
    "generation_tokens_total",
    "generation_seconds_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "spec_drafts_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
    "requests_finished_total",
)
HISTOGRAMS = ("ttft_buckets", "itl_buckets")

counters = operator.attrgetter(*COUNTERS)
_count = operator.itemgetter(1)
_bound = operator.itemgetter(0)


def positions_went_back(prev: tuple[float, ...] | None, cur: tuple[float, ...] | None) -> bool:
    """Accepted tokens at some draft position went down (a position that is missing now is not compared)."""
    return prev is not None and cur is not None and any(map(operator.lt, cur, prev))


def went_back(prev: EngineReading, cur: EngineReading) -> bool:
    """The engine restarted between two readings: another dialect, or a counter, a draft position's count or a
    histogram's count went down."""
    if prev.dialect != cur.dialect:
        return True
    for a, b in zip(counters(prev), counters(cur), strict=True):
        if a is not None and b is not None and b < a:
            return True
    if positions_went_back(prev.spec_accepted_per_pos, cur.spec_accepted_per_pos):
        return True
    for field in HISTOGRAMS:
        p, c = getattr(prev, field), getattr(cur, field)
        # a count went down, and in the same layout (checked second: counts nearly always rise)
        if p is not None and c is not None and any(map(operator.lt, map(_count, c), map(_count, p))) \
                and list(map(_bound, p)) == list(map(_bound, c)):
            return True
    return False


def spec_delta(before: EngineReading | None, after: EngineReading) -> SpecFacts | None:
    """Speculative decoding from `before` to `after` (before None: since the engine started), for a caller
    that knows the engine did not restart between them. None where the engine does not draft (or does not
    say)."""
    if after.spec_drafts_total is None:
        return None

    def delta(a: float | None, b: float | None) -> float:
        return (b or 0.0) - (a or 0.0)

    b = before if before is not None else EngineReading(after.dialect)
    was = b.spec_accepted_per_pos or ()
    # a position that appeared meanwhile counts from 0
    return SpecFacts(delta(b.spec_drafts_total, after.spec_drafts_total),
                     delta(b.spec_draft_tokens_total, after.spec_draft_tokens_total),
                     delta(b.spec_accepted_tokens_total, after.spec_accepted_tokens_total),
                     tuple(p - (was[k] if k < len(was) else 0.0)
                           for k, p in enumerate(after.spec_accepted_per_pos or ())))


def spec_window(before: EngineReading | None, after: EngineReading | None) -> SpecFacts | None:
    """Speculative decoding between two readings of one engine (before None: since it started). None where it
    does not draft, or where it restarted between them: the window's counts are then unknown, never read as
    0 per series."""
    if after is None:
        return None
    if before is not None and went_back(before, after):
        return None
    return spec_delta(before, after)
