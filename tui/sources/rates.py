"""Rates and latency quantiles over the window between two readings of the same engine.

Counter semantics follow Prometheus: a value that went down means the engine restarted. When that
happens anywhere in the reading, every delta of the window is void (None, `counter_reset=True`):
counters that did not go down are just as meaningless after a restart (the new run may already have
passed the old value), and showing a huge or negative rate would be worse than a gap.

A rate from too few tokens or too short a time is None too (shown "–"), never a figure that cannot be:
right after a readiness check llama.cpp counted 1 token over ~1 µs of decode time, "1000000.0 tok/s".
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from itertools import compress

from tui.model.counters import COUNTERS as _COUNTERS
from tui.model.counters import HISTOGRAMS as _HISTOGRAMS
from tui.model.counters import counters as _counters
from tui.model.counters import positions_went_back, spec_delta
from tui.model.counters import went_back as went_back  # the store and the config re-read ask it here
from tui.model.findings import accepted_shares
from tui.model.samples import Buckets, EngineReading, EngineStats

# Tokens per busy second (llama.cpp's decode time): each request's first token comes from the prompt's last
# batch and costs no decode time, so n tokens are timed over n-1 steps and one request reads n/(n-1) high.
# 32 tokens keep that under 3.3 %, and a 1-token request (readiness check, time ~0) can never make a figure.
MIN_BUSY_TOKENS = 32
# Below 10 ms of busy time the counter holds a request or two of timer and scheduling noise, not decoding.
MIN_BUSY_S = 0.01
# Tokens per second of wall time: the window is the gap between two polls, each timed when its answer came
# back, with tens of ms of jitter; llama.cpp also adds a request's tokens at its end. A shorter window than
# this turns one request into a spike several times the real rate.
MIN_WINDOW_S = 0.25



class _Reset(Exception):
    pass


def histogram_quantile(q: float, buckets_delta: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus `histogram_quantile` on cumulative (upper_bound, count) buckets, sorted by bound.

    Linear interpolation inside the bucket holding rank q*total; the first bucket starts at 0 (if its
    bound is positive); a rank in the +Inf bucket returns the highest finite bound. None when there are
    no observations, no +Inf bucket, or fewer than two buckets (all three are NaN in Prometheus).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    if len(buckets_delta) < 2 or not math.isinf(buckets_delta[-1][0]):
        return None
    bounds = [b for b, _ in buckets_delta]
    counts = list(map(_count, buckets_delta))
    if not all(map(operator.le, counts, counts[1:])):
        # Like Prometheus' ensureMonotonic: scrape races can make a cumulative count dip; never go backwards.
        # (Checked first, in C: counts nearly always rise, and a replay seek takes thousands of quantiles.)
        rising: list[float] = []
        for c in counts:
            rising.append(max(c, rising[-1]) if rising else c)
        counts = rising
    total = counts[-1]
    if not total > 0:
        return None
    rank = q * total
    # `c > 0` only matters for q == 0: the answer is then the lower edge of the first non-empty bucket.
    b = next(i for i, c in enumerate(counts) if c >= rank and c > 0)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end = (0.0, bounds[0]) if b == 0 else (bounds[b - 1], bounds[b])
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    return start + (end - start) * ((rank - below) / in_bucket)


_bound = operator.itemgetter(0)
_count = operator.itemgetter(1)
_below_zero = (0.0).__gt__


def _bucket_delta(prev: Buckets | None, cur: Buckets | None) -> Buckets | None:
    if prev is None or cur is None:
        return None
    bounds = list(map(_bound, prev))
    if bounds != list(map(_bound, cur)):
        return None  # bucket layout changed (engine restarted with other buckets): nothing comparable
    # map() over whole rows, not a loop per bucket: a vLLM reading has ~40 buckets, and a replay seek
    # derives hundreds of readings (bench/bench_record.py)
    deltas = list(map(operator.sub, map(_count, cur), map(_count, prev)))
    if any(map(_below_zero, deltas)):
        raise _Reset
    return tuple(zip(bounds, deltas, strict=True))


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _busy_rate(tokens: float | None, seconds: float | None) -> float | None:
    if tokens is None or seconds is None or tokens < MIN_BUSY_TOKENS or seconds < MIN_BUSY_S:
        return None
    return tokens / seconds


def _ended(generated: float | None, prev: EngineReading, cur: EngineReading) -> float | None:
    """The generated tokens of the requests that ended in the window: llama.cpp's busy seconds move only when
    a request ends, so the tokens counted ahead of its counter while requests run (generation_in_progress)
    are left out of tokens per busy second."""
    if generated is None:
        return None
    return generated - (cur.generation_in_progress or 0.0) + (prev.generation_in_progress or 0.0)


def _computed(d: dict[str, float | None]) -> float | None:
    """Prompt tokens prefilled in the window: the engine's own count, else processed minus cached."""
    if d["prompt_tokens_computed_total"] is not None:
        return d["prompt_tokens_computed_total"]
    processed, cached = d["prompt_tokens_processed_total"], d["prompt_tokens_cached_total"]
    if processed is None or cached is None or cached > processed:
        return None  # two counters scraped between their two updates: no figure rather than a wrong one
    return processed - cached


