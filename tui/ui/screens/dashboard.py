"""The column-and-plots view: engine columns with their probes below, the tok/s and TTFT plots (probe markers,
throttle spans), the GPU panel and the host panel. The main screen is one; an engine opened from the fleet
table is another (one column, its node's remote GPUs, no host panel).

It only lays the widgets out and hands them what it is given: the caller says which engines, what their
lifecycle says, which GPUs, and the time "now" is (a replay's cursor, or time.monotonic()).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical
from textual.widgets import Input, Static

from tui.live.engine_state import EngineState
from tui.live.probe_summary import probe_medians
from tui.live.shares import gpu_shares, host_shares
from tui.live.store import BENCH_TTFT, TRAFFIC_TTFT
from tui.model.samples import GpuReport, HostSample
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR
from widgets.engine_panel import EnginePanel
from widgets.gpu_panel import GpuPanel
from widgets.host_panel import HostPanel
from widgets.plots import PlotData, TimePlot
from widgets.probe_panel import ProbePanel

if TYPE_CHECKING:
    from tui.compare.roofline import Roofline
    from tui.model.status import EngineStatus

MAX_COLUMNS = 4
MIN_PLOT_ROWS = 30  # below this many rows the plots give way to the figures
GEN_TITLE = "generation tok/s: counters (lines), probe decode (x)"
TTFT_TITLE = "TTFT p50: engine or proxy (lines), probes (x)"


@dataclass
class Column:
    """What one engine column shows."""

    state: EngineState
    status: EngineStatus | None = None  # the launcher's state, for an engine enginetop started
    roof: Roofline | None = None
    probing: bool = False
    probe_every_s: float | None = None


class Dashboard(Vertical):
    DEFAULT_CSS = """
    Dashboard { height: 1fr; }
    Dashboard > #engines { layout: grid; grid-rows: auto auto; height: auto; }
    Dashboard > #plots { height: 1fr; min-height: 12; }
    Dashboard #plots > TimePlot { width: 1fr; }
    /* a node of 8 GPUs scrolls: the plots keep their room */
    Dashboard > #bottom { height: auto; max-height: 30%; overflow-y: auto; }
    Dashboard #bottom > GpuPanel { width: 2fr; }
    Dashboard #bottom > HostPanel { width: 1fr; }
    Dashboard #no-engines { padding: 1 2; }
    Dashboard > #engine-filter { height: 3; display: none; }
    Dashboard > #engine-filter.open { display: block; }
    Dashboard #no-match { display: none; padding: 0 1; color: $text-muted; }
    """
    # `/` (the app's key) opens the filter of a dashboard of rows; as in the fleet table and htop, every typed
    # word must match the engine's name, model, state or a finding; `escape` leaves the filter (keeping
    # it), and outside it clears it.
    BINDINGS = [Binding("escape", "leave_filter", "Leave / clear filter", show=False)]

    def __init__(self, names: Sequence[str], host: bool = True, gen_title: str = GEN_TITLE,
                 ttft_title: str = TTFT_TITLE, notice: str = "", **kwargs) -> None:
        """`notice`: said where the engine columns would be, when there are none (why, and what to run)."""
        super().__init__(**kwargs)
        self.names = list(names)
        self.rows = len(self.names) > MAX_COLUMNS  # more engines than fit as columns: a line each
        self.notice = notice
        self.host = host
        self.titles = {"gen_tps": gen_title, "ttft_p50_s": ttft_title}
        self.words: list[str] = []  # the filter's, lower case
        self._haystacks: list[str] = []  # what the filter matches, per engine, from the last show()

    def compose(self) -> ComposeResult:
        # A grid, no container per column (every container is one more widget to paint when a panel beside it
        # changes). The number of engines decides its shape: one engine uses the width (its column and its
        # probes side by side); two to four are columns with their probes below; more are a line each, as
        # the fleet table draws them (`enter` opens one's every figure).
        n = len(self.names)
        if self.rows:
            typed = Input(placeholder="filter: name, model, state, finding (escape leaves)",
                          id="engine-filter")
            typed.cursor_blink = False  # a blink is a repaint twice a second, for ever
            typed.can_focus = False  # until `/` opens it: the screen's first focus goes to the engines
            yield typed
        with Container(id="engines") as engines:
            engines.styles.grid_size_columns = 2 if n == 1 else 1 if self.rows else max(1, n)
            for i, name in enumerate(self.names):
                yield EnginePanel(name, row=self.rows, id=f"engine-{i}")
                if n == 1:
                    yield ProbePanel(id="probes-0")
            if n > 1 and not self.rows:
                for i in range(n):
                    yield ProbePanel(id=f"probes-{i}")
            if not self.names and self.notice:
                yield Static(self.notice, id="no-engines", markup=False)
            if self.rows:
                yield Static("no engine matches the filter", id="no-match")
        with Horizontal(id="plots"):
            yield TimePlot(id="plot-gen")
            yield TimePlot(id="plot-ttft")
        with Horizontal(id="bottom"):
            yield GpuPanel(id="gpu")
            if self.host:
                yield HostPanel(id="host")

    def show(self, columns: Sequence[Column], plotted: dict[str, EngineState], now: float, horizon_s: float,
             spans: list[tuple[float, float]], gpu: GpuReport | None, host: HostSample | None = None,
             note: str = "", ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR) -> None:
        """`plotted`: the engines drawn on the plots (a switched column keeps its old line); `spans`:
        throttled periods on the plots' clock; `note`: said after the plots' titles (a back-fill running)."""
        if self.rows:
            self._haystacks = [haystack(column.state) for column in columns]
            self._filter()
        for i, column in enumerate(columns):
            state = column.state
            self.query_one(f"#engine-{i}", EnginePanel).show(state, column.status, column.roof)
            if not self.rows:
                results = [r for _, r in state.probes]
                self.query_one(f"#probes-{i}", ProbePanel).show(
                    results, column.probing, column.probe_every_s, ttft_gap_factor, probe_medians(results))
        plots = self.query_one("#plots")
        plots.display = (self.app.size.height or MIN_PLOT_ROWS) >= MIN_PLOT_ROWS
        rel_spans = [(a - now, b - now) for a, b in spans]
        # the newest probe's time, not the count: probes older than the horizon are dropped
        # and what an empty TTFT chart says it lacks, and whether the proxy's TTFT has a point
        events = (len(rel_spans), note, _no_ttft(plotted), tuple(
            (name, st.probes[-1][0] if st.probes else None, _points(st, TRAFFIC_TTFT) > 0)
            for name, st in plotted.items()))
        for plot_id, key, ylabel, probe_value in (
                ("#plot-gen", "gen_tps", "tok/s", lambda r: (r.decode_at, r.decode_tps)),
                ("#plot-ttft", "ttft_p50_s", "seconds", lambda r: (r.ttft_at, r.ttft_s))):
            plot = self.query_one(plot_id, TimePlot)
            # a plotext rebuild is the costliest thing here; hidden plots are not rebuilt at all
            if plots.display and plot.due(now, horizon_s, events):
                title = f"{self.titles[key]} — {note}" if note else self.titles[key]
                plot.show(plot_data(title, ylabel, key, probe_value, plotted, now, horizon_s, rel_spans), now)
        self.query_one("#gpu", GpuPanel).show(gpu, gpu_shares(gpu))
        if self.host:
            self.query_one("#host", HostPanel).show(host, None if host is None else host_shares(host))


    # --- the filter (rows only) ---------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Only a dashboard of rows has a filter: elsewhere `escape` is the screen's (back, close)."""
        return self.rows if action == "leave_filter" else True

    def open_filter(self) -> None:
        typed = self.query_one("#engine-filter", Input)
        typed.add_class("open")
        typed.can_focus = True
        typed.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.words = event.value.lower().split()
        self._filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_leave_filter()

    def action_leave_filter(self) -> None:
        """In the filter: leave it, the filter kept; outside it: clear it."""
        typed = self.query_one("#engine-filter", Input) if self.rows else None
        if typed is None:
            return
        if typed.has_focus:
            shown = [p for p in self.query(EnginePanel) if p.display]
            if shown:
                shown[0].focus()
            else:  # nothing matches: out of the field all the same, so q quits and escape clears
                self.screen.set_focus(None)
            if not typed.value:
                typed.remove_class("open")
                typed.can_focus = False
        else:
            typed.value = ""
            typed.remove_class("open")
            typed.can_focus = False

    def _filter(self) -> None:
        """Each row shown where every word of the filter is in its haystack; a line when none is."""
        kept = 0
        for i, hay in enumerate(self._haystacks):
            keep = all(w in hay for w in self.words)
            kept += keep
            panel = self.query_one(f"#engine-{i}", EnginePanel)
            if panel.display != keep:
                panel.display = keep
        none = bool(self._haystacks) and not kept
        note = self.query_one("#no-match", Static)
        if note.display != none:
            note.display = none


