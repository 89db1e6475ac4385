"""A SYNTHETIC fleet for scale tests, the bench and the demo: engines and dcgm-exporters that do not exist.

One HTTP server on loopback serves many exporters, each on its own path and scraped by Prometheus as its
own target (its own job/instance labels, via static_configs labels), each built with prometheus_client
from the real metric names and labels of vLLM (new and pre-0.11 names), SGLang and llama.cpp, and of
dcgm-exporter (fleet.md §4: gpu, UUID, pci_bus_id, device, modelName, Hostname or hostname; field 112 under
both names; the blank sentinel). Counters move with time (value = rate x seconds since start), so
Prometheus' rates are known exactly: `SyntheticEngine.gen_rate` is what the fleet must show.

Every engine's instance is `synthetic-node-NN:PORT`, every GPU's host `synthetic-node-NN`, so the word
"synthetic" is on every row it makes. Special engines: `stalled` (requests running, counter never moves),
`kv_full` (KV at 95%), `queue` (waiting grows), `flapping` (its scrape fails every other `flap_s`),
`vanishing` (its running/waiting series disappear after `vanish_after_s`), `slowing` (generates at its rate
for `slow_after_s`, then at a tenth of it).

Kubernetes (node 7): two engines carry `namespace`/`pod` target labels as Kubernetes service discovery
gives them, and node 7's dcgm-exporter labels GPU 0 and 1 with the pod (and container) using each, as
dcgm-exporter does in Kubernetes. One pod's instance is a pod address (no node name in it), the other runs
with the node's network (its instance names the node), so only pod matching tells their GPUs apart.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from tui.base.process import free_port

TTFT_BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ITL_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# fraction of observations at or under each bound: p50 falls in (0.05, 0.1], p90 in (0.25, 0.5]
TTFT_CDF = (0.0, 0.1, 0.3, 0.7, 0.85, 0.95, 1.0, 1.0, 1.0)
ITL_CDF = (0.0, 0.2, 0.6, 0.9, 1.0, 1.0)


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # Prometheus (or enginetop) opens many connections at once


@dataclass
class SyntheticEngine:
    index: int
    dialect: str  # "vllm" | "vllm-old" | "sglang" | "llamacpp"
    node: int
    port: int
    gen_rate: float  # tokens per second, exactly
    prompt_rate: float
    running: float
    waiting: float
    kv: float
    kind: str = ""  # "", "stalled", "kv_full", "queue", "flapping", "vanishing", "slowing"
    model: str = "synthetic/model-7b"
    namespace: str = ""  # Kubernetes target labels (service discovery), "" = not in Kubernetes
    pod: str = ""
    pod_address: bool = False  # the instance is the pod's address, not the node's name

    @property
    def instance(self) -> str:
        if self.pod_address:
            return f"synthetic-pod-10-42-{self.node}-{self.index}:{self.port}"
        return f"synthetic-node-{self.node:02d}:{self.port}"

    @property
    def job(self) -> str:
        return {"vllm-old": "vllm", "llamacpp": "llama"}.get(self.dialect, self.dialect)


@dataclass
class SyntheticGpu:
    node: int
    gpu: int
    util: float
    power: float
    temp: float
    mask: int  # field 112
    new_host_label: bool  # `hostname` (late-2026 rename) instead of `Hostname`
    old_reason_name: bool  # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS instead of ..._CLOCKS_EVENT_REASONS
    xid: int = 0
    namespace: str = ""  # the pod using this GPU, as dcgm-exporter labels it in Kubernetes ("" = none)
    pod: str = ""

    @property
    def host(self) -> str:
        return f"synthetic-node-{self.node:02d}"


class _Collector:
    def __init__(self, fleet: SyntheticFleet, engine: SyntheticEngine | None = None,
                 gpus: list[SyntheticGpu] | None = None) -> None:
        self.fleet, self.engine, self.gpus = fleet, engine, gpus

    def collect(self):
        age = time.monotonic() - self.fleet.started
        if self.engine is not None:
            # Stamped with the instant the values are true, so a scrape that waits for this (busy, shared)
            # process does not skew Prometheus' rates; the flapping and vanishing engines are not stamped,
            # as no real engine is, so Prometheus marks their series stale when they fail or disappear.
            stamp = None if self.engine.kind in ("flapping", "vanishing") else time.time()
            for family in _engine_families(self.engine, age, self.fleet):
                if stamp is not None:
                    family.samples = [s._replace(timestamp=stamp) for s in family.samples]
                yield family
        for g in self.gpus or ():
            yield from _gpu_families(g)


def _hist(name: str, labels: dict[str, str], bounds, cdf, count: float, mean: float):
    h = HistogramMetricFamily(name, "synthetic", labels=list(labels))
    buckets = [(str(b), count * f) for b, f in zip(bounds, cdf, strict=True)] + [("+Inf", count)]
    h.add_metric(list(labels.values()), buckets, count * mean)
    return h


def generated(e: SyntheticEngine, age: float, fleet: SyntheticFleet) -> float:
    """The engine's generation counter `age` seconds after the fleet started."""
    if e.kind == "stalled":  # stalled before the fleet started: Prometheus never sees it move
        return e.gen_rate * 5.0
    if e.kind == "slowing" and age > fleet.slow_after_s:
        return e.gen_rate * (fleet.slow_after_s + 0.1 * (age - fleet.slow_after_s))
    return e.gen_rate * age


