"""RequestStats over a window of one engine's readings: each request's life as the engine published it.
vLLM: `request_queue/prefill/decode_time_seconds`, `e2e_request_latency_seconds`,
`request_prompt/generation_tokens`, `request_success_total{finished_reason}`, `num_preemptions_total`,
`iteration_tokens_total`; SGLang: its queue, e2e and length histograms, retractions. Quantiles come from the
histograms' deltas over the same window as TTFT; a counter that went back (a restart) gives nothing rather
than a figure that cannot be."""

from __future__ import annotations

from collections.abc import Sequence

from tui.model.samples import Buckets, EngineReading, Quantiles, RequestStats
from tui.sources.rates import histogram_quantile


def _delta(prev: Buckets | None, cur: Buckets | None) -> Buckets | None:
    if prev is None or cur is None or [b for b, _ in prev] != [b for b, _ in cur]:
        return None
    out = tuple((b, c - p) for (b, c), (_, p) in zip(cur, prev, strict=True))
    return None if any(c < 0 for _, c in out) or out[-1][1] <= 0 else out


def _quantiles(prev: Buckets | None, cur: Buckets | None) -> Quantiles | None:
    hist = _delta(prev, cur)
    if hist is None:
        return None
    return histogram_quantile(0.5, hist), histogram_quantile(0.9, hist), histogram_quantile(0.99, hist)


def _lengths(prev: EngineReading, cur: EngineReading, field: str) -> Quantiles | None:
    hist = _delta(getattr(prev, f"{field}_buckets"), getattr(cur, f"{field}_buckets"))
    if hist is None:
        return None
    total, before = getattr(cur, f"{field}_sum"), getattr(prev, f"{field}_sum")
    avg = (total - before) / hist[-1][1] if total is not None and before is not None and total >= before \
        else None
    return avg, histogram_quantile(0.5, hist), histogram_quantile(0.9, hist)


def _counter(prev: float | None, cur: float | None) -> float | None:
    return None if prev is None or cur is None or cur < prev else cur - prev


def request_stats(readings: Sequence[tuple[float, EngineReading]],
                  running: Sequence[float | None] | None = None) -> RequestStats | None:
    """Over readings[0]..readings[-1] (monotonic time, reading), oldest first; None where the engine
    publishes none of these series. `running`: see serving."""
    if len(readings) < 2:
        return None
    (t0, first), (t1, last) = readings[0], readings[-1]
    if last.e2e_buckets is None and last.finish_reasons is None and last.queue_buckets is None:
        return None
    window = t1 - t0
    if window <= 0:
        return None
    finish_total = last.finish_reasons or ()
    before = dict(first.finish_reasons or ())
    finish_window = tuple((reason, n - before.get(reason, 0.0)) for reason, n in finish_total
                          if n - before.get(reason, 0.0) > 0)
    if any(n < before.get(reason, 0.0) for reason, n in finish_total):
        finish_window = ()  # it restarted within the window
    ended = _counter(first.requests_finished_total, last.requests_finished_total)
    if ended is None and last.e2e_buckets is not None and first.e2e_buckets is not None:
        # _delta gives None for a window that went back (a restart) or in which nothing ended
        went_back = any(c < p for (_, c), (_, p) in zip(last.e2e_buckets, first.e2e_buckets, strict=False))
        hist = _delta(first.e2e_buckets, last.e2e_buckets)
        ended = hist[-1][1] if hist else None if went_back else 0.0
    steps = _counter(first.iteration_steps_total, last.iteration_steps_total)
    tokens = _counter(first.iteration_tokens_sum, last.iteration_tokens_sum)
    busy_share, gen_tps_serving = serving(readings, running)
    preempted = _counter(first.preemptions_total, last.preemptions_total)
    kv = [r.kv_cache_usage for _, r in readings if r.kv_cache_usage is not None]
    return RequestStats(
        window_s=window, kv_usage_max=max(kv) if kv else None, ended=ended,
        requests_per_s=None if ended is None else ended / window,
        queue_s=_quantiles(first.queue_buckets, last.queue_buckets),
        prefill_s=_quantiles(first.prefill_buckets, last.prefill_buckets),
        decode_s=_quantiles(first.decode_buckets, last.decode_buckets),
        e2e_s=_quantiles(first.e2e_buckets, last.e2e_buckets),
        prompt_len=_lengths(first, last, "prompt_len"), gen_len=_lengths(first, last, "gen_len"),
        finish_window=finish_window, finish_total=finish_total,
        preemptions_per_s=None if preempted is None else preempted / window,
        tokens_per_step=tokens / steps if tokens is not None and steps else None,
        busy_share=busy_share, gen_tps_serving=gen_tps_serving,
    )


def serving(readings: Sequence[tuple[float, EngineReading]],
            running: Sequence[float | None] | None = None) -> tuple[float | None, float | None]:
    """The share of the polls that found a request running, and generation tok/s over that time (any engine
    whose readings say what runs: /metrics, or llama.cpp's /slots). `running`: what every poll over the
    same span found running, where `readings` keeps fewer of them (a recording's report keeps the first and
    the last)."""
    if len(readings) < 2 or readings[-1][0] <= readings[0][0]:
        return None, None
    running = [r.running for _, r in readings] if running is None else list(running)
    if len(running) < 2:
        return None, None
    busy = None if None in running else sum(1 for n in running[1:] if n and n > 0) / (len(running) - 1)
    generated = _counter(readings[0][1].generation_tokens_total, readings[-1][1].generation_tokens_total)
    window = readings[-1][0] - readings[0][0]
    return busy, generated / (window * busy) if generated is not None and busy else None
