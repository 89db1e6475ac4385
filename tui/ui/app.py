"""The Textual app: layout, polling, drawing, the keys of a top, and the one place worker errors are handled.

Polling never blocks the event loop: engines are polled with an async httpx client; NVML, psutil and
engine lifecycle steps run in threads. Widgets redraw from the store on one UI timer.

The app's other jobs are rooms of their own, each a mixin on AppCore (tui/ui/core.py: what the app owns and
the services every room calls): measuring the engines (measuring.py: probes, sweeps, A/B), starting and
switching the engines enginetop drives (lifecycle.py), and the fleet table (fleet.py). An engine column is
a Slot (slots.py); what the app is asked to do, an AppConfig (config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from datetime import datetime

from textual import events
from textual.app import ComposeResult, ScreenStackError
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState

from tui.base.stats import median
from tui.compare.roofline import Roofline, model_weight_bytes, roofline
from tui.live.engine_state import EngineState
from tui.live.feed import Feed
from tui.net.listen import ListenError
from tui.ui.fleet import FleetMode
from tui.ui.lifecycle import Lifecycle
from tui.ui.measuring import Measuring
from tui.ui.screens.dashboard import Column, Dashboard
from tui.ui.screens.engine_detail import EngineDetailScreen
from tui.ui.screens.fleet import FleetView
from tui.ui.screens.help import HelpScreen
from tui.ui.slots import feed_sources
from widgets.engine_panel import EnginePanel

log = logging.getLogger(__name__)

QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class EnginetopApp(Measuring, Lifecycle, FleetMode):
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
        sources = feed_sources(self.run_sources.all(), self.slots)
        return Feed(self.store, sources, on_error=self._report_failure)

    async def _sample_loop(self) -> None:
        try:
            await self.run_sources.start()
        except ListenError as exc:  # the port was taken since the command line checked it
            self.notify(f"traffic proxy not started: {exc}", severity="error", timeout=30)
        await self._feed().run()

    # ---- the one place worker failures surface (AppCore._report_failure says them) ---------------
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """Say what broke; restart the polling loop; everything else keeps running."""
        worker = event.worker
        if event.state != WorkerState.ERROR or not self.is_running:
            return
        self._report_failure(worker.name, worker.error)
        if worker.group == "poll":
            self.set_timer(2.0, lambda: self.run_worker(self._sample_loop(), name="polling", group="poll"))

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

    # ---- drawing ------------------------------------------------------------------------
    def redraw(self, force: bool = False) -> None:
        try:
            self._draw(force)
        except (NoMatches, ScreenStackError):
            # The app is quitting: its screen's widgets, then its screens, are removed before its timers
            # stop. Anything else that misses a widget draws nothing, which every test of the screens would
            # see.
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