def _engine_families(e: SyntheticEngine, age: float, fleet: SyntheticFleet):
    gen = generated(e, age, fleet)
    prompt = e.prompt_rate * age
    requests = gen / 100.0
    # the queue is long enough (>= 5) from the start and grows 1 every 10 s
    waiting = e.waiting + (5.0 + age / 10.0 if e.kind == "queue" else 0.0)
    vanished = e.kind == "vanishing" and age > fleet.vanish_after_s

    def counter(name: str, value: float, labels: dict[str, str] | None = None):
        labels = labels or {}
        c = CounterMetricFamily(name, "synthetic", labels=list(labels))
        c.add_metric(list(labels.values()), value)
        return c

    def gauge(name: str, value: float, labels: dict[str, str] | None = None):
        labels = labels or {}
        g = GaugeMetricFamily(name, "synthetic", labels=list(labels))
        g.add_metric(list(labels.values()), value)
        return g

    if e.dialect in ("vllm", "vllm-old"):
        lab = {"model_name": e.model, "engine": "0"}
        if not vanished:
            yield gauge("vllm:num_requests_running", e.running, lab)
            yield gauge("vllm:num_requests_waiting", waiting, lab)
        old = e.dialect == "vllm-old"
        yield gauge("vllm:gpu_cache_usage_perc" if old else "vllm:kv_cache_usage_perc", e.kv, lab)
        yield counter("vllm:generation_tokens", gen, lab)
        yield counter("vllm:prompt_tokens", prompt, lab)
        yield counter("vllm:prompt_tokens_by_source", prompt * 0.6, {**lab, "source": "local_compute"})
        pre = "vllm:gpu_prefix_cache_" if old else "vllm:prefix_cache_"
        yield counter(pre + "queries", prompt, lab)
        yield counter(pre + "hits", prompt * 0.4, lab)
        yield _hist("vllm:time_to_first_token_seconds", lab, TTFT_BOUNDS, TTFT_CDF, requests, 0.1)
        itl = "vllm:time_per_output_token_seconds" if old else "vllm:inter_token_latency_seconds"
        yield _hist(itl, lab, ITL_BOUNDS, ITL_CDF, gen, 0.02)
    elif e.dialect == "sglang":
        lab = {"model_name": e.model}
        if not vanished:
            yield gauge("sglang:num_running_reqs", e.running, lab)
            yield gauge("sglang:num_queue_reqs", waiting, lab)
        yield gauge("sglang:token_usage", e.kv, lab)
        yield counter("sglang:generation_tokens", gen, lab)
        yield counter("sglang:prompt_tokens", prompt, lab)
        yield counter("sglang:cached_tokens", prompt * 0.4, lab)
        yield _hist("sglang:time_to_first_token_seconds", lab, TTFT_BOUNDS, TTFT_CDF, requests, 0.1)
        yield _hist("sglang:inter_token_latency_seconds", lab, ITL_BOUNDS, ITL_CDF, gen, 0.02)
    else:
        if not vanished:
            yield gauge("llamacpp:requests_processing", e.running)
            yield gauge("llamacpp:requests_deferred", waiting)
        yield counter("llamacpp:tokens_predicted", gen)
        yield counter("llamacpp:prompt_tokens", prompt * 0.6)
        yield counter("llamacpp:prompt_tokens_cached", prompt * 0.4)


BLANK = 9223372036854775794  # dcgm's "not supported" sentinel, as fleet.md §4 quotes it


