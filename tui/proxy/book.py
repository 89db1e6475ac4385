"""The proxy's account of each engine's traffic: requests in flight, and those that ended in the last window,
from which `stats` gives the figures the dashboard shows. Bounded: a record leaves when it ages out of the
window, and the window keeps at most `max_records`."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from tui.base.stats import quantile
from tui.findings.facts import summarize
from tui.model.findings import RequestFacts
from tui.model.samples import Quantiles, RequestStats
from tui.model.slo import RequestFigures, Slo, tpot
from tui.model.traffic import RequestRecord, TrafficStats

WINDOW_S = 60.0
RATE_WINDOW_S = 10.0
SLO_WINDOW_S = 300.0  # "the last minutes" of real traffic an SLO's attainment is taken over
FACTS_REQUESTS = 20  # the findings' evidence: the last requests, however old (tui.findings)


def facts_of(record: RequestRecord) -> RequestFacts:
    return RequestFacts(
        ok=record.outcome == "ok", prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        cached_tokens=record.cached_tokens, ttft_s=record.ttft_s,
        engine_prompt_s=record.engine_prompt_ms / 1000.0 if record.engine_prompt_ms is not None else (
            record.engine_ttft_ms / 1000.0 if record.engine_ttft_ms is not None else None),
        refused_for_length=record.refused_for_length, refused_prompt_tokens=record.refused_prompt_tokens)


def ending(record: RequestRecord) -> str:
    """How a request ended, in the words vLLM's `request_success_total{finished_reason}` uses: the engine's
    own reason; "error" where it failed, "abort" where the client left first."""
    if record.outcome == "abandoned":
        return "abort"
    if record.outcome == "error":
        return "error"
    return record.finish_reason or "unknown"


def _latency(values: list[float]) -> Quantiles | None:
    return (quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99)) if values else None


def per_request(records: list[RequestRecord], span_s: float,
                since_start: Counter[str]) -> RequestStats | None:
    """The requests that ended over `span_s` in an engine's own per-request shape (tui.sources.requests), from
    what each answer said: prefill and decode from llama.cpp's `timings`, end to end as the client saw it."""
    if not records and not since_start:
        return None
    ok = [r for r in records if r.outcome == "ok"]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    prefill = [r.engine_prompt_ms / 1000.0 for r in ok if r.engine_prompt_ms is not None]
    decode = [r.engine_decode_ms / 1000.0 for r in ok if r.engine_decode_ms is not None]
    prompts = [float(r.prompt_tokens) for r in ok if r.prompt_tokens is not None]
    generated = [float(r.completion_tokens) for r in ok if r.completion_tokens is not None]

    def lengths(values: list[float]) -> Quantiles | None:  # avg, p50, p90
        return (sum(values) / len(values), quantile(values, 0.5), quantile(values, 0.9)) if values else None

    window = Counter(ending(r) for r in records)
    unasked = sum(1 for r in ok if r.finish_reason == "length" and (
        r.max_tokens is None or r.completion_tokens is None or r.completion_tokens < r.max_tokens))
    return RequestStats(
        window_s=span_s, ended=float(len(records)),
        requests_per_s=len(records) / span_s if span_s > 0 else None,
        prefill_s=_latency(prefill), decode_s=_latency(decode), e2e_s=_latency(e2e),
        prompt_len=lengths(prompts), gen_len=lengths(generated),
        finish_window=tuple(sorted((k, float(n)) for k, n in window.items())),
        finish_total=tuple(sorted((k, float(n)) for k, n in since_start.items())), origin="proxy",
        length_unasked=float(unasked))


def figures(record: RequestRecord) -> RequestFigures:
    return RequestFigures(record.outcome == "ok", record.ttft_s,
                          tpot(record.ttft_s, record.e2e_s, record.completion_tokens), record.e2e_s,
                          record.itl_max_s)


