"""Live time-series plots: every engine on one shared time axis, throttled periods marked."""

from __future__ import annotations

from dataclasses import dataclass, field

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


class TimePlot(PlotextPlot):
    DEFAULT_CSS = """
    TimePlot { height: 1fr; min-height: 10; border: round $primary-darken-2; }
    """
    _drawn_at: float = -1e9
    _events: object = None

    def due(self, now: float, horizon_s: float, events: object) -> bool:
        """A chart column spans horizon/width seconds: redrawing more often than that moves nothing, and a
        plotext redraw is the most expensive thing on this screen. New events (a probe result, a throttle
        starting) are drawn at once."""
        if events != self._events:
            self._events = events
            return True
        return now - self._drawn_at >= horizon_s / max(self.size.width - 10, 10)

    _empty_shown: str | None = None  # title of the empty chart on screen: on a relative axis it never changes

    def show(self, data: PlotData, now: float | None = None) -> None:
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
        for i, (name, (xs, ys)) in enumerate(data.lines.items()):
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
        self.refresh()
