"""The Textual app: layout, keys, polling workers, and the one place worker errors are handled.

Polling never blocks the event loop: engines are polled with an async httpx client; NVML, psutil and
engine lifecycle steps run in threads. Widgets redraw from the store on one UI timer.

An engine column ("slot") either watches a URL, or drives an engine through a profile with an
EngineManager (launch, verify ready, switch safely, notice a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState

from tui.base.install import command
from tui.base.stats import median
from tui.compare.ab import ABConfig
from tui.compare.roofline import Roofline, model_weight_bytes, roofline
from tui.fleet.backfill import backfill_engine, backfill_throttle
from tui.fleet.match import engine_pod
from tui.fleet.options import FleetOptions, FleetSources
from tui.fleet.prometheus import PromError
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import EngineManager, StateChanges, SwitchResult
from tui.live.feed import Feed, Source
from tui.live.store import EngineState, Store
from tui.model.samples import EngineSample
from tui.model.status import EngineStatus, StepEvent
from tui.model.targets import EngineTarget
from tui.net.listen import ListenError
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR, ProbeResult
from tui.probe.runner import ProbeRunner
from tui.probe.sweep import SweepConfig
from tui.probe.workloads import WorkloadParams
from tui.proxy.options import ProxyOptions
from tui.record.writer import Recorder
from tui.run.sources import RunOptions, build_sources
from tui.run.targets import profile_target
from tui.sources.discover import discover, start_hints
from tui.sources.engine_source import EngineSource
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.ui.screens.ab import ABRun, ABScreen, dashboard_arm, start_dashboard_ab
from tui.ui.screens.dashboard import MAX_COLUMNS, Column, Dashboard
from tui.ui.screens.engine_detail import EngineDetailScreen
from tui.ui.screens.fleet import EngineScreen, FleetStatus, FleetView, GpusScreen
from tui.ui.screens.help import HelpScreen
from tui.ui.screens.logs import LogScreen
from tui.ui.screens.sweep import SweepScreen
from tui.ui.screens.switch import ConfirmSwitch, SwitchProgress, switch_question
from widgets.engine_panel import EnginePanel

log = logging.getLogger(__name__)

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass
class Slot:
    """One engine column, polled by its `source`. `target.name` is the store key: a switch gives the slot a
    new name, so the plots keep the old configuration's line beside the new one."""

    index: int
    source: EngineSource
    manager: EngineManager | None = None  # set when enginetop drives this engine through profiles
    profile: Profile | None = None
    status: EngineStatus | None = None
    failure: str | None = None  # why the last start/switch failed, until the next one succeeds
    # set when a start or switch left nothing running: the column says why, and its port is not polled (a
    # refused connection would read "starting" for ever) until the next start
    given_up: str | None = None
    probe_every_s: float | None = None

    @property
    def target(self) -> EngineTarget:
        return self.source.target

    @target.setter
    def target(self, target: EngineTarget) -> None:
        self.source.target = target


@dataclass
class AppConfig:
    targets: list[EngineTarget] = field(default_factory=list)  # engines only watched
    profiles: list[Profile] = field(default_factory=list)  # engines started (or attached) via profiles
    switchable: list[Profile] = field(default_factory=list)  # number keys 1..9 switch to these
    probe_every_s: float | None = None  # for watched engines; None = only on key `f`
    probe_every_managed_s: float | None = None  # for engines enginetop started
    probe_workload: str = "short"
    probe_max_tokens: int = 64
    ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR  # client TTFT over engine TTFT: flagged above this
    sweep: SweepConfig = field(default_factory=lambda: SweepConfig(levels=(1, 2, 4, 8, 16, 32)))
    ab: ABConfig = field(default_factory=lambda: ABConfig(
        instances=3, blocks=2, requests_per_block=2, max_tokens=32, mode="coresident"))
    model_bytes: float | None = None  # roofline: weight bytes read per token, when not found on disk
    bandwidth_bps: float | None = None  # roofline: memory bandwidth, when NVML cannot say (no GPU)
    poll_interval_s: float = 1.0
    gpu_interval_s: float = 1.0
    host_interval_s: float = 2.0
    redraw_interval_s: float = 2.0  # nvitop's default; polling stays at 1 Hz, so rates keep their resolution
    horizon_s: float = 300.0
    screenshot_dir: Path = Path("screenshots")
    gpu_sampler: Callable[[], GpuSampler] = GpuSampler
    host_sampler: Callable[[], HostSampler] = HostSampler
    recorder: Recorder | None = None  # listens to the store (tui.record); the caller closes it
    # The fleet view (--prometheus): a table of every engine Prometheus scrapes instead of engine columns.
    # With only --dcgm, the usual columns with the GPU panel fed by those dcgm-exporters instead of NVML.
    fleet: FleetOptions | None = None
    fleet_replay: bool = False  # the fleet table, fed by a replayed recording of a Prometheus (no queries)
    proxy: ProxyOptions | None = None  # a traffic proxy this dashboard runs in front of its engines
    traffic: list[str] = field(default_factory=list)  # separate `enginetop proxy` processes to watch
    # what the start found or could not (discovery's report, a profile that cannot start): notified at start;
    # with no engine at all, said where the columns would be
    notes: list[str] = field(default_factory=list)

    @property
    def fleet_table(self) -> bool:
        return self.fleet_replay or (self.fleet is not None and self.fleet.prometheus is not None)