class TrafficBook:
    def __init__(self, engine: str, window_s: float = WINDOW_S, rate_window_s: float = RATE_WINDOW_S,
                 max_records: int = 100_000) -> None:
        self.engine = engine
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        self.in_flight = 0
        self.total = 0
        self.total_errors = 0
        self.total_abandoned = 0
        self.started = time.monotonic()
        # (monotonic end time, record, its inter-token gaps)
        self._ended: deque[tuple[float, RequestRecord, tuple[float, ...]]] = deque(maxlen=max_records)
        # Headroom (tui.proxy.headroom): the capacity measured for this engine and the SLO it held; each
        # streamed request judged against it as it ends, kept as (end time, met) for SLO_WINDOW_S.
        self.capacity_rps: float | None = None
        self.slo: Slo | None = None
        self._judged: deque[tuple[float, bool]] = deque(maxlen=max_records)
        # The last FACTS_REQUESTS requests that ran or were refused for length, by their number: a prompt's
        # shared prefix is filled in once the proxy has tokenised it (tui.proxy.prompts)
        self._facts: dict[int, RequestFacts] = {}
        self.max_in_flight = 0
        # how each request of the engine's current run ended (`ending`), and when that run's count began
        self.endings: Counter[str] = Counter()
        self.run_started = self.started

    @contextmanager
    def flight(self) -> Iterator[None]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1

    def add(self, record: RequestRecord, gaps: tuple[float, ...] = (), now: float | None = None) -> int:
        """Count a request that ended; its number (for `shared`)."""
        now = time.monotonic() if now is None else now
        self.total += 1
        if record.outcome == "ok" or record.refused_for_length:
            self._facts[self.total] = facts_of(record)
            while len(self._facts) > FACTS_REQUESTS:
                del self._facts[next(iter(self._facts))]
        self.total_errors += record.outcome == "error"
        self.total_abandoned += record.outcome == "abandoned"
        self.endings[ending(record)] += 1
        self._ended.append((now, record, gaps))
        if self.slo is not None and record.stream and record.outcome != "abandoned":
            self._judged.append((now, self.slo.met(figures(record))))
        return self.total

    @property
    def holds_evidence(self) -> bool:
        """Requests of the engine's current run are kept for the findings."""
        return bool(self._facts)

    def new_run(self) -> None:
        """The engine restarted (or went down): the findings' evidence was of its last run. The last requests'
        facts go, and the most in flight at once counts again from those in flight now."""
        self._facts.clear()
        self.max_in_flight = self.in_flight
        self.endings.clear()  # the per-request figures are of a run, as the engine's own counters are
        self.run_started = time.monotonic()

    def shared(self, seq: int, tokens: int | None) -> None:
        """How many of request `seq`'s prompt tokens an earlier prompt began with (None: not known)."""
        if (facts := self._facts.get(seq)) is not None:
            self._facts[seq] = replace(facts, shared_tokens=tokens)

    def recent(self) -> list[RequestRecord]:
        """The records of the window, oldest first."""
        return [r for _, r, _ in self._ended]

    def stats(self, now: float | None = None) -> TrafficStats:
        now = time.monotonic() if now is None else now
        ended = self._ended
        while ended and ended[0][0] < now - self.window_s:
            ended.popleft()
        judged = self._judged
        while judged and judged[0][0] < now - SLO_WINDOW_S:
            judged.popleft()
        records = [r for _, r, _ in ended]
        recent = sum(1 for t, _, _ in ended if t >= now - self.rate_window_s)
        span = min(self.rate_window_s, max(now - self.started, 1e-9))
        ok = [r for r in records if r.outcome == "ok"]
        ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
        gaps = sorted(g for _, r, gs in ended if r.outcome == "ok" for g in gs)
        rates = sorted(tps for r in ok if (tps := r.decode_tps) is not None)
        prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        cached_pairs = [(r.cached_tokens, r.prompt_tokens) for r in ok
                        if r.cached_tokens is not None and r.prompt_tokens]
        cached_share = None
        if cached_pairs:
            cached_share = sum(c for c, _ in cached_pairs) / sum(p for _, p in cached_pairs if p)
        return TrafficStats(
            window_s=self.window_s,
            requests=len(records),
            requests_per_s=recent / span,
            in_flight=self.in_flight,
            errors=sum(r.outcome == "error" for r in records),
            abandoned=sum(r.outcome == "abandoned" for r in records),
            ttft_p50_s=quantile(ttfts, 0.5),
            ttft_p90_s=quantile(ttfts, 0.9),
            itl_p50_s=quantile(gaps, 0.5),
            itl_p90_s=quantile(gaps, 0.9),
            decode_tps_p50=quantile(rates, 0.5),
            prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None,
            cached_share=cached_share,
            total_requests=self.total,
            total_errors=self.total_errors,
            total_abandoned=self.total_abandoned,
            capacity_rps=self.capacity_rps,
            slo=str(self.slo) if self.slo is not None else None,
            slo_met=sum(met for _, met in judged) / len(judged) if judged else None,
            slo_requests=len(judged),
            slo_window_s=SLO_WINDOW_S if self.slo is not None else None,
            facts=summarize(self._facts.values(), self.max_in_flight),
            per_request=per_request([r for t, r, _ in ended if t >= self.run_started],
                                    min(self.window_s, max(now - self.run_started, 1e-9)), self.endings),
        )
