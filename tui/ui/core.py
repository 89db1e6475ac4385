"""What one dashboard owns, and the few services every room of it calls.

The app is split by job: tui/ui/app.py lays it out, polls, draws and holds the keys of a top; measuring.py
probes, sweeps and runs A/B; lifecycle.py starts and switches the engines enginetop drives; fleet.py is the
fleet table. Each room is a mixin on AppCore, so each reads the same store, columns and sources with their
types, and none calls another room's methods (measuring.py borrows fleet.py's plain fleet_target): what more
than one of them calls (a notification that is also recorded, a worker's failure said, the header's
subtitle) is here.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.notifications import SeverityLevel
from textual.screen import Screen

from tui.lifecycle.switch import EngineManager, StateChanges
from tui.live.store import Store
from tui.probe.runner import ProbeRunner
from tui.run.sources import RunOptions, build_sources
from tui.run.targets import profile_target
from tui.ui.config import AppConfig
from tui.ui.slots import Slot

if TYPE_CHECKING:
    from tui.fleet.options import FleetSources

log = logging.getLogger(__name__)


class AppCore(App[None]):
    """The state every room of the dashboard reads, set up once; the base of each of its mixins."""

    # the screen the widgets live on (set on mount); modal screens stack above it
    _main: Screen[object]

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

    def run(self, *args: Any, **kwargs: Any) -> None:
        """Textual's run, with what start-up built (modules, classes, the engines' tables, this app) frozen
        first: it lives as long as the process, and Python's full collection walks every tracked object
        however old, 60-85 ms for the ~100,000 of a dashboard on vLLM, about once a minute under traffic;
        left out of it, 18 ms (bench/bench_cycle.py against its --no-freeze). Start-up's garbage is collected
        first (discovery's refused connects leave cycles), since a frozen cycle is never collected; what is
        frozen is still freed when its last reference goes."""
        gc.collect()
        gc.freeze()
        return super().run(*args, **kwargs)

    def _engine_pids(self) -> dict[str, int | str]:
        """In the machine source's thread: the watched engines found by port, and the ones we launched."""
        pids = self.run_sources.local_pids()
        for slot in self.slots:
            current = slot.manager.current if slot.manager else None
            if current is not None and current.pid is not None:
                pids[slot.target.name] = current.pid
        return pids

    # ---- the one place worker failures are said ------------------------------------------------
    def _report_failure(self, name: str, error: BaseException | None) -> None:
        log.error("%s failed: %r", name, error, exc_info=error)
        if self.is_running:
            self.notify(f"{type(error).__name__}: {error}", title=f"{name} failed", severity="error",
                        timeout=10)

    # ---- the header -----------------------------------------------------------------------------
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
