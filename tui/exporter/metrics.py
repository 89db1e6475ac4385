"""The exporter's series: every ProbeResult becomes histogram observations, last-value gauges and counters.

prometheus_client owns the registry and the text format. Figures are the ProbeResult's own properties
(ttft_s, server_ttft_s, decode_tps, prefill_tps, cached_share, e2e_s): the same definitions as
`enginetop probe` and the dashboard, never recomputed here.

Labels: engine, workload and model (the id the engine's stream named); token_source on what counts tokens
(`server` = the engine's usage/timings, `chunks` = estimated from stream chunks, which undercount), and
prefill_source on prefill (`server`, or `client-lower-bound` = uncached prompt tokens / client TTFT).
Never a URL or a key: an engine is known by the NAME the user gave it.

Each (engine, workload) keeps its series in a registry of its own, rendered to text by prometheus_client
when a probe changes it; a scrape joins the rendered pieces, family by family. Rendering everything at
each scrape took 0.4 s at 50 engines x 4 workloads (22k lines at ~19 us each), and a scrape must answer
in milliseconds; rendering one pair after its probe costs ~2 ms.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.process_collector import ProcessCollector

from tui.model.containers import CgroupReading, CgroupUse, Container
from tui.model.findings import Finding
from tui.model.samples import EngineStats, GpuReport, HostSample
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


class _Pair:
    """One (engine, workload)'s series, in a registry of their own."""

    def __init__(self, engine: str, workload: str) -> None:
        self.engine, self.workload = engine, workload
        self.registry = reg = CollectorRegistry()
        tok, pre = (*BASE, "token_source"), (*BASE, "prefill_source")

        def hist(name: str, doc: str, labels: tuple[str, ...], buckets: Iterable[float]) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=tuple(buckets), registry=reg)

        def last(name: str, doc: str, labels: tuple[str, ...] = BASE) -> Gauge:
            return Gauge(PREFIX + "last_" + name, doc + " (the last successful probe)", labels, registry=reg)

        self.hist = {
            "ttft": hist("ttft_seconds", "Time to first token by the client's clock, from the request's "
                         "send (connection set-up excluded)", BASE, TTFT_BUCKETS),
            "server_ttft": hist("server_ttft_seconds", "The engine's own time to first token for the probe "
                                "(llama.cpp prompt_ms, Ollama prompt_eval_duration, vLLM "
                                "time_to_first_token_ms), where it reports one",
                                BASE, TTFT_BUCKETS),
            "decode": hist("decode_tokens_per_second", "One stream's decode rate: (completion tokens - 1) / "
                           "(last token - first token)", tok, DECODE_BUCKETS),
            "prefill": hist("prefill_tokens_per_second", "Prefill rate: the engine's own, or uncached prompt "
                            "tokens / client TTFT (a lower bound)", pre, PREFILL_BUCKETS),
            "cached": hist("cached_prompt_share", "Share of the prompt served from the prefix cache "
                           "(agent: turns after the first only; the first is a fresh conversation)",
                           BASE, SHARE_BUCKETS),
            "e2e": hist("e2e_seconds", "Send to the end of the stream, by the client's clock", BASE,
                        E2E_BUCKETS),
        }
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
        pair = ("engine", "workload")
        # Created at 0 with the pair, so rate() and increase() see the first probe and the first failure.
        self.requests = Counter(PREFIX + "requests", "Probe requests attempted", pair,
                                registry=reg).labels(engine, workload)
        self.succeeded = Counter(PREFIX + "succeeded", "Probe requests that streamed to their end", pair,
                                 registry=reg).labels(engine, workload)
        self.failed = Counter(PREFIX + "failed", "Probe requests that failed, by reason (refused, timeout, "
                              "http_STATUS, dropped, protocol, tls, proxy, config)", (*pair, "reason"),
                              registry=reg)
        self.last_time = Gauge(PREFIX + "last_timestamp_seconds", "Unix time of the last probe request's "
                               "send", pair, registry=reg).labels(engine, workload)
        # gauge key -> the label values of its one child: a new model or token source replaces the child
        # instead of leaving a stale series beside it
        self._current: dict[str, tuple[str, ...]] = {}
        self.families: dict[str, tuple[bytes, bytes]] = {}
        self.render()

    def observe(self, result: ProbeResult, model: str | None) -> None:
        self.requests.inc()
        self.last_time.set(result.wall_start)
        if not result.ok:
            self.failed.labels(self.engine, self.workload, failure_reason(result)).inc()
            return
        self.succeeded.inc()
        base = (self.engine, self.workload, result.model or model or UNKNOWN_MODEL)
        self._figure("ttft", base, result.ttft_s)
        self._figure("server_ttft", base, result.server_ttft_s)
        self._figure("e2e", base, result.e2e_s)
        tok = (*base, result.token_source)
        self._figure("decode", tok, result.decode_tps)
        if result.prefill_source is not None:
            self._figure("prefill", (*base, result.prefill_source), result.prefill_tps)
        if not (self.workload == "agent" and (result.turn or 1) == 1):
            self._figure("cached", base, result.cached_share)
        if result.completion_tokens is not None:
            self.completion_tokens.labels(*tok).inc(result.completion_tokens)

    def _figure(self, key: str, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            return
        self.hist[key].labels(*labels).observe(value)
        gauge = self.last[key]
        previous = self._current.get(key)
        if previous is not None and previous != labels:
            gauge.remove(*previous)
        self._current[key] = labels
        gauge.labels(*labels).set(value)

    def render(self) -> None:
        self.families = split_families(generate_latest(self.registry))


def split_families(text: bytes) -> dict[str, tuple[bytes, bytes]]:
    """prometheus_client's text output, by metric family: name -> (HELP and TYPE lines, sample lines)."""
    families: dict[str, tuple[bytes, bytes]] = {}
    # At a line's start only: a label value may hold "# HELP " (a newline in it is escaped, never raw).
    for block in (b"\n" + text).split(b"\n# HELP ")[1:]:
        name = block.split(b" ", 1)[0].decode()
        help_line, type_line, samples = [*block.split(b"\n", 2), b"", b""][:3]
        samples = samples.strip(b"\n")  # the separator took one family's last newline, not the last one's
        families[name] = (b"# HELP " + help_line + b"\n" + type_line + b"\n",
                          samples + b"\n" if samples else b"")
    return families


class _EnergyCounters:
    """`enginetop_energy_joules_total{device,vendor}`: each device's own energy counter as last read (a GPU's
    NVML total energy since its driver loaded, hwmon's energy1_input; the CPU packages' RAPL counter, its
    wraps undone since the exporter started), so `rate()` over it is the device's power."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def set(self, values: dict[tuple[str, str], float]) -> None:
        with self._lock:
            self.values = dict(values)

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily("enginetop_energy_joules", "a device's own energy counter (GPU: NVML or "
                                     "hwmon; cpu-package: RAPL), joules", labels=("device", "vendor"))
        with self._lock:
            for (device, vendor), value in sorted(self.values.items()):
                family.add_metric((device, vendor), value)
        yield family


class ProbeMetrics:
    """The exporter's series. `observe` runs on the probing loop and renders what it changed; `exposition`
    runs on the server's threads and only joins rendered text, so a scrape never waits on a probe or on
    prometheus_client rendering the whole fleet."""

    def __init__(self, process: bool = True) -> None:
        self._pairs: dict[tuple[str, str], _Pair] = {}
        self._lock = threading.Lock()  # the pair table and each pair's rendered text change under it
        # The pairs' text joined, as of a version of them: between probes a scrape reuses it.
        self._version = 0
        self._joined: tuple[int, dict[str, tuple[bytes, bytes]]] = (-1, {})
        self.shared = CollectorRegistry()  # small: rendered at each scrape
        if process:
            # The exporter's own process_cpu_seconds_total, process_resident_memory_bytes... (Linux /proc)
            ProcessCollector(registry=self.shared)
        self.up = Gauge(PREFIX + "up", "1 if the engine's last probe request succeeded, else 0", ("engine",),
                        registry=self.shared)
        # What each engine's own figures and configuration say (tui.exporter.watch): its findings, 1 while one
        # holds (gone when it clears), and its speculative decoding since it started
        self.finding = Gauge("enginetop_finding", "1 while a finding holds for the engine (tui.findings)",
                             ("engine", "id", "severity"), registry=self.shared)
        self.spec_rate = Gauge("enginetop_spec_acceptance_rate", "accepted / drafted tokens since the engine "
                               "started", ("engine",), registry=self.shared)
        self.spec_length = Gauge("enginetop_spec_mean_accepted_length", "tokens a draft step gives since the "
                                 "engine started: 1 + accepted / drafts", ("engine",), registry=self.shared)
        self.spec_position = Gauge("enginetop_spec_acceptance_per_position", "share of drafts whose token at "
                                   "a position (1 first) was accepted, since the engine started",
                                   ("engine", "position"), registry=self.shared)
        # Each request's life as the engine timed it, over the latency window (vLLM, SGLang), or as the
        # answers relayed by enginetop's proxy said it (llama.cpp, with the exporter's --traffic)
        self.request_seconds = Gauge(
            "enginetop_request_seconds", "a request's time in a phase (queue, prefill, decode, e2e) at a "
            "quantile, from the engine's own histograms (llama.cpp: the answers relayed by enginetop's "
            "proxy) over the last minute",
            ("engine", "phase", "quantile"), registry=self.shared)
        self.request_tokens = Gauge(
            "enginetop_request_tokens", "a request's prompt or generation length (avg, 0.5, 0.9), from the "
            "engine's own histograms (llama.cpp: the proxy's answers) over the last minute",
            ("engine", "kind", "quantile"),
            registry=self.shared)
        self.requests_ended = Gauge(
            "enginetop_requests_ended", "requests that ended in the last minute, by the engine's finish "
            "reason (llama.cpp: as its answers through enginetop's proxy gave it)", ("engine", "reason"),
            registry=self.shared)
        self.request_rates = Gauge(
            "enginetop_request_rate", "per second over the last minute: requests ended, preemptions",
            ("engine", "what"), registry=self.shared)
        self.busy_share = Gauge(
            "enginetop_busy_share", "share of the last minute's polls that found a request running",
            ("engine",), registry=self.shared)
        self.gen_tps_serving = Gauge(
            "enginetop_serving_generation_tokens_per_second", "generated tokens per second over the time in "
            "the last minute a request was running (the rate over the minute / the busy share)",
            ("engine",), registry=self.shared)
        self.tokens_per_step = Gauge(
            "enginetop_tokens_per_step", "tokens (prompt + generated) the engine computed per scheduler step "
            "(iteration) over the last minute, from its own counters (vLLM)", ("engine",),
            registry=self.shared)
        # Energy (tui.sources.energy): each device's counter, and each engine's joules per generated token
        # over the watcher's window, labelled whose energy it is (engine: its own GPUs; gpu N: shared; the
        # cpu package)
        self.energy_counters = _EnergyCounters()
        self.shared.register(self.energy_counters)
        self.joules_per_token = Gauge(
            "enginetop_joules_per_token", "energy per generated token over the last window: the engine's "
            "GPUs (or the CPU package for an engine on this machine's CPU) over its generation rate",
            ("engine", "scope"), registry=self.shared)
        self.tokens_per_joule = Gauge(
            "enginetop_tokens_per_joule", "generated tokens per joule over the last window (as above)",
            ("engine", "scope"), registry=self.shared)
        # Where the engine runs (tui.sources.port_holder): its container, and what the container's cgroup
        # imposes and counts; labelled `container` so a dashboard can join the engine's figures to it
        self.container_info = Gauge(
            "enginetop_engine_container_info", "the container the engine's processes run in (1)",
            ("engine", "container", "runtime", "image"), registry=self.shared)
        self.container_figure = Gauge(
            "enginetop_container", "the engine's container, from its cgroup: memory_bytes and "
            "memory_limit_bytes now, cpu_quota_cores, and over the last window cpu_cores_used, "
            "cpu_throttled_share (of its quota's periods) and oom_kills",
            ("engine", "container", "what"), registry=self.shared)
        # engine -> the label tuples served for each gauge: what no longer holds is removed, not left stale
        self._served: dict[tuple[int, str], set[tuple[str, ...]]] = {}

    def _pair(self, engine: str, workload: str) -> _Pair:
        pair = self._pairs.get((engine, workload))
        if pair is None:
            pair = _Pair(engine, workload)
            with self._lock:
                self._pairs[(engine, workload)] = pair
                self._version += 1
        return pair

    def declare(self, engine: str, workload: str) -> None:
        """Show the pair's counters at 0 before its first probe."""
        self._pair(engine, workload)

    def observe(self, result: ProbeResult, model: str | None = None) -> None:
        pair = self._pair(result.engine, result.workload)
        pair.observe(result, model)
        self.up.labels(result.engine).set(1 if result.ok else 0)
        families = split_families(generate_latest(pair.registry))
        with self._lock:
            pair.families = families
            self._version += 1

    def _serve(self, gauge: Gauge, name: str, values: dict[tuple[str, ...], float | None]) -> None:
        """`gauge`'s series of one engine: each known value set, every other one it had removed."""
        key = (id(gauge), name)
        held = {labels for labels, value in values.items() if value is not None}
        for gone in self._served.get(key, set()) - held:
            gauge.remove(name, *gone)
        for labels in held:
            gauge.labels(name, *labels).set(values[labels])  # type: ignore[arg-type]
        self._served[key] = held

    def engine(self, name: str, findings: Iterable[Finding], stats: EngineStats) -> None:
        """An engine's findings, speculative figures and requests, as its watcher read them last: a finding
        that no longer holds and a figure no longer known (the engine down, restarted, not drafting, idle)
        stop being served."""
        self._serve(self.finding, name, {(f.id, f.severity): 1.0 for f in findings})
        self._serve(self.spec_rate, name, {(): stats.spec_accept_rate_total})
        self._serve(self.spec_length, name, {(): stats.spec_accept_length_total})
        self._serve(self.spec_position, name, {
            (str(k),): rate for k, rate in enumerate(stats.spec_accept_per_pos_total or (), start=1)})
        rs = stats.requests
        quantiles = ("0.5", "0.9", "0.99")
        self._serve(self.request_seconds, name, {} if rs is None else {
            (phase, q): v for phase, three in (("queue", rs.queue_s), ("prefill", rs.prefill_s),
                                               ("decode", rs.decode_s), ("e2e", rs.e2e_s))
            for q, v in zip(quantiles, three or (None,) * 3, strict=True)})
        self._serve(self.request_tokens, name, {} if rs is None else {
            (kind, q): v for kind, three in (("prompt", rs.prompt_len), ("generation", rs.gen_len))
            for q, v in zip(("avg", "0.5", "0.9"), three or (None,) * 3, strict=True)})
        self._serve(self.requests_ended, name, {} if rs is None else {(r,): n for r, n in rs.finish_window})
        self._serve(self.request_rates, name, {} if rs is None else {
            ("requests",): rs.requests_per_s, ("preemptions",): rs.preemptions_per_s})
        self._serve(self.busy_share, name, {(): None if rs is None else rs.busy_share})
        self._serve(self.gen_tps_serving, name, {(): None if rs is None else rs.gen_tps_serving})
        self._serve(self.tokens_per_step, name, {(): None if rs is None else rs.tokens_per_step})
        scope = stats.energy_scope or ""
        self._serve(self.joules_per_token, name, {(scope,): stats.joules_per_token} if scope else {})
        self._serve(self.tokens_per_joule, name, {(scope,): stats.tokens_per_joule} if scope else {})

    def placement(self, name: str, container: Container | None, cgroup: CgroupReading | None,
                  use: CgroupUse | None) -> None:
        """The engine's container and its cgroup's figures, as its watcher read them last (none served for an
        engine on the host)."""
        label = container.label() if container is not None else ""
        self._serve(self.container_info, name, {} if container is None else {
            (label, container.runtime, container.image or ""): 1.0})
        figures: dict[str, float | None] = {}
        if container is not None and cgroup is not None and cgroup.error is None:
            figures = {"memory_bytes": cgroup.memory_bytes, "memory_limit_bytes": cgroup.memory_limit_bytes,
                       "cpu_quota_cores": cgroup.cpu_quota_cores}
            if use is not None:
                figures |= {"cpu_cores_used": use.cores_used, "cpu_throttled_share": use.throttled_share,
                            "oom_kills": use.oom_kills}
        self._serve(self.container_figure, name, {(label, what): v for what, v in figures.items()})

    def devices(self, gpu: GpuReport | None, host: HostSample | None) -> None:
        """This machine's energy counters as last read."""
        values: dict[tuple[str, str], float] = {}
        last = self.energy_counters.values
        for g in gpu.gpus if gpu is not None else ():
            key = (f"gpu{g.index}", g.vendor or "")
            if g.energy_j is not None:
                values[key] = g.energy_j
            elif g.error is None and key in last:
                # read between its counter's readings (amd-smi is run every few seconds): the last value
                # stands, so the counter does not vanish and come back from one scrape to the next
                values[key] = last[key]
        if host is not None and host.cpu_energy_j is not None:
            values[("cpu-package", "")] = host.cpu_energy_j
        self.energy_counters.set(values)

    def gone(self, name: str) -> None:
        """The engine could not be read: nothing it was last found to be, or to do, is served."""
        self.engine(name, (), EngineStats())
        self.placement(name, None, None, None)

    def exposition(self) -> bytes:
        """The whole /metrics body (text format 0.0.4): every family once, its samples from every pair."""
        shared = split_families(generate_latest(self.shared))
        with self._lock:
            if self._joined[0] != self._version:
                self._joined = (self._version, self._join())
            joined = dict(self._joined[1])  # a family also in `shared` is taken out of this copy below
        out = [header + samples + joined.pop(name, (b"", b""))[1]
               for name, (header, samples) in shared.items()]
        out += [header + samples for header, samples in joined.values()]
        return b"".join(out)

    def _join(self) -> dict[str, tuple[bytes, bytes]]:
        """Every pair's rendered families joined, family by family."""
        parts: dict[str, list[bytes]] = {}
        headers: dict[str, bytes] = {}
        for pair in self._pairs.values():
            for name, (header, samples) in pair.families.items():
                headers.setdefault(name, header)
                parts.setdefault(name, []).append(samples)
        return {name: (headers[name], b"".join(samples)) for name, samples in parts.items()}

    def sample(self, name: str, labels: dict[str, str]) -> float | None:
        """One sample's value (for tests and benches), as prometheus_client's get_sample_value."""
        with self._lock:
            registries = [self.shared, *(pair.registry for pair in self._pairs.values())]
        for registry in registries:
            value = registry.get_sample_value(name, labels)
            if value is not None:
                return value
        return None
