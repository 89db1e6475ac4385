"""Live time-series plots: every engine on one shared time axis, throttled periods marked."""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

COLORS = ("cyan", "magenta", "green", "orange", "blue", "yellow", "white", "red")


@dataclass(frozen=True)
class PlotData:
    """What one chart shows; x values are seconds relative to now (negative = past)."""

    title: str
    ylabel: str
    horizon_s: float
    lines: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    markers: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)  # probe results
    throttle_spans: list[tuple[float, float]] = field(default_factory=list)


def per_column(xs: list[float], ys: list[float], horizon_s: float, columns: int) -> tuple[list[float],
                                                                                      list[float]]:
    """The fewest points that draw the same line: at most one per chart column (the mean of the points
    that fall in it), and of a run of equal values only its ends. plotext joins every pair of points with
    a line, so its cost grows with the points, while a column cannot show more than one value (300 points
    on 90 columns cost three times as much for the same picture) and a flat run is one line anyway."""
    if len(xs) > columns:
        xs, ys = _column_means(xs, ys, horizon_s / columns)
    keep = [i for i in range(len(ys)) if i in (0, len(ys) - 1) or not ys[i - 1] == ys[i] == ys[i + 1]]
    if len(keep) == len(ys):
        return xs, ys
    return [xs[i] for i in keep], [ys[i] for i in keep]


def _column_means(xs: list[float], ys: list[float], width: float) -> tuple[list[float], list[float]]:
    out_x: list[float] = []
    out_y: list[float] = []
    column, sum_x, sum_y, n = None, 0.0, 0.0, 0
    for x, y in zip(xs, ys, strict=True):
        c = int(x // width)
        if c != column and n:
            out_x.append(sum_x / n)
            out_y.append(sum_y / n)
            sum_x = sum_y = 0.0
            n = 0
        column = c
        sum_x, sum_y, n = sum_x + x, sum_y + y, n + 1
    if n:
        out_x.append(sum_x / n)
        out_y.append(sum_y / n)
    return out_x, out_y


REBUILD_S = 10.0  # the least time between two rebuilds of a chart with nothing new on it


class TimePlot(PlotextPlot):
    DEFAULT_CSS = """
    TimePlot { height: 1fr; min-height: 10; border: round $primary-darken-2; }
    """
    _drawn_at: float = -1e9
    _events: object = None

    def due(self, now: float, horizon_s: float, events: object) -> bool:
        """A plotext rebuild is the most expensive thing on this screen (about 10 ms): redraw when the lines
        have moved by a chart column (horizon/width seconds; sooner moves nothing) and REBUILD_S have
        passed, so a short horizon on a wide chart does not rebuild every tick. New events (a probe result,
        a throttle starting) are drawn at once."""
        if events != self._events:
            self._events = events
            return True
        return abs(now - self._drawn_at) >= max(  # abs: a replay can go back
            REBUILD_S, horizon_s / max(self.size.width - 10, 10))

    _empty_shown: str | None = None  # title of the empty chart on screen: on a relative axis it never changes
    _version = 0  # bumped by show(): new data to build
    _built: tuple[object, Text] | None = None
    shown: tuple[PlotData, float | None] | None = None

    def render(self) -> RenderResult:
        """PlotextPlot rebuilds the whole chart on every render, and Textual renders a widget again whenever
        any region around it repaints (a panel beside it updating): build only when the data, the size or
        the theme changed."""
        key = (self._version, self.size, self.app.theme)
        if self._built is None or self._built[0] != key:
            text = super().render()
            assert isinstance(text, Text)
            self._built = (key, text)
        return self._built[1]

    def show(self, data: PlotData, now: float | None = None) -> None:
        self.shown = (data, now)  # what is on screen, x relative to `now`
        if now is not None:
            self._drawn_at = now
        empty = not any(xs for xs, _ in data.lines.values()) and not any(
            xs for xs, _ in data.markers.values()) and not data.throttle_spans
        if empty and self._empty_shown == data.title:
            return
        self._empty_shown = data.title if empty else None
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(data.title)
        plt.ylabel(data.ylabel)
        plt.xlabel("seconds ago")
        plt.xlim(-data.horizon_s, 0)
        top = 0.0
        columns = max(self.size.width - 10, 10)
        for i, (name, (xs, ys)) in enumerate(data.lines.items()):
            xs, ys = per_column(xs, ys, data.horizon_s, columns)
            if xs:
                plt.plot(xs, ys, label=name, color=COLORS[i % len(COLORS)], marker="braille")
                top = max(top, max(ys))
        names = list(data.lines)
        for name, (xs, ys) in data.markers.items():
            if xs:
                i = names.index(name) if name in names else len(names)
                plt.scatter(xs, ys, label=f"{name} probe", color=COLORS[i % len(COLORS)], marker="x")
                top = max(top, max(ys))
        plt.ylim(0, top * 1.15 if top > 0 else 1)
        for x0, x1 in data.throttle_spans:
            # one vertical line per second shades the span; the label says what red means
            x = x0
            while x <= x1:
                plt.vline(x, "red")
                x += 1.0
        if data.throttle_spans:
            plt.scatter([data.throttle_spans[-1][0]], [top * 1.1 if top else 0.9],
                        label="GPU throttled", color="red", marker="▌")
        self._version += 1
        self.refresh()