def _points(state: EngineState, key: str) -> int:
    series = state.series.get(key)
    return len(series.points) if series is not None else 0


def haystack(state: EngineState) -> str:
    """What a typed filter matches of an engine, lower case: its name, model, state and findings."""
    sample = state.sample
    parts = [state.name]
    if sample is not None:
        parts += [sample.model or "", sample.health, sample.health_reason or ""]
    parts += [f.title for f in state.findings]
    return " ".join(parts).lower()


ProbeValue = Callable[[Any], tuple[float | None, float | None]]  # a probe result -> (when, figure)


def _bench_lines(lines: dict[str, tuple[list[float], list[float]]], engines: dict[str, EngineState],
                 now: float, t0: float, horizon_s: float) -> None:
    """A bench or capacity run's live TTFT beside the engine's own, and its SLO's TTFT limit across the
    chart while it runs."""
    for name, state in engines.items():
        series = state.series.get(BENCH_TTFT)
        points = series.since(t0) if series is not None else []
        if points:
            lines[f"{name} bench"] = ([t - now for t, _ in points], [v for _, v in points])
        bench = state.bench.progress if state.bench is not None else None
        if bench is not None and bench.state == "running" and bench.slo_ttft_s is not None:
            lines[f"SLO ttft {bench.slo_ttft_s * 1000:g} ms"] = ([-horizon_s, 0.0], [bench.slo_ttft_s] * 2)


