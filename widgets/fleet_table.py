"""The fleet table: one row per engine, its node's GPUs beside it. Rows are built here from the store's
samples (pure functions, no Textual), drawn by FleetTable (a DataTable) which keeps the cursor on the same
engine across refreshes, sorts by any column and filters by a typed text."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from tui.fleet.match import GpuMatcher
from tui.live.engine_state import EngineState
from tui.live.fleet_energy import joules_per_token
from tui.live.fleet_gpus import fleet_gpus
from tui.live.glance import model_name
from tui.model.fleet_gpus import FleetGpus
from tui.model.samples import EngineSample, GpuSample
from widgets.fmt import NA, ms, num, pct
from widgets.styles import STATUS_STYLE


@dataclass(frozen=True, slots=True)
class Column:
    label: str
    # its GPUs' figures (tui.live.fleet_gpus) -> what it sorts by: a figure or text
    value: Callable[[EngineSample, EngineState, FleetGpus], Any]
    text: Callable[[Any], str]


def _stat(attr: str):
    return lambda s, st, g: getattr(st.stats, attr)


def _reading(attr: str):
    return lambda s, st, g: getattr(s.reading, attr) if s.reading else None


def _gpus(attr: str):
    return lambda s, st, g: getattr(g, attr)


def _status(s: EngineSample, st, g) -> str:
    if s.stale:
        return "stale"
    if s.alerts:
        return "alert"
    return s.health


COLUMNS = (
    Column("status", _status, str),
    Column("engine", lambda s, st, g: s.name, str),
    Column("job", lambda s, st, g: s.job or "", str),
    Column("model", lambda s, st, g: model_name(s.model) or "", lambda v: v or NA),
    Column("host", lambda s, st, g: s.host or "", str),
    Column("gen tok/s", _stat("gen_tps"), lambda v: num(v)),
    Column("prompt tok/s", _stat("prompt_processed_tps"), lambda v: num(v)),
    Column("TTFT p50", _stat("ttft_p50_s"), lambda v: ms(v)),
    Column("TTFT p90", _stat("ttft_p90_s"), lambda v: ms(v)),
    Column("ITL p50", _stat("itl_p50_s"), lambda v: ms(v)),
    Column("run", _reading("running"), lambda v: num(v, "{:.0f}")),
    Column("wait", _reading("waiting"), lambda v: num(v, "{:.0f}")),
    Column("KV", _reading("kv_cache_usage"), lambda v: pct(v)),
    Column("prefix hit", _stat("prefix_cache_hit_rate"), lambda v: pct(v)),
    Column("GPU util", _gpus("util_pct"), lambda v: num(v, "{:.0f}%")),
    Column("GPU W", _gpus("power_w"), lambda v: num(v, "{:.0f}")),
    # joules per generated token from the GPUs' energy (dcgm's counter, field 156, or power x time) over
    # their window, over the tokens generated in that same window (tui.live.fleet_energy, set by build_rows);
    # a node's GPUs shared by several engines: the node's joules over all their tokens
    Column("J/tok", lambda s, st, g: None, lambda v: num(v, "{:.2f}")),
    Column("GPU °C", _gpus("temp_c"), lambda v: num(v, "{:.0f}")),
    # whose the three GPU figures are: the engine's own GPUs, or its node's, shared with the engines there
    Column("GPUs", lambda s, st, g: "", str),
    Column("throttle", lambda s, st, g: ", ".join(g.throttle), lambda v: v or ""),
    Column("alerts / why", lambda s, st, g: "; ".join(s.alerts) or (s.health_reason or "") or (
        s.metrics_error or ""), str),
)
GPUS, THROTTLE, WHY, JPT = (next(i for i, c in enumerate(COLUMNS) if c.label == label)
                            for label in ("GPUs", "throttle", "alerts / why", "J/tok"))


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    values: tuple[object, ...]
    cells: tuple[Text | str, ...]
    haystack: str  # what a typed filter matches, lower case


def build_rows(engines: dict[str, EngineState], gpus: Iterable[GpuSample]) -> list[Row]:
    matcher = GpuMatcher(gpus)  # by pod, or GPU labels, else by node (tui.fleet.match)
    rows = []
    shares = {name: matcher.share(state.sample) for name, state in engines.items()
              if state.sample is not None}
    per_token = joules_per_token(engines, {name: (share.gpus, share.own) for name, share in shares.items()})
    for name, state in engines.items():
        s = state.sample
        if s is None:
            continue
        share = shares[name]
        figures = fleet_gpus(share.gpus)
        values = tuple(c.value(s, state, figures) for c in COLUMNS)
        values = (*values[:JPT], per_token[name], *values[JPT + 1:])
        if figures.count:
            whose = f"{figures.count} {'own' if share.own else 'node'}"
            values = (*values[:GPUS], whose, *values[GPUS + 1:])
        cells: list[Text | str] = [c.text(v) for c, v in zip(COLUMNS, values, strict=True)]
        status = values[0]
        cells[0] = Text(str(status), style=STATUS_STYLE.get(str(status), ""))
        if figures.count and not share.own:  # the node's figures, not this engine's: said, and dimmed
            for i in range(GPUS - 4, GPUS + 1):
                cells[i] = Text(str(cells[i]), style="dim")
        if values[THROTTLE]:
            cells[THROTTLE] = Text(str(cells[THROTTLE]), style="bold red")
        if s.alerts or s.health != "up":
            cells[WHY] = Text(str(cells[WHY]), style="red")
        haystack = (" ".join(str(v) for v in values[:5] if v).lower() + f" {status} "
                    + str(values[WHY]).lower())
        rows.append(Row(name, values, tuple(cells), haystack))
    return rows


def order(rows: list[Row], column: int, reverse: bool, text: str) -> list[Row]:
    """Rows matching every word typed, sorted by `column` (n/a last whichever the direction)."""
    words = text.lower().split()
    kept = [r for r in rows if all(w in r.haystack for w in words)] if words else list(rows)
    present = [r for r in kept if r.values[column] not in (None, "")]
    missing = [r for r in kept if r.values[column] in (None, "")]
    numeric = all(isinstance(r.values[column], int | float) for r in present)
    key = (lambda r: r.values[column]) if numeric else (lambda r: str(r.values[column]).lower())
    present.sort(key=key, reverse=reverse)
    return present + sorted(missing, key=lambda r: r.name)


WIDTHS = (6, 24, 8, 14, 18, 9, 12, 8, 8, 8, 4, 4, 6, 10, 8, 6, 6, 6, 7, 22, 200)
TEXT_COLUMNS = frozenset((0, 1, 2, 3, 4, GPUS, THROTTLE, WHY))  # sorted A to Z first; figures highest first


def column_at(x: int) -> int | None:
    """The column whose cell (or the space after it) is at character `x` of a line."""
    start = 0
    for i, w in enumerate(WIDTHS):
        if start <= x <= start + w:
            return i
        start += w + 1
    return None


class FleetTable(Widget, can_focus=True):
    """Draws only the rows in view (a rich Table of ~screen-height rows), so filtering, sorting and
    scrolling cost the same with 500 engines as with 50; the cursor stays on the engine it was on."""

    DEFAULT_CSS = "FleetTable { height: 1fr; }"

    class Sorted(Message):
        """A click on a header changed the order."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: list[Row] = []
        self.cursor = 0
        self.top = 0
        self.sort_column = 5  # generation tok/s, busiest first
        self.sort_reverse = True

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def selected(self) -> str | None:
        return self.rows[self.cursor].name if 0 <= self.cursor < len(self.rows) else None

    def _visible(self) -> int:
        return max(1, self.size.height - 1)  # one line of header

    def show(self, rows: list[Row]) -> None:
        keep = self.selected
        if [r.cells for r in rows] == [r.cells for r in self.rows] and \
                [r.name for r in rows] == [r.name for r in self.rows]:
            return
        self.rows = rows
        names = [r.name for r in rows]
        self.cursor = names.index(keep) if keep in names else min(self.cursor, max(0, len(rows) - 1))
        self._scroll()
        self.refresh()

    def move(self, delta: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
            self._scroll()
            self.refresh()

    def _scroll(self) -> None:
        visible = self._visible()
        if self.cursor < self.top:
            self.top = self.cursor
        elif self.cursor >= self.top + visible:
            self.top = self.cursor - visible + 1
        self.top = max(0, min(self.top, max(0, len(self.rows) - visible)))

    def sort_by(self, column: int) -> None:
        """Sort by `column`; by the same column again: the other way round."""
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = column, column not in TEXT_COLUMNS
        self.post_message(self.Sorted())

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:  # the header
            column = column_at(event.x)
            if column is not None:
                self.sort_by(column)
            return
        row = self.top + event.y - 1
        if 0 <= row < len(self.rows) and event.y >= 1:
            self.cursor = row
            self.refresh()

    def on_resize(self) -> None:
        self._scroll()

    def render_line(self, y: int) -> Strip:
        """Line `y` of the table (Textual's line API), straight from the rows' cells: only the lines in view
        are made, as segments of fixed-width cells. Drawn as one rich Text instead, Textual turned it into
        its own Content, measured and divided it every redraw: ~1/3 of the fleet view's CPU at 200 engines
        and a 5 s refresh (bench/bench_fleet.py)."""
        width = self.size.width or 200
        base = self.visual_style.rich_style
        if not self.rows:
            if y == 0:
                text = set_cell_size("no engine matches the filter", width).rstrip()
                return Strip([Segment(text, base + _style("dim"))], len(text)).extend_cell_length(width, base)
            return Strip.blank(width, base)
        if y == 0:
            header = [c.label for c in COLUMNS]
            sort = self.sort_column  # its arrow always shows: the label gives way if the cell is too narrow
            header[sort] = header[sort][:WIDTHS[sort] - 1] + ("↓" if self.sort_reverse else "↑")
            return _strip([(h, _BOLD) for h in header], WIDTHS, width, base)
        i = self.top + y - 1
        if y > self._visible() or i >= len(self.rows):
            return Strip.blank(width, base)
        cells = [(c, _NULL) if isinstance(c, str) else (c.plain, _style(c.style)) for c in self.rows[i].cells]
        return _strip(cells, WIDTHS, width, base, reverse=i == self.cursor)


_NULL = Style.null()
_BOLD = Style(bold=True)
_REVERSE = Style(reverse=True)


@lru_cache(maxsize=64)
def _style(style: str | Style) -> Style:
    return style if isinstance(style, Style) else Style.parse(style) if style else _NULL


def _cell(text: str, w: int) -> str:
    """`text` in exactly `w` cells: padded with spaces, or cut with an ellipsis (rich's Text.truncate with
    overflow="ellipsis" and pad=True, which the table used before). Control characters (a newline in an
    error message) would break the line: each shows as a space."""
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else " " for ch in text)
    n = len(text) if text.isascii() else cell_len(text)
    if n > w:
        return set_cell_size(text, w - 1) + "…"
    return text + " " * (w - n) if n < w else text


def _strip(cells: list[tuple[str, Style]], widths: Iterable[int], width: int, base: Style,
           reverse: bool = False) -> Strip:
    """Cells (text, style) at their widths, each followed by a space, cut at `width`; the whole line on the
    widget's own style, reversed for the cursor's row (the spaces between cells too)."""
    segments = []
    run: list[str] = []  # neighbours of one style make one segment, as Textual's own rendering does
    used = 0
    gap = base + _REVERSE if reverse else base
    run_style = gap
    for (text, style), w in zip(cells, widths, strict=True):
        w = min(w, max(0, width - used - 1))
        if w <= 0:
            break
        cell_style = gap + style if style is not _NULL else gap
        if cell_style != run_style:
            if run:
                segments.append(Segment("".join(run), run_style))
            run, run_style = [], cell_style
        run.append(_cell(text, w))
        if run_style != gap:
            segments.append(Segment("".join(run), run_style))
            run, run_style = [], gap
        run.append(" ")
        used += w + 1
    if run:
        segments.append(Segment("".join(run), run_style))
    return Strip(segments, used).extend_cell_length(width, base)
