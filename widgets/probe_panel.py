"""Probe results for one engine: the last few requests and a rolling median, every figure labelled.

Token counts come from the server; a result whose counts were estimated from stream chunks says so,
and the chunk count is shown beside the server's token count as a cross-check.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tui.probe.results import ProbeResult
from tui.probe.stats import median
from widgets.fmt import NA, ms, num
from widgets.panel import Panel

SHOWN = 4  # most recent results listed
MEDIAN_OF = 5


class ProbePanel(Panel):
    DEFAULT_CSS = """
    ProbePanel { border: round $accent; padding: 0 1; height: auto; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "probes"

    def show(self, results: Sequence[ProbeResult], busy: bool, every_s: float | None) -> None:
        self.border_subtitle = ("probing… " if busy else "") + (
            f"every {every_s:g}s" if every_s else "f: probe now")
        self.redraw(render_probes(results))


def render_probes(results: Sequence[ProbeResult]) -> Group | Text:
    if not results:
        return Text("no probe yet (press f)", style="dim")
    recent = list(results)[-MEDIAN_OF:]
    ok = [r for r in recent if r.ok]
    head = Text()
    if ok:
        head.append(f"median of last {len(ok)}: ", style="dim")
        head.append(f"decode {num(median(r.decode_tps for r in ok))} tok/s", style="bold")
        server = median(r.server_decode_tps for r in ok)
        if server is not None:
            head.append(f" (server {server:.1f})")
        head.append(f"  TTFT {ms(median(r.ttft_s for r in ok))}", style="bold")
        if any(r.estimated for r in ok):
            head.append("  estimated from chunks", style="yellow")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for col in ("#", "TTFT", "decode", "prefill", "tokens/chunks", "cached"):
        table.add_column(col, no_wrap=True, justify="right" if col != "#" else "left")
    for r in list(results)[-SHOWN:]:
        label = f"{r.workload}{'' if r.turn is None else f' t{r.turn}'}"
        if not r.ok:
            table.add_row(label, Text(r.error or "failed", style="red"), "", "", "", "")
            continue
        prefill = num(r.prefill_tps, "{:.0f}")
        if r.prefill_source == "client-lower-bound":
            prefill = f"≥{prefill}"
        tokens = f"{r.completion_tokens if r.completion_tokens is not None else NA}/{r.chunks}"
        if r.estimated:
            tokens += " est."
        cached = NA if r.cached_tokens is None or not r.prompt_tokens else \
            f"{r.cached_tokens}/{r.prompt_tokens}"
        table.add_row(label, ms(r.ttft_s), num(r.decode_tps), prefill, tokens, cached)
    return Group(head, table)