def _no_ttft(engines: dict[str, EngineState]) -> str:
    """An empty TTFT chart's title: what would fill it."""
    readings = [s.sample.reading for s in engines.values() if s.sample is not None and s.sample.reading]
    if readings and all(r.dialect == "llamacpp" and r.ttft_buckets is None for r in readings):
        return "TTFT p50: llama.cpp has none; probes/proxy fill it"
    return "TTFT p50: no request has finished yet"


def plot_data(title: str, ylabel: str, key: str, probe_value: ProbeValue,
              engines: dict[str, EngineState], now: float, horizon_s: float,
              spans: list[tuple[float, float]]) -> PlotData:
    """Each engine's series as a line and its probes as markers, x in seconds relative to `now`."""
    t0 = now - horizon_s
    lines: dict[str, tuple[list[float], list[float]]] = {}
    markers: dict[str, tuple[list[float], list[float]]] = {}
    for name, state in engines.items():
        points = state.series[key].since(t0)
        lines[name] = ([t - now for t, _ in points], [v for _, v in points])
        # a marker sits at the instant its figure measured (mid-span), not when the request ended
        probes = [probe_value(r) for _, r in state.probes]
        kept = [(at - now, y) for at, y in probes if at is not None and y is not None and at >= t0]
        markers[name] = ([x for x, _ in kept], [y for _, y in kept])
    if key == "ttft_p50_s":
        _bench_lines(lines, engines, now, t0, horizon_s)
        for name, state in engines.items():
            if (series := state.series.get(TRAFFIC_TTFT)) is not None and (points := series.since(t0)):
                lines[f"{name} traffic"] = ([t - now for t, _ in points], [v for _, v in points])
        if not any(xs for xs, _ in (*lines.values(), *markers.values())):
            title = _no_ttft(engines)  # short: plotext drops a title wider than the chart
    return PlotData(title=title, ylabel=ylabel, horizon_s=horizon_s, lines=lines, markers=markers,
                    throttle_spans=spans)
