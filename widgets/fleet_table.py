"""The fleet table: one row per engine, its node's GPUs beside it. Rows are built here from the store's
samples (pure functions, no Textual), drawn by FleetTable (a DataTable) which keeps the cursor on the same
engine across refreshes, sorts by any column and filters by a typed text."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from tui.sources.samples import EngineSample, GpuSample
from tui.store import EngineState
from widgets.fmt import NA, ms, num, pct

HEALTH_STYLE = {"up": "green", "loading": "yellow", "starting": "yellow", "down": "bold red"}


@dataclass(frozen=True, slots=True)
class Column:
    label: str
    value: Callable[[EngineSample, EngineState, list[GpuSample]], object]  # what it sorts by
    text: Callable[[object], str]


def _stat(attr: str):
    return lambda s, st, g: getattr(st.stats, attr)


def _reading(attr: str):
    return lambda s, st, g: getattr(s.reading, attr) if s.reading else None


def _gpu_mean(attr: str):
    def value(s, st, gpus):
        vals = [getattr(g, attr) for g in gpus if getattr(g, attr) is not None]
        return sum(vals) / len(vals) if vals else None
    return value


def _gpu_max(attr: str):
    def value(s, st, gpus):
        vals = [getattr(g, attr) for g in gpus if getattr(g, attr) is not None]
        return max(vals) if vals else None
    return value


def _throttle(s, st, gpus) -> str:
    words = sorted({w for g in gpus if g.throttled for w in g.throttle_reasons if w != "idle"})
    return ", ".join(words)


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
    Column("model", lambda s, st, g: (s.model or "").rsplit("/", 1)[-1], lambda v: v or NA),
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
    Column("GPU util", _gpu_mean("util_gpu_pct"), lambda v: num(v, "{:.0f}%")),
    Column("GPU W", lambda s, st, g: sum(x.power_w for x in g if x.power_w is not None) if g else None,
           lambda v: num(v, "{:.0f}")),
    Column("GPU °C", _gpu_max("temp_c"), lambda v: num(v, "{:.0f}")),
    Column("throttle", _throttle, lambda v: v or ""),
    Column("alerts / why", lambda s, st, g: "; ".join(s.alerts) or (s.health_reason or "") or (
        s.metrics_error or ""), str),
)
STATUS_STYLE = {**HEALTH_STYLE, "stale": "bold yellow", "alert": "bold white on red"}


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    values: tuple[object, ...]
    cells: tuple[Text | str, ...]
    haystack: str  # what a typed filter matches, lower case


def gpus_by_host(gpus: Iterable[GpuSample]) -> dict[str, list[GpuSample]]:
    out: dict[str, list[GpuSample]] = {}
    for g in gpus:
        out.setdefault(g.host or "", []).append(g)
    return out


def build_rows(engines: dict[str, EngineState], gpus: Iterable[GpuSample]) -> list[Row]:
    by_host = gpus_by_host(gpus)
    rows = []
    for name, state in engines.items():
        s = state.sample
        if s is None:
            continue
        node = by_host.get(s.host or "", [])
        values = tuple(c.value(s, state, node) for c in COLUMNS)
        cells: list[Text | str] = [c.text(v) for c, v in zip(COLUMNS, values, strict=True)]
        status = values[0]
        cells[0] = Text(str(status), style=STATUS_STYLE.get(str(status), ""))
        if values[17]:
            cells[17] = Text(str(cells[17]), style="bold red")
        if s.alerts or s.health != "up":
            cells[18] = Text(str(cells[18]), style="red")
        haystack = " ".join(str(v) for v in values[:5] if v).lower() + f" {status} " + str(values[18]).lower()
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


class FleetTable(DataTable):
    """Rows replaced wholesale when the order or set changes, cell by cell otherwise; the cursor stays on
    the engine it was on."""

    DEFAULT_CSS = "FleetTable { height: 1fr; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._shown: list[Row] = []
        self.sort_column = 5  # generation tok/s, busiest first
        self.sort_reverse = True

    def on_mount(self) -> None:
        for i, c in enumerate(COLUMNS):
            self.add_column(c.label, key=str(i))

    @property
    def selected(self) -> str | None:
        if not self._shown or self.cursor_row >= len(self._shown):
            return None
        return self._shown[self.cursor_row].name

    def show(self, rows: list[Row]) -> None:
        same_order = [r.name for r in rows] == [r.name for r in self._shown]
        if same_order:
            for old, new in zip(self._shown, rows, strict=True):
                if old.cells != new.cells:
                    for i, (a, b) in enumerate(zip(old.cells, new.cells, strict=True)):
                        if a != b:
                            self.update_cell(new.name, str(i), b)
            self._shown = rows
            return
        keep = self.selected
        self._shown = rows
        self.clear()
        for r in rows:
            self.add_row(*r.cells, key=r.name)
        if keep is not None:
            for i, r in enumerate(rows):
                if r.name == keep:
                    self.move_cursor(row=i, animate=False)
                    break
