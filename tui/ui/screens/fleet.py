"""The fleet screens: the table of every engine a Prometheus knows (FleetView, the main screen in fleet
mode) and one engine opened from it (EngineScreen: the column-and-plots view, `escape` back).

As in htop and nvitop, `/` starts filtering (every word must match engine, job, model, host, status or alert
text) and `q` quits unless the focus is in the filter; `escape` leaves the filter (keeping it), and in the
table clears it. up/down/page keys move in the table (or a click), enter opens the engine under the cursor;
a click on a column's header sorts by it (again: the other way round), as ctrl+s (the next column) and
ctrl+r (reverse) do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static

from tui.fleet.match import engine_pod, gpus_of
from tui.live.series import Series, spans
from tui.live.shares import gpu_shares
from tui.live.store import Store
from tui.model.samples import GpuReport
from tui.ui.screens.dashboard import Column, Dashboard
from widgets.fleet_table import COLUMNS, FleetTable, build_rows, order
from widgets.gpu_panel import GpuPanel

GEN_TITLE = "generation tok/s: Prometheus (lines), probe decode (x)"
TTFT_TITLE = "TTFT p50: Prometheus (lines), probes (x)"


@dataclass
class FleetStatus:
    """The line above the table: where the figures come from and what went wrong, if anything."""

    source: str
    error: str | None = None
    gpu_error: str | None = None
    last_ok_age_s: float | None = None
    queries: int | None = None


class FleetView(Vertical):
    BINDINGS = [
        Binding("down", "cursor(1)", "down", show=False),
        Binding("up", "cursor(-1)", "up", show=False),
        Binding("pagedown", "cursor(20)", "page down", show=False),
        Binding("pageup", "cursor(-20)", "page up", show=False),
        Binding("ctrl+s", "sort(1)", "Sort by next column"),
        Binding("ctrl+r", "reverse", "Reverse order"),
        Binding("slash", "focus_filter", "Filter", key_display="/"),
        Binding("escape", "escape", "Leave / clear filter"),
        Binding("ctrl+g", "app.fleet_gpus", "All GPUs"),
        Binding("enter", "open", "Open", show=False),  # with the table focused (a click, tab)
    ]
    DEFAULT_CSS = """
    FleetView { height: 1fr; }
    FleetView > #fleet-status { height: auto; padding: 0 1; }
    FleetView > Input { height: 3; }
    """

    class Open(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-status")
        # no blinking cursor: a blink is a repaint twice a second, for ever, with nothing new to show
        typed = Input(placeholder="/ to filter: engine, job, model, host, status", id="fleet-filter")
        typed.cursor_blink = False
        yield typed
        yield FleetTable(id="fleet-table")

    def on_mount(self) -> None:
        self.table.focus()  # keys are commands (q quits) until `/` opens the filter

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    _rows: list = []  # the last rows built from the store: a key press re-filters them, never rebuilds
    _n_gpus = 0
    _status_line: Text | None = None

    def show(self, store: Store, status: FleetStatus, fresh: bool = True) -> float:
        """Redraw; `fresh`: the store has new samples (else only the filter or the order changed).
        Returns the seconds it took."""
        started = time.perf_counter()
        if fresh or not self._rows:
            gpus = store.gpu.gpus if store.gpu else ()
            self._rows, self._n_gpus = build_rows(store.engines, gpus), len(gpus)
        rows = self._rows
        table = self.table
        shown = order(rows, table.sort_column, table.sort_reverse, self.query_one(Input).value)
        table.show(shown)
        line = self._status(status, rows, len(shown), self._n_gpus)
        if line != self._status_line:  # an update re-lays out the screen (the line's height may change)
            self._status_line = line
            self.query_one("#fleet-status", Static).update(line)
        return time.perf_counter() - started

    def _status(self, status: FleetStatus, rows, shown: int, n_gpus: int) -> Text:
        down = sum(1 for r in rows if r.values[0] == "down")
        alerts = sum(1 for r in rows if r.values[0] == "alert")
        line = Text(f"{status.source}  ", style="bold")
        line.append(f"{len(rows)} engines ({shown} shown), {down} down, {alerts} alerting, {n_gpus} GPUs")
        sort = COLUMNS[self.table.sort_column].label
        line.append(f"   sorted by {sort} {'↓' if self.table.sort_reverse else '↑'}", style="dim")
        if status.queries is not None:
            line.append(f"   {status.queries} queries/refresh", style="dim")
        for error in (status.error, status.gpu_error):
            if error:
                age = f" (values {status.last_ok_age_s:.0f} s old)" if status.last_ok_age_s else ""
                line.append(f"\n{error}{age}", style="bold yellow")
        return line

    def refresh_order(self) -> None:
        redraw = getattr(self.app, "redraw", None)
        if redraw is not None:
            redraw(force=True)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refresh_order()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()  # back from the engine, keys are commands again (q quits, / filters)
        self.action_open()

    def action_open(self) -> None:
        name = self.table.selected
        if name is not None:
            self.post_message(self.Open(name))

    def on_fleet_table_sorted(self, event: FleetTable.Sorted) -> None:
        self.refresh_order()

    def action_cursor(self, delta: int) -> None:
        self.table.move(delta)

    def action_sort(self, step: int) -> None:
        table = self.table
        table.sort_column = (table.sort_column + step) % len(COLUMNS)
        self.refresh_order()

    def action_reverse(self) -> None:
        self.table.sort_reverse = not self.table.sort_reverse
        self.refresh_order()

    def action_focus_filter(self) -> None:
        self.query_one(Input).focus()

    def action_escape(self) -> None:
        """In the filter: leave it (the filter stays); in the table: clear the filter."""
        typed = self.query_one(Input)
        if typed.has_focus:
            self.table.focus()
        else:
            typed.value = ""


class GpusScreen(Screen[None]):
    """Every remote GPU (dcgm-exporter, through Prometheus or --dcgm), node by node; `escape` back."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back to the fleet"), Binding("q", "app.quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield GpuPanel(id="fleet-gpus")
        yield Footer()

    def show(self, store: Store) -> None:
        for panel in self.query(GpuPanel):  # none until composed: a redraw can come first
            panel.show(store.gpu, gpu_shares(store.gpu))


class EngineScreen(Screen[None]):
    """One engine of the fleet in the dashboard's own column-and-plots view (tui.ui.screens.dashboard): its
    column and probes, its plots (back-filled from Prometheus, or the replayed history) with probe markers
    and its node's throttle spans, its node's remote GPUs below. `f` probes it; `escape` back."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back to the fleet"), Binding("q", "app.quit", "Quit")]

    def __init__(self, name: str, horizon_s: float) -> None:
        super().__init__()
        self.engine_name = name
        self.horizon_s = horizon_s
        self.backfill: str = ""  # what the back-fill is doing, said on the plots while it is not done
        self.throttle = Series(horizon_s, 3600, peak=True)  # this node's GPUs only

    def compose(self) -> ComposeResult:
        yield Header()
        yield Dashboard([self.engine_name], host=False, gen_title=GEN_TITLE, ttft_title=TTFT_TITLE)
        yield Footer()

    def show(self, store: Store, now: float, probing: bool = False) -> None:
        """Draw the engine as the store has it at `now` (time.monotonic(), or a replay's cursor)."""
        state = store.engines.get(self.engine_name)
        if state is None:
            return
        host = state.sample.host if state.sample else None
        report = store.gpu
        node = gpus_of(state.sample, report.gpus) if report and state.sample else ()
        gpu: GpuReport | None = None
        if report is not None:
            gpu = GpuReport(t=report.t, gpus=tuple(node), error=report.error) if node else \
                GpuReport(t=report.t, unavailable=f"no dcgm-exporter series for {_where(state.sample, host)}")
            last = self.throttle.points[-1][0] if self.throttle.points else None
            if node and last is not None and report.t < last:  # a replay went back: start again
                self.throttle = Series(self.horizon_s, 3600, peak=True)
            if node:
                self.throttle.add(report.t, 1.0 if any(g.throttled for g in node) else 0.0)
        panels = self.query(GpuPanel)
        if not panels:
            return  # pushed but not composed yet (a redraw or a back-fill can come first): the next one draws
        panel = panels.first()
        title = f"GPUs of {host}" if host else "GPUs"
        if panel.border_title != title:
            panel.border_title = title
        self.query_one(Dashboard).show([Column(state, probing=probing)], {self.engine_name: state}, now,
                                       self.horizon_s, spans(self.throttle, now - self.horizon_s), gpu,
                                       note=self.backfill)


def _where(sample, host: str | None) -> str:
    pod = engine_pod(sample) if sample is not None else None
    return f"pod {pod[1]} or node {host}" if pod else f"node {host}"
