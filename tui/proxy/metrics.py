"""The proxy's own Prometheus series, served at tui.base.defaults.METRICS_PATH (a path no engine uses),
labelled by engine and model. Each proxy has its own registry, so two proxies in one process (tests, the
dashboard's) never share a series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tui.model.traffic import RequestRecord

# TTFT and end-to-end from 5 ms to 5 min; inter-token gaps from 1 ms to 10 s.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 10.0)


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("engine", "model")
        r = self.registry
        self.ttft = Histogram("enginetop_proxy_time_to_first_token_seconds",
                              "Request received to first token relayed, as the client saw it", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("enginetop_proxy_inter_token_latency_seconds",
                             "Gaps between relayed events that carried generated text", labels,
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("enginetop_proxy_request_duration_seconds",
                             "Request received to last byte relayed", labels, buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.requests = Counter("enginetop_proxy_requests",
                                "Requests that ended, by engine status and outcome",
                                (*labels, "status", "outcome"), registry=r)
        self.prompt_tokens = Counter("enginetop_proxy_prompt_tokens",
                                     "Prompt tokens, as the engine counted them", labels, registry=r)
        self.completion_tokens = Counter("enginetop_proxy_completion_tokens",
                                         "Generated tokens, as the engine counted them", labels, registry=r)
        self.cached_tokens = Counter("enginetop_proxy_cached_prompt_tokens",
                                     "Prompt tokens the engine served from its cache", labels, registry=r)
        self.in_flight = Gauge("enginetop_proxy_requests_in_flight", "Requests being relayed now", labels,
                               registry=r)

    def observe(self, record: RequestRecord, gaps: tuple[float, ...]) -> None:
        labels = (record.engine, record.model or "")
        status = "none" if record.status is None else str(record.status)
        self.requests.labels(*labels, status, record.outcome).inc()
        if record.ttft_s is not None:
            self.ttft.labels(*labels).observe(record.ttft_s)
        if record.e2e_s is not None and record.outcome == "ok":
            self.e2e.labels(*labels).observe(record.e2e_s)
        if gaps:
            itl = self.itl.labels(*labels)
            for gap in gaps:
                itl.observe(gap)
        if record.prompt_tokens:
            self.prompt_tokens.labels(*labels).inc(record.prompt_tokens)
        if record.completion_tokens:
            self.completion_tokens.labels(*labels).inc(record.completion_tokens)
        if record.cached_tokens:
            self.cached_tokens.labels(*labels).inc(record.cached_tokens)

    def text(self) -> bytes:
        return generate_latest(self.registry)