def _gpu_families(g: SyntheticGpu):
    host = "hostname" if g.new_host_label else "Hostname"
    labels = {"gpu": str(g.gpu), "UUID": f"GPU-5e3c{g.node:04d}-{g.gpu:04d}",
              "pci_bus_id": f"00000000:{0x19 + g.gpu:02X}:00.0", "device": f"nvidia{g.gpu}",
              "modelName": "NVIDIA H200", host: g.host}
    if g.pod:
        labels |= {"namespace": g.namespace, "pod": g.pod, "container": "vllm"}
    reasons = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" if g.old_reason_name else \
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
    # node 4's GPUs lack the profiling fields: dcgm exports them as the blank sentinel
    dram = float(BLANK) if g.node == 4 else g.util / 120.0
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", g.util), ("DCGM_FI_DEV_MEM_COPY_UTIL", g.util * 0.6),
                        ("DCGM_FI_PROF_DRAM_ACTIVE", dram), ("DCGM_FI_DEV_POWER_USAGE", g.power),
                        ("DCGM_FI_DEV_GPU_TEMP", g.temp), ("DCGM_FI_DEV_SM_CLOCK", 1980.0),
                        ("DCGM_FI_DEV_MEM_CLOCK", 3201.0), ("DCGM_FI_DEV_FB_USED", 120000.0),
                        ("DCGM_FI_DEV_FB_FREE", 20000.0), ("DCGM_FI_DEV_FB_RESERVED", 1000.0),
                        (reasons, float(g.mask)), ("DCGM_FI_DEV_XID_ERRORS", float(g.xid))):
        fam = GaugeMetricFamily(name, "synthetic dcgm field", labels=list(labels))
        fam.add_metric(list(labels.values()), value)
        yield fam