_Deltas = tuple[dict[str, float | None], dict[str, Buckets | None]]


def _deltas(prev: EngineReading, cur: EngineReading) -> _Deltas:
    """Counter and bucket deltas; raises _Reset when the engine restarted between the two readings."""
    if prev.dialect != cur.dialect:
        raise _Reset  # another engine answers on this URL now
    d: dict[str, float | None] = {}
    for field, a, b in zip(_COUNTERS, _counters(prev), _counters(cur), strict=True):
        if a is None or b is None:
            d[field] = None
        elif b < a:
            raise _Reset
        else:
            d[field] = b - a
    if positions_went_back(prev.spec_accepted_per_pos, cur.spec_accepted_per_pos):
        raise _Reset
    hist = {f: _bucket_delta(getattr(prev, f), getattr(cur, f)) for f in _HISTOGRAMS}
    return d, hist


def spec_totals(cur: EngineReading) -> tuple[float | None, float | None, tuple[float, ...] | None]:
    """Acceptance rate, mean accepted length and acceptance per position since the engine started: its
    counters' totals, so there are figures even when no request ran between two readings."""
    drafts, drafted = cur.spec_drafts_total, cur.spec_draft_tokens_total
    accepted = cur.spec_accepted_tokens_total
    rate = _ratio(accepted, drafted)
    per_draft = _ratio(accepted, drafts)
    length = None if per_draft is None else 1.0 + per_draft
    return rate, length, accepted_shares(cur.spec_accepted_per_pos, drafts)


def derive(prev: EngineReading, prev_t: float, cur: EngineReading, cur_t: float,
           quantiles: bool = True) -> EngineStats:
    """Stats for the window prev_t..cur_t (monotonic seconds). Gauge fallbacks come from `cur`.
    quantiles=False leaves TTFT and ITL out (None): for a window only its rates are read from."""
    dt = cur_t - prev_t
    if dt <= 0:
        return EngineStats()
    gauges = {
        "hit": cur.cache_hit_rate_gauge,
        "rate": cur.spec_accept_rate_gauge,
        "length": cur.spec_accept_length_gauge,
    }
    try:
        d, hist = _deltas(prev, cur)
    except _Reset:
        return EngineStats(counter_reset=True)

    def rate(tokens: float | None) -> float | None:
        return None if tokens is None or dt < MIN_WINDOW_S else tokens / dt

    def quantile(field: str, q: float) -> float | None:
        buckets = hist[field]
        return None if not quantiles or buckets is None else histogram_quantile(q, buckets)

    # The counters win whenever the engine has them; the engine's own gauges only stand in when it does not.
    counters_hit = d["prefix_cache_queries_total"] is not None and d["prefix_cache_hits_total"] is not None
    hit_rate = _ratio(d["prefix_cache_hits_total"], d["prefix_cache_queries_total"]) if counters_hit \
        else gauges["hit"]
    counters_rate = d["spec_accepted_tokens_total"] is not None and d["spec_draft_tokens_total"] is not None
    accept_rate = _ratio(d["spec_accepted_tokens_total"], d["spec_draft_tokens_total"]) if counters_rate \
        else gauges["rate"]
    counters_len = d["spec_accepted_tokens_total"] is not None and d["spec_drafts_total"] is not None
    if counters_len:
        per_draft = _ratio(d["spec_accepted_tokens_total"], d["spec_drafts_total"])
        accept_length = None if per_draft is None else 1.0 + per_draft
    else:
        accept_length = gauges["length"]
    total_rate, total_length, total_pos = spec_totals(cur)
    return EngineStats(
        prompt_processed_tps=rate(d["prompt_tokens_processed_total"]),
        prompt_computed_tps=rate(_computed(d)),
        gen_tps=rate(d["generation_tokens_total"]),
        decode_tps_busy=_busy_rate(_ended(d["generation_tokens_total"], prev, cur),
                                   d["generation_seconds_total"]),
        prefix_cache_hit_rate=hit_rate,
        spec_accept_rate=accept_rate,
        spec_accept_length=accept_length,
        spec_accept_per_pos=_window_shares(prev, cur),
        spec_drafts_per_s=rate(d["spec_drafts_total"]),
        spec_accept_rate_total=total_rate,
        spec_accept_length_total=total_length,
        spec_accept_per_pos_total=total_pos,
        ttft_p50_s=quantile("ttft_buckets", 0.5),
        ttft_p90_s=quantile("ttft_buckets", 0.9),
        itl_p50_s=quantile("itl_buckets", 0.5),
        itl_p90_s=quantile("itl_buckets", 0.9),
    )


