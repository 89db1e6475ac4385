"""An offline HTML page: its styles, the skeleton, tables, sections and the formatting of figures in them.

Shared by every report enginetop writes (the A/B and sweep report, the recording report): one look, no
script, no CDN, nothing fetched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

CSS = """
body{margin:0;background:#f8fafc;color:#111827;font:15px/1.55 system-ui,-apple-system,'Segoe UI',sans-serif}
main{max-width:1000px;margin:0 auto;padding:32px 24px 64px}
.kicker{text-transform:uppercase;letter-spacing:.12em;font-size:12px;color:#6b7280;margin:0}
h1{font-size:30px;line-height:1.2;margin:6px 0 10px}
h2{font-size:21px;margin:40px 0 2px;border-top:1px solid #e5e7eb;padding-top:24px}
.sub{color:#6b7280;margin:0 0 14px}
.meta{color:#374151;font-size:13px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:12px;margin:22px 0}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:14px 16px}
.card .k{font-size:12px;color:#6b7280}.card .v{font-size:28px;font-weight:700}
.card .v small{font-size:14px;font-weight:500;color:#6b7280}.card .d{font-size:12px;color:#374151}
dl.grid{display:grid;grid-template-columns:180px 1fr;gap:6px 16px;background:#fff;border:1px solid #e5e7eb;
 border-radius:10px;padding:14px 18px}
dl.grid dt{color:#6b7280}dl.grid dd{margin:0}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13.5px;margin:10px 0}
th,td{border-bottom:1px solid #e5e7eb;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f1f5f9;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ok{color:#166534;font-weight:600}.bad{color:#b91c1c;font-weight:600}.warn{color:#b45309;font-weight:600}
.muted{color:#6b7280}
pre{background:#0f172a;color:#e2e8f0;padding:12px 14px;border-radius:8px;overflow-x:auto;font-size:12.5px}
.note{background:#fffbeb;border-left:4px solid #f59e0b;padding:10px 14px;margin:14px 0}
.chart{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:8px;margin:10px 0;
 box-sizing:border-box}
details{margin:10px 0}summary{cursor:pointer;color:#1d4ed8}
tr.diff td{background:#fef3c7}
.finding{border-left:4px solid #f59e0b;background:#fff;padding:8px 12px;margin:10px 0}
.finding.error{border-color:#b91c1c}.finding.info{border-color:#0ea5e9}
"""


def num(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return '<span class="muted">n/a</span>'
    if isinstance(v, float | int):
        return f"{v:,.{digits}f}{unit}"
    return escape(str(v))


def ms(seconds: Any) -> str:
    return num(seconds * 1000 if seconds is not None else None, 0, " ms")


def gib(n: Any) -> str:
    return num(n / 1024**3 if n is not None else None, 1, " GiB")


def table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    out = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        out.append(
            "<tr>"
            + "".join(
                f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row)
            )
            + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def section(title: str, subtitle: str, body: str) -> str:
    return f'<section><h2>{escape(title)}</h2><p class="sub">{escape(subtitle)}</p>{body}</section>'


def document(title: str, body: str, source: str) -> str:
    """A whole page: `body` inside the skeleton, and a footer naming what it was written from."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>{body}"
        f'<footer class="muted"><p>Written by enginetop from {escape(source)}.</p></footer>'
        "</main></body></html>\n"
    )
