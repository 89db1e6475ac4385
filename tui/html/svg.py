"""Inline SVG charts for the offline report: plain elements and attributes, no script, no external font.

Each function returns one `<svg>` string with a viewBox, so it scales with the page and renders in
any browser (or an SVG viewer) without network access.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', sans-serif\""


def tick_label(v: float) -> str:
    """An axis or value label: 3 significant figures, fewer decimals for larger numbers."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def nice_max(v: float) -> float:
    """A round axis maximum at or above v (1, 2, 2.5, 5 x 10^k)."""
    if v <= 0:
        return 1.0
    exp = math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        top = step * 10**exp
        if top >= v:
            return float(top)
    return float(10 ** (exp + 1))


def frame(title: str, width: int, height: int) -> list[str]:
    """The opening of every chart: an <svg> that scales with the page, and its title. Close with </svg>."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
        f'role="img" aria-label="{escape(title)}" class="chart" {FONT}>',
        f'<text x="0" y="18" font-size="14" font-weight="600" fill="#111827">{escape(title)}</text>',
    ]


@dataclass
class Bar:
    label: str
    value: float | None
    low: float | None = None  # whisker (e.g. min over blocks)
    high: float | None = None
    points: Sequence[float] = field(default_factory=tuple)  # every block, drawn as dots
    note: str = ""  # right of the bar, e.g. "CV 0.6% · reproducible"
    color: str | None = None


def bar_chart(bars: Sequence[Bar], *, title: str, unit: str, width: int = 760) -> str:
    """Horizontal bars (median), whiskers (min-max) and dots (each block)."""
    label_w, note_w, row_h, top, bottom = 210, 230, 34, 34, 30
    plot_w = width - label_w - note_w - 20
    height = top + row_h * max(1, len(bars)) + bottom
    values = [v for b in bars for v in (b.value, b.high, *b.points) if v is not None]
    vmax = nice_max(max(values) if values else 1.0)
    x = lambda v: label_w + plot_w * (v / vmax)  # noqa: E731 - a local scale, clearer inline
    out = frame(title, width, height)
    for i in range(5):
        tick = vmax * i / 4
        tx = x(tick)
        out.append(
            f'<line x1="{tx:.1f}" y1="{top - 6}" x2="{tx:.1f}" y2="{height - bottom}" stroke="#e5e7eb"/>'
        )
        out.append(
            f'<text x="{tx:.1f}" y="{height - bottom + 16}" font-size="11" fill="#6b7280" '
            f'text-anchor="middle">{tick_label(tick)}</text>'
        )
    out.append(
        f'<text x="{label_w + plot_w:.1f}" y="{height - 2}" font-size="11" fill="#6b7280" '
        f'text-anchor="end">{escape(unit)}</text>'
    )
    for i, b in enumerate(bars):
        color = b.color or PALETTE[i % len(PALETTE)]
        cy = top + row_h * i + row_h / 2
        out.append(
            f'<text x="{label_w - 8}" y="{cy + 4:.1f}" font-size="12" fill="#111827" '
            f'text-anchor="end">{escape(b.label)}</text>'
        )
        if b.value is None:
            out.append(f'<text x="{label_w + 4}" y="{cy + 4:.1f}" font-size="12" fill="#9ca3af">n/a</text>')
        else:
            out.append(
                f'<rect x="{label_w}" y="{cy - 9:.1f}" width="{max(1.0, x(b.value) - label_w):.1f}" '
                f'height="18" rx="3" fill="{color}" fill-opacity="0.75"><title>{escape(b.label)}: '
                f"{tick_label(b.value)} {escape(unit)}</title></rect>"
            )
            out.append(
                f'<text x="{x(b.value) + 4:.1f}" y="{cy - 11:.1f}" font-size="11" font-weight="600" '
                f'fill="#111827">{tick_label(b.value)}</text>'
            )
        if b.low is not None and b.high is not None:
            out.append(
                f'<line x1="{x(b.low):.1f}" y1="{cy:.1f}" x2="{x(b.high):.1f}" y2="{cy:.1f}" '
                f'stroke="#111827" stroke-width="1.5"/>'
            )
            for end in (b.low, b.high):
                out.append(
                    f'<line x1="{x(end):.1f}" y1="{cy - 6:.1f}" x2="{x(end):.1f}" y2="{cy + 6:.1f}" '
                    f'stroke="#111827" stroke-width="1.5"/>'
                )
        for p in b.points:
            out.append(
                f'<circle cx="{x(p):.1f}" cy="{cy:.1f}" r="2.6" fill="#ffffff" stroke="#111827" '
                f'stroke-width="1"/>'
            )
        if b.note:
            out.append(
                f'<text x="{width - note_w + 10}" y="{cy + 4:.1f}" font-size="11" fill="#374151">'
                f"{escape(b.note)}</text>"
            )
    out.append("</svg>")
    return "\n".join(out)


@dataclass
class Series:
    name: str
    points: Sequence[tuple[float, float | None]]  # (x, y); y None = not measured, a gap
    color: str | None = None


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    categorical_x: bool = True,
    width: int = 760,
    height: int = 300,
) -> str:
    """Lines with markers. categorical_x: x values evenly spaced in order (sweep values, 1/2/4/8 streams)."""
    left, right, top, bottom = 64, 150, 34, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = sorted({x for s in series for x, _ in s.points})
    ys = [y for s in series for _, y in s.points if y is not None]
    ymax = nice_max(max(ys) if ys else 1.0)
    if categorical_x:
        pos = {xv: (i + 0.5) / max(1, len(xs)) for i, xv in enumerate(xs)}
    else:
        lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        pos = {xv: (xv - lo) / (hi - lo) if hi > lo else 0.5 for xv in xs}
    px = lambda xv: left + plot_w * pos[xv]  # noqa: E731
    py = lambda yv: top + plot_h * (1 - yv / ymax)  # noqa: E731
    out = frame(title, width, height)
    for i in range(5):
        tick = ymax * i / 4
        ty = py(tick)
        out.append(f'<line x1="{left}" y1="{ty:.1f}" x2="{left + plot_w}" y2="{ty:.1f}" stroke="#e5e7eb"/>')
        out.append(
            f'<text x="{left - 6}" y="{ty + 4:.1f}" font-size="11" fill="#6b7280" '
            f'text-anchor="end">{tick_label(tick)}</text>'
        )
    for xv in xs:
        out.append(
            f'<text x="{px(xv):.1f}" y="{top + plot_h + 16}" font-size="11" fill="#6b7280" '
            f'text-anchor="middle">{tick_label(xv)}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" font-size="11" fill="#374151" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text x="12" y="{top + plot_h / 2:.1f}" font-size="11" fill="#374151" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + plot_h / 2:.1f})">{escape(y_label)}</text>'
    )
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        segment: list[str] = []
        segments: list[list[str]] = []
        for xv, yv in sorted(s.points):
            if yv is None:
                if segment:
                    segments.append(segment)
                segment = []
                continue
            segment.append(f"{px(xv):.1f},{py(yv):.1f}")
        if segment:
            segments.append(segment)
        for seg in segments:
            if len(seg) > 1:
                out.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="2"/>'
                )
        for xv, yv in s.points:
            if yv is not None:
                out.append(
                    f'<circle cx="{px(xv):.1f}" cy="{py(yv):.1f}" r="3.5" fill="{color}">'
                    f"<title>{escape(s.name)}: {tick_label(xv)} → {tick_label(yv)}</title></circle>"
                )
        ly = top + 14 + 18 * i
        out.append(f'<rect x="{left + plot_w + 14}" y="{ly - 8}" width="12" height="12" fill="{color}"/>')
        out.append(
            f'<text x="{left + plot_w + 32}" y="{ly + 2}" font-size="11" fill="#111827">'
            f"{escape(s.name[:20])}</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def cdf_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    marks: Sequence[tuple[float, str]] = (),
    width: int = 760,
    height: int = 300,
) -> str:
    """Cumulative distributions as steps: each series' points are its sorted values (x) and the share at or
    below them (y, 0..1). `marks` are vertical lines with a label (an SLO limit)."""
    left, right, top, bottom = 64, 150, 34, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points] + [m for m, _ in marks]
    xmax = nice_max(max(xs) if xs else 1.0)
    px = lambda xv: left + plot_w * min(1.0, xv / xmax)  # noqa: E731
    py = lambda yv: top + plot_h * (1 - yv)  # noqa: E731
    out = frame(title, width, height)
    for i in range(5):
        ty, tx = py(i / 4), px(xmax * i / 4)
        out.append(f'<line x1="{left}" y1="{ty:.1f}" x2="{left + plot_w}" y2="{ty:.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" font-size="11" fill="#6b7280" '
                   f'text-anchor="end">{i * 25}%</text>')
        out.append(f'<text x="{tx:.1f}" y="{top + plot_h + 16}" font-size="11" fill="#6b7280" '
                   f'text-anchor="middle">{tick_label(xmax * i / 4)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" font-size="11" fill="#374151" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        steps, prev_y = [f"{px(0):.1f},{py(0):.1f}"], 0.0
        for xv, yv in s.points:
            if yv is None:
                continue
            steps += [f"{px(xv):.1f},{py(prev_y):.1f}", f"{px(xv):.1f},{py(yv):.1f}"]
            prev_y = yv
        out.append(f'<polyline points="{" ".join(steps)}" fill="none" stroke="{color}" stroke-width="2">'
                   f"<title>{escape(s.name)}</title></polyline>")
        ly = top + 14 + 18 * i
        out.append(f'<rect x="{left + plot_w + 14}" y="{ly - 8}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{left + plot_w + 32}" y="{ly + 2}" font-size="11" fill="#111827">'
                   f"{escape(s.name[:20])}</text>")
    for value, label in marks:
        mx = px(value)
        out.append(f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + plot_h}" stroke="#111827" '
                   f'stroke-dasharray="5 4" stroke-width="1.5"/>')
        out.append(f'<text x="{mx + 4:.1f}" y="{top + 12}" font-size="11" fill="#111827">'
                   f"{escape(label)}</text>")
    out.append("</svg>")
    return "\n".join(out)