@dataclass
class SyntheticFleet:
    engines: list[SyntheticEngine] = field(default_factory=list)
    gpus: list[SyntheticGpu] = field(default_factory=list)
    vanish_after_s: float = 1e9
    slow_after_s: float = 20.0  # the slowing engines generate at a tenth of their rate after this
    flap_s: float = 4.0  # the flapping engine's scrapes fail every other period of this many seconds
    started: float = field(default_factory=time.monotonic)
    port: int = 0
    spec: tuple[int, int, int, bool] = (0, 0, 0, False)  # make_fleet's arguments, to rebuild it elsewhere
    _server: ThreadingHTTPServer | None = None
    _proc: subprocess.Popen | None = None
    _bodies: dict[str, CollectorRegistry] = field(default_factory=dict)

    def scrapes(self, interval_s: float = 1.0) -> list[dict]:
        """Prometheus scrape configs, one static target per exporter, instance and path set per target."""
        addr = f"127.0.0.1:{self.port}"
        jobs: dict[str, list[dict]] = {}
        for e in self.engines:
            k8s = {"namespace": e.namespace, "pod": e.pod} if e.pod else {}
            jobs.setdefault(e.job, []).append({"targets": [addr], "labels": {
                "instance": e.instance, "__metrics_path__": f"/engine/{e.index}/metrics", **k8s}})
        for node in sorted({g.node for g in self.gpus}):
            jobs.setdefault("dcgm", []).append({"targets": [addr], "labels": {
                "instance": f"synthetic-node-{node:02d}:9400", "__metrics_path__": f"/dcgm/{node}/metrics"}})
        return [{"job_name": job, "scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s",
                 "static_configs": static} for job, static in jobs.items()]

    def dcgm_url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.port}/dcgm/{node}/metrics"

    def start(self) -> SyntheticFleet:
        for e in self.engines:
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Collector(self, engine=e))
            self._bodies[f"/engine/{e.index}/metrics"] = reg
        for node in sorted({g.node for g in self.gpus}):
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Collector(self, gpus=[g for g in self.gpus if g.node == node]))
            self._bodies[f"/dcgm/{node}/metrics"] = reg
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # Prometheus keeps its connections: no new one every scrape
            # headers and body go in two writes: without this, Nagle holds the body for the client's
            # delayed ACK (40 ms a scrape on a kept connection)
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                reg = fleet._bodies.get(self.path)
                index = self.path.split("/")[2] if self.path.startswith("/engine/") else None
                flapping = index is not None and fleet.engines[int(index)].kind == "flapping"
                failing = flapping and int((time.monotonic() - fleet.started) / fleet.flap_s) % 2 == 1
                if reg is None or failing:
                    self.send_response(404 if reg is None else 500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = generate_latest(reg)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # Prometheus may give up on a slow scrape: it counts it as failed, as it should
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.port = self.port or free_port()
        self._server = _Server(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="synthetic fleet").start()
        return self

    def spawn(self) -> SyntheticFleet:
        """Serve from a child process: the scrapes then cost this process (a test, the bench, enginetop
        itself in a test) nothing. The child rebuilds the same fleet (make_fleet is deterministic) with this
        one's start time (CLOCK_MONOTONIC is the same in every process), so `gen_rate` etc. stay exact."""
        self.port = self.port or free_port()
        n, nodes, gpus, specials = self.spec
        argv = [sys.executable, __file__, str(n), str(nodes), str(gpus), str(int(specials)), str(self.port),
                repr(self.started), repr(self.vanish_after_s), repr(self.flap_s), repr(self.slow_after_s)]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            if self._proc.poll() is not None:
                raise RuntimeError(f"the synthetic fleet exited with {self._proc.returncode}")
            time.sleep(0.1)
        raise RuntimeError("the synthetic fleet did not start listening within 30 s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
            self._proc = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def make_fleet(n_engines: int = 200, n_nodes: int = 13, gpus_per_node: int = 4,
               specials: bool = True) -> SyntheticFleet:
    """n_engines spread over n_nodes (several per node), 60% vLLM (a fifth of them with pre-0.11 names),
    20% SGLang, 20% llama.cpp; gpus_per_node GPUs on every node, node 3's throttled (power cap + SW
    thermal, 0x24 as fleet.md's example), odd nodes with the renamed `hostname` label."""
    engines = []
    for i in range(n_engines):
        r = i % 10
        dialect = "sglang" if r in (6, 7) else "llamacpp" if r in (8, 9) else "vllm-old" if r == 5 else "vllm"
        engines.append(SyntheticEngine(
            index=i, dialect=dialect, node=i % n_nodes, port=8000 + i // n_nodes,
            gen_rate=50.0 + 7.0 * (i % 13), prompt_rate=200.0 + 11.0 * (i % 7), running=float(1 + i % 4),
            waiting=float(i % 3), kv=0.2 + 0.05 * (i % 10)))
    if specials and n_engines >= 5:
        engines[0].kind, engines[0].running = "stalled", 3.0
        engines[1].kind, engines[1].kv = "kv_full", 0.95
        engines[2].kind = "queue"
        # not on node 3: a target that fails every other few seconds has dips in its short-window rates, which
        # on a throttled node would read as a tok/s drop
        engines[9].kind = "flapping"
        engines[4].kind = "vanishing"
    gpus = [SyntheticGpu(node=n, gpu=g, util=40.0 + 5 * g + n, power=300.0 + 20 * g, temp=55.0 + n,
                         mask=0x24 if n == 3 else 0x0, new_host_label=n % 2 == 1,
                         old_reason_name=n % 4 == 2, xid=79 if (n, g) == (5, 1) else 0)
            for n in range(n_nodes) for g in range(gpus_per_node)]
    if specials and n_nodes == 13 and n_engines >= 34 and gpus_per_node >= 2:
        # Slowing engines for the throttled-GPU alert: on node 3 (power cap + SW thermal: alerts), on node 5
        # whose GPUs report only bits that are not throttling (idle, clocks setting, display: no alert)
        engines[16].kind = "slowing"
        engines[5].kind = "slowing"
        for g in gpus:
            if g.node == 5:
                g.mask = 0x1 | 0x2 | 0x100
        # Kubernetes on node 7: pod a (instance = pod address) uses GPU 0, HW-slowdown throttled; pod b
        # (host network: its instance names node 7) uses GPU 1, not throttled. Both slow down: only pod a's
        # engine alerts, which matching by host alone would get the wrong way round.
        for e, pod, g in ((engines[7], "synthetic-vllm-a", 0), (engines[33], "synthetic-vllm-b", 1)):
            e.kind, e.namespace, e.pod, e.pod_address = "slowing", "synthetic-llm", pod, pod.endswith("a")
            gpu = next(x for x in gpus if (x.node, x.gpu) == (7, g))
            gpu.namespace, gpu.pod = "synthetic-llm", pod
            gpu.mask = 0x8 if g == 0 else 0x0
    return SyntheticFleet(engines=engines, gpus=gpus, spec=(n_engines, n_nodes, gpus_per_node, specials))


if __name__ == "__main__":  # the child of SyntheticFleet.spawn
    n, nodes, per_node, specials, port = (int(a) for a in sys.argv[1:6])
    child = make_fleet(n, nodes, per_node, bool(specials))
    child.port, child.started = port, float(sys.argv[6])
    child.vanish_after_s, child.flap_s = float(sys.argv[7]), float(sys.argv[8])
    child.slow_after_s = float(sys.argv[9])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the server threads too
    child.start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    child.stop()