def _window_shares(prev: EngineReading, cur: EngineReading) -> tuple[float, ...] | None:
    """Acceptance per draft position over a window in which nothing went back (tui.model.counters)."""
    if None in (prev.spec_accepted_per_pos, cur.spec_accepted_per_pos, prev.spec_drafts_total):
        return None
    spec = spec_delta(prev, cur)
    return accepted_shares(spec.per_position, spec.drafts) if spec is not None else None


def shape(r: EngineReading) -> tuple[object, ...]:
    """What a run of readings shares: the dialect, which counters the engine gives, and which histograms
    with which bucket bounds. Across readings of one shape that each did not go back from the one before,
    nothing went back: a counter can only have gone down unseen where it was missing for a while, and a
    count where the buckets changed. So a store that checked each reading against the one before need not
    compare two readings further apart (see `chained` below)."""
    return (r.dialect, tuple(map(type, _counters(r))), _bounds(r.ttft_buckets), _bounds(r.itl_buckets))


def _bounds(buckets: Buckets | None) -> tuple[float, ...] | None:
    return None if buckets is None else tuple(map(_bound, buckets))


def present(shape_: tuple[object, ...]) -> tuple[bool, ...]:
    """Which counters a reading of this shape has (for went_back_same_shape)."""
    return tuple(t is not type(None) for t in shape_[1])  # type: ignore[attr-defined]  # shape's item 1: types


def went_back_same_shape(prev: EngineReading, cur: EngineReading, has: tuple[bool, ...]) -> bool:
    """went_back(prev, cur) for two readings of one shape, `has` = present(that shape): the same test, with
    the comparisons made in C (a replay seek checks every reading of minutes of plots)."""
    if any(map(operator.lt, compress(_counters(cur), has), compress(_counters(prev), has))):
        return True
    if positions_went_back(prev.spec_accepted_per_pos, cur.spec_accepted_per_pos):
        return True
    for field in _HISTOGRAMS:
        p, c = getattr(prev, field), getattr(cur, field)
        if p is not None and any(map(operator.lt, map(_count, c), map(_count, p))):
            return True
    return False


# What the plots draw for every reading (tui.live.store.ENGINE_SERIES), alone: when a replay seeks, it
# rebuilds minutes of plots at once, and derive() makes every figure for every reading. Each gives exactly the
# figure derive() gives for the same window (tests/test_store.py holds them to it). `chained`: the caller
# knows that nothing went back from prev to cur (readings of one shape, each checked against the last).


def gen_tps(prev: EngineReading, prev_t: float, cur: EngineReading, cur_t: float,
            chained: bool = False) -> float | None:
    """derive(prev, prev_t, cur, cur_t).gen_tps"""
    a, b = prev.generation_tokens_total, cur.generation_tokens_total
    dt = cur_t - prev_t
    if a is None or b is None or dt < MIN_WINDOW_S or (not chained and went_back(prev, cur)):
        return None
    return (b - a) / dt


def ttft_p50(prev: EngineReading, prev_t: float, cur: EngineReading, cur_t: float,
             chained: bool = False) -> float | None:
    """derive(prev, prev_t, cur, cur_t).ttft_p50_s"""
    if prev.ttft_buckets is None or cur.ttft_buckets is None or cur_t <= prev_t or \
            (not chained and went_back(prev, cur)):
        return None
    hist = _bucket_delta(prev.ttft_buckets, cur.ttft_buckets)
    return None if hist is None else histogram_quantile(0.5, hist)
