"""Formatting shared by the panels: one spelling of "not available" everywhere, one bar, one way to cut a
line to its width."""

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


def bar(fraction: float | None, width: int = 10, style: str | None = None) -> Text:
    """A bar of `fraction` (0 to 1, a share made below the widgets: tui.live.shares) of `width` cells. With
    `style` (a capacity in the engine's column): the filled share in it (yellow past 70 %, red past 90 %), the
    rest dim; without (the GPU and host panels), the characters alone. Blank where the fraction is not
    known."""
    if fraction is None:
        return Text(" " * width)
    filled = max(0, min(width, round(fraction * width)))
    if style is None:
        return Text("█" * filled + "░" * (width - filled))
    if fraction >= 0.9:
        style = "red"
    elif fraction >= 0.7:
        style = "yellow"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def shares(parts: tuple[tuple[str, float], ...]) -> str:
    """(name, fraction) pairs as "stop 80% length 20%" (tui.live.glance.finish_shares)."""
    return " ".join(f"{name} {fraction:.0%}" for name, fraction in parts)


def _cut_at(text: str, width: int) -> int:
    """Where to cut `text` to leave room for "…" in `width`: at the last space, so no word is cut in two
    (mid-word only when the line's first word is longer than half of it)."""
    space = text.rfind(" ", 0, width)
    return space if space >= width // 2 else max(0, width - 1)


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells: whole as it is, or cut at a word and ended with "…"."""
    line = Text(text)
    cut_styled(line, width)
    return line.plain


def cut_styled(text: Text, width: int) -> None:
    """As cut, in place, keeping the styles (and no separator left dangling before the "…")."""
    if text.cell_len <= width:
        return
    text.truncate(_cut_at(text.plain, width))
    text.rstrip()
    while text.plain and text.plain[-1] in "·,:;":
        text.right_crop(1)
        text.rstrip()
    text.append("…")


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
        self._rows: list[tuple[str | None, str | Text, str]] = []

    def add_row(self, label: str, value: str | Text, label_style: str = "dim") -> None:
        """`label_style`: a label that is itself a figure (a finding's severity) in the style of what it
        says, its padding too."""
        self._rows.append((label, value, label_style))

    def add_line(self, value: str | Text) -> None:
        """A line of the whole width, with no label column."""
        self._rows.append((None, value, ""))

    def text(self) -> Text:
        width = max((len(label) for label, _, _ in self._rows if label is not None), default=0) + 1
        out = Text(no_wrap=True, overflow="ellipsis")
        for i, (label, value, label_style) in enumerate(self._rows):
            if i:
                out.append("\n")
            if label is not None:
                out.append(label.ljust(width), style=label_style)
            out.append(value if isinstance(value, Text) else Text(value))
        return out