class _Gate:
    """A managed column's source as the feed reads it: not read while its slot has given up (nothing runs
    there), and an answer that arrives after it gave up is dropped."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.name = slot.source.name

    @property
    def interval_s(self) -> float:  # the source's own: `+` and `-` change it while the feed runs
        return self.slot.source.interval_s

    async def read(self) -> list[EngineSample]:
        if self.slot.given_up is not None:
            return []
        samples = await self.slot.source.read()
        return [] if self.slot.given_up is not None else samples


class EnginetopApp(App[None]):
    TITLE = "enginetop"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("f", "probe_now", "Probe"),
        Binding("c", "sweep", "Sweep"),
        Binding("a", "ab", "A/B"),
        Binding("l", "show_log", "Log"),
        Binding("s", "save_svg", "Screenshot"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("plus,equals_sign", "poll(0.5)", "Faster", key_display="+"),
        Binding("minus", "poll(2)", "Slower", key_display="-"),
        Binding("r", "reset", "Reset"),
        *(Binding(str(n), f"switch({n})", f"switch to profile {n}", show=False) for n in range(1, 10)),
    ]
    POLL_BOUNDS_S = (0.25, 10.0)  # `+` and `-` halve or double the engines' poll interval within these

    def __init__(self, config: AppConfig) -> None:
        super().__init__()
        self.config = config
        self.store = Store(horizon_s=config.horizon_s)
        self.clock: Callable[[], float] = time.monotonic  # "now" for the plots: a replay's cursor instead
        self.recorder = config.recorder
        if self.recorder is not None:
            self.store.listeners.append(self.recorder)
        self._record_error_shown = False
        self._states = StateChanges()  # each managed column's last state, to record changes
        self.paused = False
        self.quit_reason = "q"  # or the signal that ended the app
        self.probes = ProbeRunner()
        self._model_bytes: dict[str, float | None] = {}
        self._fleet_drawn: tuple[float, int] | None = None
        self.run_sources = build_sources(
            RunOptions(watched=config.targets, launched=[profile_target(p) for p in config.profiles],
                       fleet=config.fleet, machine=not config.fleet_table, proxy=config.proxy,
                       traffic=config.traffic, bench_runs=not config.fleet_table,
                       poll_interval_s=config.poll_interval_s, gpu_interval_s=config.gpu_interval_s,
                       host_interval_s=config.host_interval_s),
            gpu_report=lambda: self.store.gpu, engine_pids=self._engine_pids,
            gpu_sampler=config.gpu_sampler, host_sampler=config.host_sampler)
        self.fleet: FleetSources | None = self.run_sources.fleet
        # A switch's drain watches this machine's GPUs even when dcgm-exporters feed the GPU panel.
        self._gpu = self.run_sources.gpu or (config.gpu_sampler() if config.profiles else None)
        watched = len(config.targets)
        self.slots: list[Slot] = [Slot(i, source, probe_every_s=config.probe_every_s)
                                  for i, source in enumerate(self.run_sources.engines[:watched])]
        for profile, source in zip(config.profiles, self.run_sources.engines[watched:], strict=True):
            manager = EngineManager(gpu=self._gpu.sample if self._gpu else None)
            self.slots.append(Slot(len(self.slots), source, manager, profile,
                                   probe_every_s=config.probe_every_managed_s))
        for slot in self.slots:
            self.store.engine(slot.target.name, slot.target.url)

    # ---- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        if self.config.fleet_table:
            yield FleetView(id="fleet")
            yield Footer()
            return
        yield Dashboard([slot.target.name for slot in self.slots], notice="\n".join(self.config.notes))
        yield Footer()

    def on_mount(self) -> None:
        self._main = self.screen  # widgets live here; modal screens stack above it
        loop = asyncio.get_running_loop()
        for sig in QUIT_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(sig, self._quit_on_signal, sig)
        self.sub_title = self._subtitle()
        self.run_worker(self._sample_loop(), name="polling", group="poll")
        for slot in self.slots:
            if slot.probe_every_s:
                self.run_worker(self._probe_loop(slot), name=f"probes {slot.index}", group="probe-loop")
            if slot.manager is not None and slot.profile is not None:
                self._run_lifecycle(slot, slot.profile, progress=None, initial=True)
        if self.config.notes and self.slots:
            self.notify("\n".join(self.config.notes), title="engines", timeout=20)
        self.set_interval(self.config.redraw_interval_s, self.redraw)
        self.redraw()

    async def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in QUIT_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        self._cancel_lifecycle()
        self.workers.cancel_all()  # before the HTTP client they use is closed (the feed's reads with them)
        await self.probes.aclose()
        await self.run_sources.aclose()
        if self._gpu is not None and self._gpu is not self.run_sources.gpu:
            await asyncio.to_thread(self._gpu.close)

    # ---- keys of a top ----------------------------------------------------------------------
    def action_poll(self, factor: float) -> None:
        """Poll the engines faster (`+`) or slower (`-`), within POLL_BOUNDS_S."""
        low, high = self.POLL_BOUNDS_S
        for slot in self.slots:
            slot.source.interval_s = min(high, max(low, slot.source.interval_s * factor))
        if self.slots:
            self.notify(f"engines polled every {self.slots[0].source.interval_s:g} s", timeout=3)
            self.sub_title = self._subtitle()

    def action_filter(self) -> None:
        """`/`: filter the engines, where there are more than fit as columns (a line each)."""
        self._main.query_one(Dashboard).open_filter()

    def action_reset(self) -> None:
        """Start the session's figures again: rates, peaks, plots and probes begin from now."""
        for slot in self.slots:
            self.store.reset_engine(slot.target.name)
        self.notify("session figures reset: they start again from the next poll", timeout=3)
        self.redraw()

    def on_engine_panel_detail_asked(self, message: EnginePanel.DetailAsked) -> None:
        name = message.name
        self.push_screen(EngineDetailScreen(name, lambda: self.store.engines.get(name)))

    # ---- polling --------------------------------------------------------------------------
    def _feed(self) -> Feed:
        """The one polling loop (tui.live.feed) over the run's sources (tui.run.sources): each read in its own
        task, so a slow engine delays nobody but itself."""
        managed = {id(slot.source): slot for slot in self.slots if slot.manager is not None}
        sources: list[Source] = [_Gate(managed[id(s)]) if id(s) in managed else s
                                 for s in self.run_sources.all()]
        return Feed(self.store, sources, on_error=self._report_failure)

    async def _sample_loop(self) -> None:
        try:
            await self.run_sources.start()
        except ListenError as exc:  # the port was taken since the command line checked it
            self.notify(f"traffic proxy not started: {exc}", severity="error", timeout=30)
        await self._feed().run()

    def _engine_pids(self) -> dict[str, int]:
        """In the machine source's thread: the watched engines found by port, and the ones we launched."""
        pids = self.run_sources.local_pids()
        for slot in self.slots:
            current = slot.manager.current if slot.manager else None
            if current is not None and current.pid is not None:
                pids[slot.target.name] = current.pid
        return pids

    # ---- probes ---------------------------------------------------------------------------
    async def _probe(self, target: EngineTarget) -> None:
        def keep(result: ProbeResult) -> None:
            self.store.add_probe(target.name, result)
            # A line a probe: the figures outlive the screen (bench/bench_exporter.py reads them to compare
            # the browser view's dashboard with the terminal's).
            ttft = "n/a" if result.ttft_s is None else f"{result.ttft_s * 1000:.2f}"
            log.info("probe %s %s: ttft_ms=%s decode_tps=%s %s", target.name, result.workload, ttft,
                     "n/a" if result.decode_tps is None else f"{result.decode_tps:.1f}",
                     "ok" if result.ok else f"failed: {result.error}")

        params = WorkloadParams(max_tokens=self.config.probe_max_tokens)
        await self.probes.probe(target, self.config.probe_workload, params, repeat=1, on_result=keep,
                                on_progress=lambda progress: self.store.probe_progress(target.name, progress))

    async def _probe_loop(self, slot: Slot) -> None:
        assert slot.probe_every_s
        while True:
            await asyncio.sleep(slot.probe_every_s)
            sample = self.store.engines[slot.target.name].sample
            if isinstance(self.screen, SweepScreen) or self.ab_running:
                continue  # a sweep or A/B is measuring: a probe now would add load to what it measures
            if sample is not None and sample.health == "up" and not self.probes.busy(slot.target):
                await self._probe(slot.target)

    @property
    def ab_running(self) -> bool:
        """An A/B run is measuring (its screen may be closed)."""
        return self.ab_run is not None and not self.ab_run.done

    def _ab_measuring(self) -> bool:
        """Say so when an A/B is running: extra load now would skew what it measures."""
        if self.ab_running:
            self.notify("an A/B run is measuring: wait for it (key a shows its progress)", severity="warning")
            return True
        return False

    def action_probe_now(self) -> None:
        if self._ab_measuring():
            return
        targets = [slot.target for slot in self.slots]
        if isinstance(self.screen, EngineScreen):  # an engine opened from the fleet table
            targets = [self._fleet_target(self.screen.engine_name)]
        started = 0
        for target in targets:
            if not self.probes.busy(target):
                self.run_worker(self._probe(target), name=f"probe {target.name}", group="probe")
                started += 1
        if not started:
            self.notify("a probe is already running on this engine" if len(targets) == 1 else
                        "a probe is already running on every engine", severity="warning")

    def action_sweep(self) -> None:
        if self._ab_measuring():
            return
        self.push_screen(SweepScreen([s.target for s in self.slots], self.probes, self.config.sweep))

    ab_run: ABRun | None = None  # the app owns it: closing its screen neither stops nor loses the run

    def action_ab(self) -> None:
        run = self.ab_run
        if isinstance(self.screen, ABScreen):
            return  # already showing it
        if run is not None and not run.done:
            self.push_screen(ABScreen(run))  # `a` again shows the run in progress, never starts a second
            return
        if len(self.slots) < 2:
            self.notify(f"A/B needs at least two engines on screen (or `{command()} ab PROFILE_A PROFILE_B`)",
                        severity="warning")
            return
        arms = [dashboard_arm(s.target, s.profile, s.manager.current if s.manager else None)
                for s in self.slots]
        run = self.ab_run = start_dashboard_ab(arms, self.config.ab, self.store, self.config.gpu_interval_s)

        async def tell_when_done() -> None:
            while not run.done:
                await asyncio.sleep(0.5)
            comparisons = (run.result or {}).get("analysis", {}).get("comparisons", [])
            self.record_event("ab", None, {"summary": run.summary(), "error": run.error, "verdicts": [
                {"pair": f"{c['other']} / {c['base']}", "verdict": c["verdict"],
                 "decode_ratio": c["decode_tps"]["ratio"], "ci_low": c["decode_tps"]["ci_low"],
                 "ci_high": c["decode_tps"]["ci_high"]} for c in comparisons]})
            self.notify(run.summary(), title="A/B", severity="error" if run.error else "information",
                        timeout=30)

        self.run_worker(tell_when_done(), name="A/B", group="ab")
        self.push_screen(ABScreen(run))

    # ---- roofline ---------------------------------------------------------------------------
    def _roofline(self, state: EngineState) -> Roofline | None:
        """Decode ceiling = bandwidth / weight bytes per token, beside what is measured now."""
        sample = state.sample
        model = sample.model if sample else None
        size, size_source = self.config.model_bytes, "given"
        if size is None and model:
            if model not in self._model_bytes:
                try:  # llama-server names its model by path; vLLM often by a local folder
                    self._model_bytes[model] = model_weight_bytes(model)
                except (OSError, ValueError):
                    self._model_bytes[model] = None
            size, size_source = self._model_bytes[model], model.rsplit("/", 1)[-1]
        bandwidth, bw_source = self.config.bandwidth_bps, "given"
        gpus = self.store.gpu.gpus if self.store.gpu else ()
        if bandwidth is None and gpus and gpus[0].peak_bw_gbps:
            bandwidth, bw_source = gpus[0].peak_bw_gbps * 1e9, "nvml"
        if not size or not bandwidth:
            return None
        probes = [r for _, r in list(state.probes)[-5:] if r.ok]
        measured = median(r.decode_tps for r in probes) if probes else state.stats.decode_tps_busy
        return roofline(size, bandwidth, measured, bandwidth_source=bw_source, bytes_source=size_source)

    # ---- lifecycle ------------------------------------------------------------------------
    def _selected_slot(self, managed: bool) -> Slot | None:
        candidates = [s for s in self.slots if s.manager is not None] if managed else list(self.slots)
        focused = self.focused
        for slot in candidates:
            if focused is not None and focused.id == f"engine-{slot.index}":
                return slot
        return candidates[0] if candidates else None

    def action_switch(self, number: int) -> None:
        profiles = self.config.switchable
        if not 1 <= number <= len(profiles):
            self.notify(f"no profile {number}: {len(profiles)} switchable profile(s), see ?",
                        severity="warning")
            return
        slot = self._selected_slot(managed=True)
        if slot is None or slot.manager is None:
            self.notify("no engine here was started by enginetop: start one with --profile NAME",
                        severity="warning")
            return
        to = profiles[number - 1]
        question = switch_question(slot.manager.current, to)

        def answered(yes: bool | None) -> None:
            if yes:
                progress = SwitchProgress(f"switching {slot.target.name} → {to.name}", threading.Event())
                self.push_screen(progress)
                self._run_lifecycle(slot, to, progress)

        self.push_screen(ConfirmSwitch(question), answered)

    def _run_lifecycle(self, slot: Slot, to: Profile, progress: SwitchProgress | None,
                       initial: bool = False) -> None:
        """Start (initial: or adopt the engine `enginetop up` left running for this profile) or switch."""
        assert slot.manager is not None
        manager = slot.manager
        cancel = progress.cancel if progress else threading.Event()
        new_target = profile_target(to)
        slot.profile = to
        slot.given_up = None
        slot.target = new_target
        self.store.engine(new_target.name, new_target.url)
        self._relabel(slot)

        def on_step(event: StepEvent) -> None:
            self.record_event("switch", slot.target.name, {"to": to.name, **event.to_json()})
            if progress is not None:
                self.call_from_thread(progress.step, event)

        def work() -> tuple[SwitchResult, list[str]]:
            adopted = manager.adopt_recorded(to, on_step=on_step, cancel=cancel) if initial else None
            result = adopted if adopted is not None else manager.switch(to, on_step=on_step, cancel=cancel)
            offer = []
            if not result.ok and manager.current is None and not cancel.is_set():
                offer = self._what_works()
            return result, offer

        def done(result: SwitchResult, offer: list[str]) -> None:
            if progress is not None:
                progress.finish(result.message, result.ok)
            slot.failure = None if result.ok else f"{result.failed_step} failed: {result.message}"
            self.record_event("switch-result", slot.target.name, {
                "to": to.name, "ok": result.ok, "failed_step": result.failed_step, "message": result.message})
            if not result.ok and manager.current is None and not cancel.is_set():
                self._give_up(slot, f"not running: {to.name} did not start ({result.failed_step} failed)")
            if not result.ok:
                self.notify("\n".join([result.message, *offer]), severity="error",
                            title=f"{to.name}: {result.failed_step} failed", timeout=30 if offer else 15)

        async def run() -> None:
            result, offer = await asyncio.to_thread(work)
            done(result, offer)

        self.run_worker(run(), name=f"lifecycle {to.name}", group="lifecycle")

    def _give_up(self, slot: Slot, why: str) -> None:
        """Nothing runs in this column and nothing will until the next start: say so where its health is, and
        stop polling a port nothing listens on."""
        slot.given_up = why
        target = slot.target
        self.store.add(EngineSample(name=target.name, url=target.url, t=time.monotonic(), wall=time.time(),
                                    health="down", health_reason=why))

    def _what_works(self) -> list[str]:
        """In a thread, after a start that left nothing running: the engines running on this machine, or how
        to point enginetop at one."""
        try:
            found = discover().engines
        except Exception as exc:  # discovery is an offer: its failure must not hide the start's
            log.warning("discovery after a failed start: %r", exc)
            found = []
        watched = {slot.target.url for slot in self.slots}
        found = [e for e in found if e.url not in watched]
        if found:
            return [f"running on this machine (`{command()}` with no flags watches them):",
                    *(f"  {e.words()}" for e in found)]
        return [start_hints()[0]]

    def _relabel(self, slot: Slot) -> None:
        if hasattr(self, "_main") and self._main.is_mounted:
            self._main.query_one(f"#engine-{slot.index}", EnginePanel).border_title = slot.target.name
            self.sub_title = self._subtitle()

    def action_show_log(self) -> None:
        slot = self._selected_slot(managed=True)
        if slot is None or slot.manager is None:
            self.notify("no engine here was started by enginetop, so there is no log to show",
                        severity="warning")
            return
        status = slot.manager.poll_status()
        current = slot.manager.current
        path = status.log_path or (current.log_path if current else None)
        self.push_screen(LogScreen(f"log of {slot.target.name}: {path}", path))

    # ---- the one place worker failures surface ----------------------------------------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Say what broke; restart the polling loop; everything else keeps running."""
        worker = event.worker
        if event.state != WorkerState.ERROR or not self.is_running:
            return
        self._report_failure(worker.name, worker.error)
        if worker.group == "poll":
            self.set_timer(2.0, lambda: self.run_worker(self._sample_loop(), name="polling", group="poll"))

    def _report_failure(self, name: str, error: BaseException | None) -> None:
        log.error("%s failed: %r", name, error, exc_info=error)
        if self.is_running:
            self.notify(f"{type(error).__name__}: {error}", title=f"{name} failed", severity="error",
                        timeout=10)

    # ---- the fleet --------------------------------------------------------------------------
    FLEET_OFF = {"toggle_pause", "probe_now", "sweep", "ab", "show_log", "switch"}

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """In the fleet table, typing filters: the single-letter keys of the engine columns are off there
        (and out of the footer); `q` still quits from an engine opened from the table, and `f` probes it."""
        if action == "probe_now" and isinstance(self.screen, EngineScreen):
            return True
        if action == "filter":  # only a dashboard of rows has one (and the footer says so only there)
            return not self.config.fleet_table and len(self.slots) > MAX_COLUMNS
        return not (self.config.fleet_table and action in self.FLEET_OFF)

    def _fleet_target(self, name: str) -> EngineTarget:
        """An engine of the fleet as a probe reaches it: its OpenAI API at the origin Prometheus scrapes."""
        state = self.store.engines.get(name)
        url = state.sample.url if state is not None and state.sample is not None else ""
        key = self.config.fleet.key_for(name) if self.config.fleet is not None else None
        return EngineTarget(name=name, url=url, api_key=key)

    def on_fleet_view_open(self, event: FleetView.Open) -> None:
        screen = EngineScreen(event.name, self.config.horizon_s)
        self.push_screen(screen)
        self._backfill(screen)
        screen.call_after_refresh(self._show_engine, screen)

    def _show_engine(self, screen: EngineScreen) -> None:
        if screen.is_attached:
            screen.show(self.store, self.clock(), self.probes.busy(self._fleet_target(screen.engine_name)))

    def _backfill(self, screen: EngineScreen) -> None:
        """The last 30 minutes of the engine's plots and its node's throttle spans, from query_range."""
        fleet = self.fleet
        if fleet is None or fleet.engines is None or fleet.client is None:
            return
        labels = fleet.engines.labels_of.get(screen.engine_name)
        state = self.store.engines.get(screen.engine_name)
        if labels is None or state is None:
            screen.backfill = "not back-filled: the engine is no longer listed"
            return
        screen.backfill = "back-filling the last 30 minutes from Prometheus…"
        client, queries = fleet.client, fleet.engines.queries

        async def fill() -> None:
            try:
                added = await backfill_engine(client, queries, labels, state, self.config.horizon_s)
                host = state.sample.host if state.sample else None
                if host and state.sample is not None:
                    screen.throttle = await backfill_throttle(client, host, screen.throttle,
                                                              self.config.horizon_s,
                                                              pod=engine_pod(state.sample))
                screen.backfill = "" if added else "nothing to back-fill: Prometheus has no history for it"
            except PromError as exc:
                screen.backfill = f"not back-filled: {exc.message}"
            self._show_engine(screen)

        self.run_worker(fill(), name=f"back-fill {screen.engine_name}", group="backfill")

    def _fleet_status(self) -> FleetStatus:
        fleet = self.fleet
        assert fleet is not None and fleet.client is not None
        engines = fleet.engines
        age = time.monotonic() - engines.last_ok if engines and engines.last_ok else None
        gpu_error = fleet.gpus.error if fleet.gpus is not None else None
        return FleetStatus(source=f"Prometheus {fleet.client.shown}",
                           error=engines.error if engines else None,
                           gpu_error=gpu_error, last_ok_age_s=age,
                           queries=engines.queries_per_read if engines else None)

    def action_fleet_gpus(self) -> None:
        screen = GpusScreen()
        self.push_screen(screen)
        screen.call_after_refresh(screen.show, self.store)

    def _fleet_seen(self) -> tuple[float, int]:
        """Changes when the fleet's figures may have: the table is rebuilt only then."""
        engines = self.fleet.engines if self.fleet else None
        return engines.reads if engines else 0, id(self.store.gpu)

    def redraw_fleet(self, force: bool = False) -> float | None:
        """The table (or the engine opened from it) when something new came in; the seconds it took."""
        engines = self.fleet.engines if self.fleet else None
        if engines is not None:  # the engine opened from the table: its slots, read from it directly
            opened = self.screen.engine_name if isinstance(self.screen, EngineScreen) else None
            if set(engines.slots_of) != ({opened} if opened else set()):
                engines.slots_of = {opened: self._fleet_target(opened)} if opened else {}
        if isinstance(self.screen, EngineScreen):
            self._show_engine(self.screen)
            return None
        if isinstance(self.screen, GpusScreen):
            self.screen.show(self.store)
            return None
        seen = self._fleet_seen()
        fresh = seen != self._fleet_drawn
        if not (fresh or force):
            return None
        self._fleet_drawn = seen
        return self._main.query_one(FleetView).show(self.store, self._fleet_status(), fresh)

    # ---- drawing ------------------------------------------------------------------------
    def redraw(self, force: bool = False) -> None:
        try:
            self._draw(force)
        except NoMatches:
            # The app is quitting: its screen's widgets are removed before its timers stop. Anything else
            # that misses a widget draws nothing, which every test of the screens would see.
            return

    def _draw(self, force: bool) -> None:
        if self.config.fleet_table:
            if not self.paused and hasattr(self, "_main"):
                self.redraw_fleet(force)
            return
        for slot in self.slots:
            if slot.manager is not None:
                status = slot.manager.poll_status()  # cheap: no HTTP; notices a crash
                if slot.failure and status.state == "idle":
                    status = dataclasses.replace(status, state="failed", message=slot.failure)
                slot.status = status
                self.store.engine_start(slot.target.name, status.start_memory)
                if self._states.changed(slot.index, status):  # a crash, a start, a stop: kept
                    self.record_event("engine-state", slot.target.name, status.event_data())
        self._check_recorder()
        if self.paused:
            return
        columns = []
        for slot in self.slots:
            state = self.store.engines[slot.target.name]
            columns.append(Column(state, slot.status, self._roofline(state), self.probes.busy(slot.target),
                                  slot.probe_every_s))
        now = self.clock()
        horizon = self.config.horizon_s
        store = self.store
        self._main.query_one(Dashboard).show(columns, store.engines, now, horizon,
                                             store.throttle_spans(now - horizon), store.gpu, store.host,
                                             ttft_gap_factor=self.config.ttft_gap_factor)

    def on_resize(self, event: events.Resize) -> None:
        self.sub_title = self._subtitle(event.size.width)  # the app's own size follows later (debounced)

    def _subtitle(self, width: int | None = None) -> str:
        fleet = self.config.fleet
        if self.config.fleet_table and fleet is not None:
            state = "PAUSED" if self.paused else f"refreshing every {fleet.refresh_s:g}s"
            return f"fleet view — {state}"
        names = ", ".join(s.target.name for s in self.slots) or "no engines"
        every = self.slots[0].source.interval_s if self.slots else self.config.poll_interval_s  # `+`/`-`
        state = "PAUSED (still recording)" if self.paused else f"polling every {every:g}s"
        rec = self.recorder
        where = "not recording" if rec is None else (
            f"RECORDING STOPPED: {rec.error}" if rec.error else f"recording to {rec.path}")
        # the header leaves ~30 cells around it; a narrow terminal loses the engines' names first (the columns
        # name them), then the polling interval (never PAUSED), then the recording's path
        shorter = [f"{names} — {state} — {where}", f"{state} — {where}"] + ([] if self.paused else [where])
        for text in shorter:
            if len(text) + 30 <= (width or self.size.width):
                return text
        return f"{state} — {'recording' if rec is not None and not rec.error else where}"

    # ---- recording ------------------------------------------------------------------------------
    def record_event(self, kind: str, source: str | None, data: dict) -> None:
        if self.recorder is not None:
            self.recorder.event(kind, source, data)

    def _check_recorder(self) -> None:
        """A recording that stopped (disk full) is said once, loudly; the dashboard goes on."""
        rec = self.recorder
        if rec is not None and rec.error and not self._record_error_shown:
            self._record_error_shown = True
            self.sub_title = self._subtitle()
            self.notify(rec.error, title="recording stopped", severity="error", timeout=30)

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               **kwargs: Any) -> None:
        if severity in ("warning", "error"):  # alerts are part of what happened: kept in the recording
            self.record_event("alert", None, {"title": title, "message": message, "severity": severity})
        # Plain text, not Rich markup: a command such as `pip install 'enginetop[demo]'` must show its [demo].
        kwargs.setdefault("markup", False)
        super().notify(message, title=title, severity=severity, **kwargs)

    # ---- actions ----------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.sub_title = self._subtitle()
        if not self.paused:
            self.redraw()

    def action_save_svg(self) -> None:
        self.config.screenshot_dir.mkdir(parents=True, exist_ok=True)
        name = f"enginetop-{datetime.now():%Y%m%d-%H%M%S}.svg"
        path = self.save_screenshot(filename=name, path=str(self.config.screenshot_dir))
        self.notify(f"saved {path}", title="screenshot")

    def action_help(self) -> None:
        keys = [(b.key_display or b.key, b.description) for b in self.BINDINGS
                if isinstance(b, Binding) and b.show and self.check_action(b.action, ()) is not False]
        if self.config.switchable:
            keys.append(("1-9", "switch the selected engine to: " + ", ".join(
                f"{i} {p.name}" for i, p in enumerate(self.config.switchable[:9], start=1))))
        keys.append(("tab", "select the next engine column (for l and 1-9)"))
        self.push_screen(HelpScreen(keys))

    async def action_quit(self) -> None:
        self._cancel_lifecycle()  # a cold start in progress must not hold the exit for minutes
        self.exit()

    def _quit_on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM / SIGHUP: quit as `q` does, so the engines enginetop started are stopped too."""
        self.quit_reason = sig.name
        log.warning("%s received: quitting", sig.name)
        self._cancel_lifecycle()
        self.exit()

    def _cancel_lifecycle(self) -> None:
        for slot in self.slots:
            if slot.manager is not None:
                slot.manager.cancel()

    def stop_managed(self) -> list[SwitchResult]:
        """Stop the engines this dashboard launched (an engine adopted from `enginetop up` is left running,
        and its result says so); called after the app exits (it blocks)."""
        return [slot.manager.shutdown() for slot in self.slots if slot.manager is not None]

