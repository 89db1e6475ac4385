"""The Textual app: layout, keys, polling workers, and the one place worker errors are handled.

Polling never blocks the event loop: engines are polled with an async httpx client; NVML and psutil
run in threads (asyncio.to_thread). Widgets redraw from the store on one UI timer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

import httpx
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState

from tui.screens.help import HelpScreen
from tui.sources.engine import EngineTarget, poll_engine
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler, engine_tree_pids, pid_listening_on
from tui.store import Store
from widgets.engine_panel import EnginePanel
from widgets.gpu_panel import GpuPanel
from widgets.host_panel import HostPanel
from widgets.plots import PlotData, TimePlot

log = logging.getLogger(__name__)

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


@dataclass
class AppConfig:
    targets: list[EngineTarget]
    poll_interval_s: float = 1.0
    gpu_interval_s: float = 1.0
    host_interval_s: float = 2.0
    redraw_interval_s: float = 1.0
    horizon_s: float = 300.0
    screenshot_dir: Path = Path("screenshots")
    launched_pids: dict[str, int] = field(default_factory=dict)  # engines enginetop started itself
    gpu_sampler: Callable[[], GpuSampler] = GpuSampler
    host_sampler: Callable[[], HostSampler] = HostSampler


class EnginetopApp(App[None]):
    TITLE = "enginetop"
    CSS = """
    #engines { height: auto; }
    #engines > EnginePanel { width: 1fr; }
    #plots { height: 1fr; min-height: 12; }
    #plots > TimePlot { width: 1fr; }
    #bottom { height: auto; }
    #bottom > GpuPanel { width: 2fr; }
    #bottom > HostPanel { width: 1fr; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("p", "toggle_pause", "Pause"),
        Binding("s", "save_svg", "Screenshot"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(self, config: AppConfig) -> None:
        super().__init__()
        self.config = config
        self.store = Store(horizon_s=config.horizon_s)
        self.paused = False
        self._client: httpx.AsyncClient | None = None
        self._gpu = config.gpu_sampler()
        self._host = config.host_sampler()
        self._engine_pids: dict[str, int] = dict(config.launched_pids)
        for target in config.targets:
            self.store.engine(target.name, target.url)

    # ---- layout -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="engines"):
            for target in self.config.targets:
                yield EnginePanel(target.name, id=f"engine-{_css_id(target.name)}")
        with Horizontal(id="plots"):
            yield TimePlot(id="plot-gen")
            yield TimePlot(id="plot-ttft")
        with Horizontal(id="bottom"):
            yield GpuPanel(id="gpu")
            yield HostPanel(id="host")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self._subtitle()
        self._client = httpx.AsyncClient()
        for target in self.config.targets:
            self.run_worker(self._engine_loop(target), name=f"engine {target.name}", group="poll")
        self.run_worker(self._gpu_loop(), name="NVML", group="poll")
        self.run_worker(self._host_loop(), name="host", group="poll")
        self.set_interval(self.config.redraw_interval_s, self.redraw)
        self.redraw()

    async def on_unmount(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # ---- polling --------------------------------------------------------------------------
    async def _engine_loop(self, target: EngineTarget) -> None:
        assert self._client is not None
        interval = self.config.poll_interval_s
        launched = target.name in self.config.launched_pids
        while True:
            started = time.monotonic()
            sample = await poll_engine(self._client, target, timeout=min(2.0, interval * 2),
                                       launched_by_us=launched)
            self.store.add_engine_sample(sample)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _gpu_loop(self) -> None:
        while True:
            started = time.monotonic()
            pids = {name: engine_tree_pids(pid) for name, pid in self._engine_pids.items()}
            report = await asyncio.to_thread(self._gpu.sample, pids)
            self.store.add_gpu_report(report)
            await asyncio.sleep(max(0.0, self.config.gpu_interval_s - (time.monotonic() - started)))

    async def _host_loop(self) -> None:
        next_pid_scan = 0.0
        while True:
            started = time.monotonic()
            if started >= next_pid_scan:
                # Finding who listens on a port walks /proc: do it rarely, engines seldom move.
                await asyncio.to_thread(self._find_local_engine_pids)
                next_pid_scan = started + 10.0
            sample = await asyncio.to_thread(self._host.sample, dict(self._engine_pids))
            self.store.add_host_sample(sample)
            await asyncio.sleep(max(0.0, self.config.host_interval_s - (time.monotonic() - started)))

    def _find_local_engine_pids(self) -> None:
        for target in self.config.targets:
            if target.name in self.config.launched_pids:
                continue
            parsed = urlparse(target.url)
            if parsed.hostname in LOCAL_HOSTS and parsed.port:
                pid = pid_listening_on(parsed.port)
                if pid is not None:
                    self._engine_pids[target.name] = pid
                else:
                    self._engine_pids.pop(target.name, None)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place worker failures surface: say what broke, keep everything else running."""
        worker = event.worker
        if event.state != WorkerState.ERROR:
            return
        error = worker.error
        log.error("worker %s failed: %r", worker.name, error)
        self.notify(f"{worker.name}: {type(error).__name__}: {error}", title="poller failed; restarting",
                    severity="error", timeout=8)
        if worker.group == "poll":
            self.set_timer(2.0, lambda: self._restart(worker.name))

    def _restart(self, name: str) -> None:
        if name == "NVML":
            self.run_worker(self._gpu_loop(), name=name, group="poll")
        elif name == "host":
            self.run_worker(self._host_loop(), name=name, group="poll")
        else:
            for target in self.config.targets:
                if name == f"engine {target.name}":
                    self.run_worker(self._engine_loop(target), name=name, group="poll")

    # ---- drawing ------------------------------------------------------------------------
    def redraw(self) -> None:
        if self.paused:
            return
        for target in self.config.targets:
            panel = self.query_one(f"#engine-{_css_id(target.name)}", EnginePanel)
            panel.show(self.store.engines[target.name])
        now = time.monotonic()
        horizon = self.config.horizon_s
        spans = [(a - now, b - now) for a, b in self.store.throttle_spans(now - horizon)]
        self.query_one("#plot-gen", TimePlot).show(
            self._plot("generation tok/s (rate of counters)", "tok/s", "gen_tps", now, spans))
        self.query_one("#plot-ttft", TimePlot).show(
            self._plot("TTFT p50 (from histograms)", "seconds", "ttft_p50_s", now, spans))
        self.query_one("#gpu", GpuPanel).show(self.store.gpu)
        self.query_one("#host", HostPanel).show(self.store.host)

    def _plot(self, title: str, ylabel: str, key: str, now: float,
              spans: list[tuple[float, float]]) -> PlotData:
        t0 = now - self.config.horizon_s
        lines = {}
        for name, state in self.store.engines.items():
            points = state.series[key].since(t0)
            lines[name] = ([t - now for t, _ in points], [v for _, v in points])
        return PlotData(title=title, ylabel=ylabel, horizon_s=self.config.horizon_s, lines=lines,
                        throttle_spans=spans)

    def _subtitle(self) -> str:
        names = ", ".join(t.name for t in self.config.targets) or "no engines"
        every = self.config.poll_interval_s
        state = "PAUSED (still recording)" if self.paused else f"polling every {every:g}s"
        return f"{names} — {state}"

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
        keys = [(b.key_display or b.key, b.description) for b in self.BINDINGS if isinstance(b, Binding)]
        self.push_screen(HelpScreen(keys))


def _css_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
