"""The dashboard in fleet mode (--prometheus, or a replayed fleet recording): the table of every engine a
Prometheus scrapes, an engine opened from it with its history back-filled, and the keys that are off there.

A room of its own because nothing here touches an engine column: the table is redrawn only when the fleet's
figures may have changed, and an opened engine is reached through the origin Prometheus scrapes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tui.fleet.match import engine_pod
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.ui.core import AppCore
from tui.ui.screens.dashboard import MAX_COLUMNS
from tui.ui.screens.fleet import EngineScreen, FleetStatus, FleetView, GpusScreen

if TYPE_CHECKING:  # a dashboard without --prometheus never imports the fleet's clients
    from tui.fleet.options import FleetOptions


def fleet_target(store: Store, fleet: FleetOptions | None, name: str) -> EngineTarget:
    """An engine of the fleet as a probe reaches it: its OpenAI API at the origin Prometheus scrapes."""
    state = store.engines.get(name)
    url = state.sample.url if state is not None and state.sample is not None else ""
    key = fleet.key_for(name) if fleet is not None else None
    return EngineTarget(name=name, url=url, api_key=key)


class FleetMode(AppCore):
    """The fleet table's keys, its opened engine and its redraw; a mixin of EnginetopApp."""

    # the keys of the engine columns: in the fleet table typing filters instead
    FLEET_OFF = {"toggle_pause", "probe_now", "sweep", "ab", "show_log", "switch"}

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """In the fleet table, typing filters: the single-letter keys of the engine columns are off there
        (and out of the footer); `q` still quits from an engine opened from the table, and `f` probes it."""
        if action == "probe_now" and isinstance(self.screen, EngineScreen):
            return True
        if action == "filter":  # only a dashboard of rows has one (and the footer says so only there)
            return not self.config.fleet_table and len(self.slots) > MAX_COLUMNS
        return not (self.config.fleet_table and action in self.FLEET_OFF)

    def on_fleet_view_open(self, event: FleetView.Open) -> None:
        screen = EngineScreen(event.name, self.config.horizon_s)
        self.push_screen(screen)
        self._backfill(screen)
        screen.call_after_refresh(self._show_engine, screen)

    def _show_engine(self, screen: EngineScreen) -> None:
        if screen.is_attached:
            target = fleet_target(self.store, self.config.fleet, screen.engine_name)
            screen.show(self.store, self.clock(), self.probes.busy(target))

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
        from tui.fleet.backfill import backfill_engine, backfill_throttle
        from tui.fleet.prometheus import PromError

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
                engines.slots_of = ({opened: fleet_target(self.store, self.config.fleet, opened)}
                                    if opened else {})
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
