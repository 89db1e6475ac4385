"""Formatting shared by the panels: one spelling of "not available" everywhere."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

NA = "n/a"  # the engine or GPU does not expose this value
IDLE = "–"  # exposed, but nothing happened in the window to compute it from


def num(value: float | None, fmt: str = "{:.1f}", missing: str = NA) -> str:
    return missing if value is None else fmt.format(value)


def pct(fraction: float | None, missing: str = NA) -> str:
    return missing if fraction is None else f"{fraction * 100:.1f}%"


def ms(seconds: float | None, missing: str = NA) -> str:
    if seconds is None:
        return missing
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def gib(n_bytes: float | None, missing: str = NA) -> str:
    return missing if n_bytes is None else f"{n_bytes / 2**30:.1f} GiB"


def mib(n_bytes: float | None, missing: str = NA) -> str:
    return missing if n_bytes is None else f"{n_bytes / 2**20:.0f} MiB"


def bar(fraction: float | None, width: int = 10) -> str:
    if fraction is None:
        return " " * width
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "░" * (width - filled)


_TICKS = "▁▂▃▄▅▆▇█"


def spark(values: Sequence[float | None], width: int) -> str:
    """The last `width` values as a sparkline (the lowest bar is 0, the highest the largest value): a rate's
    last minutes at a glance, as htop and nvtop draw them. Fewer values than the width are right-aligned; a
    value that is not available is a blank."""
    values = values[-width:]
    if not values:
        return " " * width
    top = max((v for v in values if v is not None), default=0.0)
    ticks = "".join(" " if v is None else _TICKS[min(7, int(v / top * 7.999))] if top > 0 else _TICKS[0]
                    for v in values)
    return ticks.rjust(width)


class Rows:
    """Label/value lines. Panels redraw every second, and one Text renders far cheaper than a Table."""

    def __init__(self) -> None:
        self._rows: list[tuple[str | None, str | Text]] = []

    def add_row(self, label: str, value: str | Text) -> None:
        self._rows.append((label, value))

    def add_line(self, value: str | Text) -> None:
        """A line of the whole width, with no label column."""
        self._rows.append((None, value))

    def text(self) -> Text:
        width = max((len(label) for label, _ in self._rows if label is not None), default=0) + 1
        out = Text(no_wrap=True, overflow="ellipsis")
        for i, (label, value) in enumerate(self._rows):
            if i:
                out.append("\n")
            if label is not None:
                out.append(label.ljust(width), style="dim")
            out.append(value if isinstance(value, Text) else Text(value))
        return out
