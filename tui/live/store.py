"""Bounded history of everything polled: memory grows with neither session length nor horizon.

Counters become rates here (over a short window, so llama.cpp's end-of-request counter updates do not
read as bursts) and histograms become quantiles over a longer window, each engine's from its own state
(tui.live.engine_stats; its findings in tui.live.engine_findings). Every plotted series keeps at most
`max_points` points over the horizon (see Series), so a 24 h horizon costs what a 1 h one does, and each
poll costs the same whatever the horizon. Nothing here imports Textual.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from tui.live.engine_findings import judge_engine
from tui.live.engine_state import EngineState, generated_per_s, relayed
from tui.live.engine_stats import engine_stats, placed, plotted, routed
from tui.live.glance import busy_slots
from tui.live.probe_energy import probe_energy_fields
from tui.live.series import Series, spans
from tui.model.bench import BenchSample
from tui.model.events import ProbeEvent
from tui.model.findings import StartMemory
from tui.model.samples import EngineSample, EngineStats, GpuReport, HostSample, PromptProgress
from tui.model.traffic import TrafficSample
from tui.sources.attribution import attribute, with_attribution
from tui.sources.energy import Point as EnergyPoint
from tui.sources.energy import Track, gpu_key, gpu_label, holders, may_hold_an_engine, whole_gpu_words
from tui.sources.rates import present, shape, went_back, went_back_same_shape

# What a source makes (tui.live.feed); a replay adds the probe results it recorded.
Sample = EngineSample | GpuReport | HostSample | ProbeEvent | TrafficSample | BenchSample

ENGINE_SERIES = ("gen_tps", "ttft_p50_s")  # what the plots draw, from EngineStats (engine_stats.plotted)
# what the column's sparklines draw beside the plotted two, from EngineStats as each reading comes (live only:
# a replay's seek, which adds readings for the plots alone, leaves them to fill from the cursor on)
GLANCE_SERIES = ("prompt_processed_tps", "prompt_computed_tps", "itl_p50_s")
BENCH_TTFT = "bench_ttft_p50_s"  # a running bench's live TTFT p50, drawn beside the engine's own
TRAFFIC_TTFT = "traffic_ttft_p50_s"  # the clients' TTFT p50 via the proxy (llama.cpp has no TTFT histogram)
MIN_PROBES_KEPT = 10  # the probe panel lists and medians the last few, however old they are
ENERGY_KEEP_S = 180.0  # energy readings kept per device: the window, and a probe's span read after it ended
REMOTE_ENERGY_WINDOW_S = 60.0  # dcgm-exporter collects every 30 s by default: its counter moves that rarely


class Store:
    def __init__(self, horizon_s: float = 600.0, rate_window_s: float = 10.0,
                 latency_window_s: float = 60.0, max_points: int = 3600, max_probes: int = 1000) -> None:
        if not horizon_s > 0:
            raise ValueError(f"the plots' horizon must be a positive number of seconds, got {horizon_s}")
        self.horizon_s = horizon_s
        self.rate_window_s = rate_window_s
        self.latency_window_s = latency_window_s
        self.max_points = max_points
        self.max_probes = max_probes
        self.engines: dict[str, EngineState] = {}
        self.gpu: GpuReport | None = None
        self.host: HostSample | None = None
        # 1.0 while any GPU reports a real throttle reason
        self.throttle = Series(horizon_s, max_points, peak=True)
        # Energy readings per GPU and for the CPU package (tui.sources.energy), and the probes whose energy
        # waits for a reading after their end: (engine, result)
        self._gpu_energy: dict[tuple[str, int, str], Track] = {}
        self._cpu_energy = Track(ENERGY_KEEP_S)
        self._probe_energy: list[tuple[str, Any]] = []
        # Told (engine, result) when a probe's energy is known, the result then carrying it (a report keeps
        # every probe; the panel's deque only the last few)
        self.on_probe_energy: Callable[[str, Any], None] | None = None
        # Called with every sample and probe result the store takes, as it takes it (a recorder listens
        # here, so whatever fed the store is kept, whichever source it came from).
        self.listeners: list[Callable[[Any], None]] = []

    def add(self, sample: Sample) -> None:
        """Take one sample from any source."""
        if isinstance(sample, EngineSample):
            self.add_engine_sample(sample)
        elif isinstance(sample, GpuReport):
            self.add_gpu_report(sample)
        elif isinstance(sample, HostSample):
            self.add_host_sample(sample)
        elif isinstance(sample, ProbeEvent):  # a recorded probe result, replayed
            self.add_probe(sample.engine, sample.result, sample.t)
        elif isinstance(sample, TrafficSample):
            self._tell(sample)
            state = self.engine(sample.name)
            state.traffic = sample
            if sample.error is None:
                state.series.setdefault(TRAFFIC_TTFT, Series(self.horizon_s, self.max_points)).add(
                    sample.t, sample.stats.ttft_p50_s)
            if state.stats.requests is None or state.stats.requests.origin is not None:
                state.stats = dataclasses.replace(state.stats, requests=relayed(state))
            judge_engine(state, sample.t, sample.wall)
        elif isinstance(sample, BenchSample):  # not recorded: the run's own result file keeps it whole
            state = self.engine(sample.name, sample.url)
            state.bench = sample
            if sample.progress.state == "running":
                state.series.setdefault(BENCH_TTFT, Series(self.horizon_s, self.max_points)).add(
                    sample.t, sample.progress.ttft_p50_s)
        else:
            raise TypeError(f"the store takes engine, GPU, host, traffic and bench samples, not "
                            f"{type(sample).__name__}")

    def add_many(self, samples: Iterable[Any]) -> None:
        """Take many samples at once, as a replay does when it rebuilds the windows after a seek. The state
        is the one adding them one by one gives; but an engine's full stats, which only its last reading
        shows, are derived only for that one: the readings before it only give the plots their points."""
        samples = list(samples)
        last: dict[str, int] = {}  # engine -> its last sample that derives stats from a reading
        for i, sample in enumerate(samples):
            if type(sample) is EngineSample and sample.stats is None and sample.reading is not None:
                last[sample.name] = i
        for i, sample in enumerate(samples):
            if type(sample) is EngineSample and sample.reading is not None and last.get(sample.name, i) != i:
                self.add_engine_sample(sample, plotted_only=True)
            else:
                self.add(sample)

    def reset(self) -> None:
        """Forget everything (a replay seeking backwards rebuilds from the file); listeners stay."""
        listeners, on_probe_energy = self.listeners, self.on_probe_energy
        # one place sets every field: __init__, run again (mypy forbids calling it on an instance)
        self.__init__(self.horizon_s, self.rate_window_s, self.latency_window_s,  # type: ignore[misc]
                      self.max_points, self.max_probes)
        self.listeners, self.on_probe_energy = listeners, on_probe_energy

    def _tell(self, item: Any) -> None:
        for listener in self.listeners:
            listener(item)

    def engine(self, name: str, url: str = "") -> EngineState:
        state = self.engines.get(name)
        if state is None:
            series = {k: Series(self.horizon_s, self.max_points) for k in ENGINE_SERIES}
            state = EngineState(name=name, url=url, series=series, probes=deque(maxlen=self.max_probes),
                                glance={k: Series(self.horizon_s, self.max_points) for k in GLANCE_SERIES})
            self.engines[name] = state
        return state

    def add_engine_sample(self, sample: EngineSample, plotted_only: bool = False) -> EngineState:
        """plotted_only (add_many): the series get their points, `stats` is left to a later reading."""
        self._tell(sample)
        state = self.engine(sample.name, sample.url)
        state.sample = sample
        t = sample.t
        if sample.models is not None:
            routed(state, sample, t, self.rate_window_s)
        if sample.stats is not None:
            # figures the source computed itself (Prometheus rates and quantiles): shown as they are
            state.stats = sample.stats
            self._generated(state, sample)
            for key in ENGINE_SERIES:
                state.series[key].add(t, getattr(sample.stats, key))
            for key in GLANCE_SERIES:
                state.glance[key].add(t, getattr(sample.stats, key))
            return state
        if sample.reading is None:
            if sample.health != "up":
                state.stats = EngineStats()
                judge_engine(state, t, sample.wall)  # what held of its last run holds no more
            return state
        readings = state.readings
        now_shape = shape(sample.reading)
        if readings and now_shape == state.shape:
            back = went_back_same_shape(readings[-1][1], sample.reading, state.has)
        else:
            back = bool(readings) and went_back(readings[-1][1], sample.reading)
            state.shape, state.has, state.shape_t = now_shape, present(now_shape), t
        if back:
            # The engine restarted: nothing before this reading can be compared with what follows, so
            # the windows start again here instead of staying void until the old readings age out.
            readings.clear()
            state.reset_t = t
        readings.append((t, sample.reading))
        while t - readings[0][0] > self.latency_window_s + 1.0:
            readings.popleft()
        if back or state.watched_t is None:  # a new run of the engine: its evidence starts again
            state.watched_t, state.busy_max, state.waiting_max = t, None, None
        if sample.reading.running is not None or sample.slots is not None:
            busy = max(int(sample.reading.running or 0),
                       busy_slots(sample.slots) if sample.slots is not None else 0)
            state.busy_max = max(state.busy_max or 0, busy)
        if sample.reading.waiting is not None:
            state.waiting_max = max(state.waiting_max or 0, int(sample.reading.waiting))
        if plotted_only:
            for key, value in zip(ENGINE_SERIES, plotted(state, self.rate_window_s), strict=True):
                state.series[key].add(t, value)
            return state
        state.stats = self._energy(state.name,
                                   engine_stats(state, t, self.rate_window_s, self.latency_window_s))
        for key in ENGINE_SERIES:
            state.series[key].add(t, getattr(state.stats, key))
        for key in GLANCE_SERIES:
            state.glance[key].add(t, getattr(state.stats, key))
        judge_engine(state, t, sample.wall)
        return state

    def reset_engine(self, name: str) -> None:
        """The engine's session figures start again (the `r` key of a top): its readings, plots, probes,
        peaks and what its findings rest on; what it is and what it is set to stay."""
        state = self.engines.get(name)
        if state is None:
            return
        state.readings.clear()
        for series in (*state.series.values(), *state.glance.values()):
            series.points.clear()
        state.probes.clear()
        state.stats = EngineStats()
        state.watched_t, state.busy_max, state.waiting_max = None, None, None

    def engine_start(self, name: str, start: StartMemory | None, wall: float | None = None) -> None:
        """What the engine's start cost the host, as its launcher measured it (tui.lifecycle)."""
        state = self.engine(name)
        if state.start != start:
            state.start = start
            judge_engine(state, time.monotonic(), time.time() if wall is None else wall)

    def _energy(self, name: str, stats: EngineStats) -> EngineStats:
        """`stats` with the engine's energy per token (tui.sources.attribution.attribute): each engine's
        tokens over the energy's own window from its counter (generated_per_s), else its rate over the store's
        window (an engine read without a generated-tokens counter: llama-server's /slots), which ends within
        a poll of it and lasts as long."""
        def rate(engine: str, t0: float, t1: float) -> float | None:
            state = self.engines.get(engine)
            exact = generated_per_s(state, t0, t1) if state is not None else None
            if exact is not None:
                return exact
            return stats.gen_tps if engine == name else state.stats.gen_tps if state is not None else None

        local = {m.engine for m in self.host.engines} if self.host is not None else set()
        return with_attribution(stats, attribute(name, rate, self.gpu, self.host, local))

    def add_gpu_report(self, report: GpuReport) -> None:
        """Recorders get the report as read; the store keeps it with each GPU's energy over the window."""
        self._tell(report)
        gpus = []
        for g in report.gpus:
            if g.error is None:
                track = self._gpu_energy.get(key := gpu_key(g))
                if track is None:
                    track = self._gpu_energy[key] = Track(ENERGY_KEEP_S)
                if not g.stale:
                    track.add(EnergyPoint(g.t, g.energy_j, g.power_w), self._idle(holders(g)[0]))
                window = self.rate_window_s if g.host is None else \
                    max(self.rate_window_s, REMOTE_ENERGY_WINDOW_S)
                g = dataclasses.replace(g, energy=track.window(window))
            gpus.append(g)
        self.gpu = dataclasses.replace(report, gpus=tuple(gpus))
        self.throttle.add(report.t, 1.0 if any(g.throttled for g in report.gpus) else 0.0)
        self._probes_energy(report.t)

    def add_host_sample(self, sample: HostSample) -> None:
        """As add_gpu_report: the sample as read to recorders, kept with the CPU package's energy window."""
        self._tell(sample)
        by_engine = {m.engine: m for m in sample.engines}
        unowned = dict(sample.unowned)
        for name, state in self.engines.items():
            tree = by_engine.get(name)
            state.rss_bytes = tree.rss_bytes if tree is not None else None
            state.port_note = unowned.get(name)
            if placed(state, tree, sample.t, self.rate_window_s):
                judge_engine(state, sample.t, time.time())
        if sample.cpu_energy_j is not None:
            self._cpu_energy.add(EnergyPoint(sample.t, sample.cpu_energy_j, None),
                                 self._idle(self._cpu_engines(sample)))
        window = self._cpu_energy.window(self.rate_window_s) if sample.cpu_energy_j is not None else None
        self.host = dataclasses.replace(sample, cpu_energy=window)
        self._probes_energy(sample.t)

    def _cpu_engines(self, host: HostSample) -> set[str]:
        on_gpu = {e for g in (self.gpu.gpus if self.gpu else ()) if g.host is None for e in holders(g)[0]}
        return {m.engine for m in host.engines} - on_gpu

    def _idle(self, engines: set[str]) -> bool | None:
        """Do all these engines serve nothing now (no request running, no token generated in the window)?
        None when there are none, or one's figures are not known."""
        if not engines:
            return None
        for name in engines:
            state = self.engines.get(name)
            reading = state.sample.reading if state is not None and state.sample is not None else None
            if state is None or reading is None:
                return None
            if (reading.running or 0) > 0 or (state.stats.gen_tps or 0) > 0:
                return False
        return True

    @staticmethod
    def _generated(state: EngineState, sample: EngineSample) -> None:
        """The generated-tokens counter of an engine whose rates its source computed (generated_per_s)."""
        total = sample.reading.generation_tokens_total if sample.reading is not None else None
        kept = state.generated
        if total is None or (kept and sample.t <= kept[-1][0]):
            return  # no counter, or a repeated reading
        if kept and total < kept[-1][1]:
            kept.clear()  # the counter went back: the engine restarted
        kept.append((sample.t, total))
        while len(kept) > 2 and sample.t - kept[1][0] >= ENERGY_KEEP_S:
            kept.popleft()

    # ---- a probe's energy: the readings over its span, once one after its end has come ----------------

    def _probe_scope(self, name: str) -> tuple[list[Track], str] | str:
        gpus = [g for g in (self.gpu.gpus if self.gpu else ()) if g.host is None and name in holders(g)[0]]
        if gpus:
            others = {e for g in gpus for e in holders(g)[0]} - {name}
            unnamed = any(holders(g)[1] for g in gpus)
            label = "gpu " + "+".join(str(g.index) for g in gpus)
            whole = whole_gpu_words(gpus)  # AMD/Intel: another program on it cannot be seen, nor ruled out
            if others or unnamed:
                scope = f"{label} (shared)"
            else:
                scope = "engine" if whole is None else f"{label} ({whole})"
            return [self._gpu_energy[gpu_key(g)] for g in gpus if gpu_key(g) in self._gpu_energy], scope
        host = self.host
        if host is None or name not in {m.engine for m in host.engines}:
            return "not on this machine"
        unseen = [g for g in (self.gpu.gpus if self.gpu else ()) if g.host is None and may_hold_an_engine(g)]
        if unseen:  # as the column says (attribute): the engine may be what holds them
            return (f"not attributed: its processes hold no GPU, but {gpu_label(unseen)} is used by "
                    "processes enginetop cannot name or cannot be read")
        if host.cpu_energy_j is None:
            return host.cpu_energy_error or "no CPU energy reading"
        shared = len(self._cpu_engines(host)) > 1
        return [self._cpu_energy], "cpu package" + (" (shared)" if shared else "")

    def _probes_energy(self, now: float) -> None:
        waiting = []
        for name, result in self._probe_energy:
            fields = self._probe_fields(name, result, now)
            if fields is None:
                waiting.append((name, result))
                continue
            done = dataclasses.replace(result, **fields)
            probes = self.engine(name).probes
            for i, (t, kept) in enumerate(probes):
                if kept is result:
                    probes[i] = (t, done)
                    break
            if self.on_probe_energy is not None:
                self.on_probe_energy(name, done)
        self._probe_energy = waiting

    def _probe_fields(self, name: str, result: Any, now: float) -> dict[str, Any] | None:
        """The probe's energy fields, or None while the readings have not passed its end yet."""
        return probe_energy_fields(result, now, lambda: self._probe_scope(name))

    def probe_progress(self, name: str, progress: PromptProgress) -> None:
        """A probe's prompt progress as it streams (not recorded: its result is)."""
        self.engine(name).prefill = progress

    def add_probe(self, name: str, result: Any, t: float | None = None) -> None:
        t = time.monotonic() if t is None else t
        self.engine(name).prefill = None
        self._tell(ProbeEvent(name, t, result))
        probes = self.engine(name).probes
        probes.append((t, result))
        while len(probes) > MIN_PROBES_KEPT and probes[0][0] < t - self.horizon_s:
            probes.popleft()
        if getattr(result, "ok", False) and hasattr(result, "energy_note") and result.sent_at is not None \
                and result.ended_at is not None:
            self._probe_energy.append((name, result))
            self._probes_energy(t)
        if getattr(getattr(result, "server", None), "load_ms", None) is not None:
            state = self.engine(name)  # Ollama said it loaded the model for it: judged again
            judge_engine(state, t, time.time())

    def throttle_spans(self, t0: float) -> list[tuple[float, float]]:
        """Periods (start, end) since t0 in which a GPU reported a real throttle reason; a span still open
        ends at the last report."""
        return spans(self.throttle, t0)
