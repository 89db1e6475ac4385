"""The exporter's series: every ProbeResult becomes histogram observations, last-value gauges and counters.

prometheus_client owns the registry and the text format. Figures are the ProbeResult's own properties
(ttft_s, server_ttft_s, decode_tps, prefill_tps, cached_share, e2e_s): the same definitions as
`enginetop probe` and the dashboard, never recomputed here.

Labels: engine, workload and model (the id the engine's stream named); token_source on what counts tokens
(`server` = the engine's usage/timings, `chunks` = estimated from stream chunks, which undercount), and
prefill_source on prefill (`server`, or `client-lower-bound` = uncached prompt tokens / client TTFT).
Never a URL or a key: an engine is known by the NAME the user gave it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.process_collector import ProcessCollector

from tui.probe.results import ProbeResult

PREFIX = "enginetop_probe_"
BASE = ("engine", "workload", "model")
UNKNOWN_MODEL = "unknown"

# From a local 270M model on loopback (~5 ms) to a 30k-token prefill on a busy 70B (a minute and more).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# One stream's decode: a CPU demo does ~10-50, a 27B on one GPU ~60-130, a small model on an H200 ~1000+.
DECODE_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)
PREFILL_BUCKETS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000)
# Shares cluster at the ends (a fresh prompt ~0, an agent's later turns ~0.9+): finer buckets there.
SHARE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


def failure_reason(result: ProbeResult) -> str:
    """The `reason` label of a failed request: the client's failure kind, with the status for HTTP."""
    if result.failure == "http" and result.status is not None:
        return f"http_{result.status}"
    return result.failure or "other"


class ProbeMetrics:
    """The exporter's registry. `observe` is called on the probing loop; scrapes read it from server
    threads; prometheus_client's per-metric locks make that safe and keep a scrape from waiting on a probe."""

    def __init__(self, registry: CollectorRegistry | None = None, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        if process:
            # The exporter's own process_cpu_seconds_total, process_resident_memory_bytes... (Linux /proc)
            ProcessCollector(registry=self.registry)
        reg = self.registry
        tok, pre = (*BASE, "token_source"), (*BASE, "prefill_source")

        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: Iterable[float]) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=tuple(buckets), registry=reg)

        def last(name: str, doc: str, labels: tuple[str, ...] = BASE) -> Gauge:
            return Gauge(PREFIX + "last_" + name, doc + " (the last successful probe)", labels, registry=reg)

        self.ttft = hist("ttft_seconds", "Time to first token by the client's clock, from the request's send "
                         "(connection set-up excluded)", BASE, TTFT_BUCKETS)
        self.server_ttft = hist("server_ttft_seconds", "The engine's own time to first token for the probe "
                                "(llama.cpp prompt_ms, vLLM time_to_first_token_ms), where it reports one",
                                BASE, TTFT_BUCKETS)
        self.decode = hist("decode_tokens_per_second", "One stream's decode rate: (completion tokens - 1) / "
                           "(last token - first token)", tok, DECODE_BUCKETS)
        self.prefill = hist("prefill_tokens_per_second", "Prefill rate: the engine's own, or uncached prompt "
                            "tokens / client TTFT (a lower bound)", pre, PREFILL_BUCKETS)
        self.cached = hist("cached_prompt_share", "Share of the prompt served from the prefix cache (agent: "
                           "turns after the first only; the first is a fresh conversation)",
                           BASE, SHARE_BUCKETS)
        self.e2e = hist("e2e_seconds", "Send to the end of the stream, by the client's clock",
                        BASE, E2E_BUCKETS)
        self.last = {
            "ttft": last("ttft_seconds", "Client TTFT"),
            "server_ttft": last("server_ttft_seconds", "The engine's own TTFT"),
            "decode": last("decode_tokens_per_second", "One stream's decode rate", tok),
            "prefill": last("prefill_tokens_per_second", "Prefill rate", pre),
            "cached": last("cached_prompt_share", "Cached prompt share"),
            "e2e": last("e2e_seconds", "End-to-end time"),
        }
        self.completion_tokens = Counter(PREFIX + "completion_tokens", "Output tokens of successful probes "
                                         "(token_source=chunks: estimated, an undercount)", tok, registry=reg)
        self.requests = Counter(PREFIX + "requests", "Probe requests attempted", ("engine", "workload"),
                                registry=reg)
        self.succeeded = Counter(PREFIX + "succeeded", "Probe requests that streamed to their end",
                                 ("engine", "workload"), registry=reg)
        self.failed = Counter(PREFIX + "failed", "Probe requests that failed, by reason (refused, timeout, "
                              "http_STATUS, dropped, protocol, tls, proxy, config)",
                              ("engine", "workload", "reason"), registry=reg)
        self.up = Gauge(PREFIX + "up", "1 if the engine's last probe request succeeded, else 0", ("engine",),
                        registry=reg)
        self.last_time = Gauge(PREFIX + "last_timestamp_seconds", "Unix time of the last probe request's "
                               "send", ("engine", "workload"), registry=reg)
        # (gauge name, engine, workload) -> the label values its current child has: a new model or token
        # source replaces the old child instead of leaving a stale series beside it.
        self._current: dict[tuple[str, str, str], tuple[str, ...]] = {}

    def declare(self, engine: str, workload: str) -> None:
        """Create the counters at 0 before the first probe, so rate() and increase() see the first one."""
        self.requests.labels(engine, workload)
        self.succeeded.labels(engine, workload)

    def observe(self, result: ProbeResult, model: str | None = None) -> None:
        engine, workload = result.engine, result.workload
        self.requests.labels(engine, workload).inc()
        self.last_time.labels(engine, workload).set(result.wall_start)
        self.up.labels(engine).set(1 if result.ok else 0)
        if not result.ok:
            self.failed.labels(engine, workload, failure_reason(result)).inc()
            return
        self.succeeded.labels(engine, workload).inc()
        base = (engine, workload, result.model or model or UNKNOWN_MODEL)
        self._figure("ttft", self.ttft, base, result.ttft_s)
        self._figure("server_ttft", self.server_ttft, base, result.server_ttft_s)
        self._figure("e2e", self.e2e, base, result.e2e_s)
        tok = (*base, result.token_source)
        self._figure("decode", self.decode, tok, result.decode_tps)
        if result.prefill_source is not None:
            self._figure("prefill", self.prefill, (*base, result.prefill_source), result.prefill_tps)
        if not (workload == "agent" and (result.turn or 1) == 1):
            self._figure("cached", self.cached, base, result.cached_share)
        if result.completion_tokens is not None:
            self.completion_tokens.labels(*tok).inc(result.completion_tokens)

    def _figure(self, key: str, histogram: Histogram, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            return
        histogram.labels(*labels).observe(value)
        gauge = self.last[key]
        slot = (key, labels[0], labels[1])
        previous = self._current.get(slot)
        if previous is not None and previous != labels:
            gauge.remove(*previous)
        self._current[slot] = labels
        gauge.labels(*labels).set(value)
