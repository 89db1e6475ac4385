"""Probe results for one engine: the last few requests and a rolling median, every figure labelled.

Token counts come from the server; a result whose counts were estimated from stream chunks says so,
and the chunk count is shown beside the server's token count as a cross-check. The engine's own TTFT
stands beside the client's; the warnings (a probe served from the prompt cache, a TTFT gap and its likely
cause) are the results' own words.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tui.live.probe_summary import MEDIAN_OF, probe_medians
from tui.model.probe_medians import ProbeMedians
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR, ProbeResult
from widgets.energy import joules
from widgets.fmt import NA, ms, num
from widgets.panel import Panel

SHOWN = 4  # most recent results listed


class ProbePanel(Panel):
    DEFAULT_CSS = """
    ProbePanel { border: round $accent; padding: 0 1; height: auto; }
    """
    BORDER_TITLE = "probes"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._drawn: tuple[tuple[ProbeResult, ...], float | None] = ((), None)

    def show(self, results: Sequence[ProbeResult], busy: bool, every_s: float | None,
             ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR, medians: ProbeMedians | None = None) -> None:
        """`medians`: of the results (tui.live.probe_summary), as the screen gathered them."""
        subtitle = ("probing… " if busy else "") + (f"every {every_s:g}s" if every_s else "f: probe now")
        if subtitle != self.border_subtitle:  # setting it, even to the same words, repaints the border
            self.border_subtitle = subtitle
        # Results never change once made: the same newest results (the same objects) draw the same panel, and
        # have the same medians (made from them).
        newest = tuple(results[-max(SHOWN, MEDIAN_OF):])
        drawn, factor = self._drawn
        same = len(drawn) == len(newest) and all(a is b for a, b in zip(drawn, newest, strict=True))
        if not same or factor != ttft_gap_factor:
            self._drawn = (newest, ttft_gap_factor)
            self.redraw(render_probes(results, ttft_gap_factor, medians))


def render_probes(results: Sequence[ProbeResult], ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR,
                  medians: ProbeMedians | None = None) -> Group | Text:
    """`medians`: the results' (tui.live.probe_summary); made from them where a caller has none."""
    if not results:
        return Text("no probe yet (press f)", style="dim")
    if medians is None:
        medians = probe_medians(results)
    head = Text()
    if medians.count:
        head.append(f"median of last {medians.count}: ", style="dim")
        head.append(f"decode {num(medians.decode_tps)} tok/s", style="bold")
        if medians.server_decode_tps is not None:
            head.append(f" (server {medians.server_decode_tps:.1f})")
        head.append(f"  TTFT {ms(medians.ttft_s)}", style="bold")
        if medians.server_ttft_s is not None:
            head.append(f" (engine {ms(medians.server_ttft_s)})")
        if medians.estimated:
            head.append("  estimated from chunks", style="yellow")
    shown = list(results)[-SHOWN:]
    # Speculative engines: each request's accepted / drafted tokens (llama.cpp's timings)
    drafting = any(r.server is not None and r.server.draft_n is not None for r in shown)
    # the energy each probe's span cost, where the store could read it (tui.live.store)
    energy = any(r.energy_j is not None or r.energy_note is not None for r in shown)
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="dim")
    for col in ("#", "TTFT", "engine", "decode", "prefill", "tokens/chunks", "cached",
                *(("accepted/drafted",) if drafting else ()), *(("energy",) if energy else ())):
        table.add_column(col, no_wrap=True, justify="right" if col != "#" else "left")
    for r in shown:
        label = f"{r.workload}{'' if r.turn is None else f' t{r.turn}'}"
        if not r.ok:
            # short here (a long reason would squeeze every column); the latest one's reason is below whole
            short = f"failed: HTTP {r.status}" if r.status else f"failed: {r.failure or 'error'}"
            table.add_row(label, Text(short, style="red"), "", "", "", "", "", *([""] if drafting else []),
                          *([""] if energy else []))
            continue
        prefill = num(r.prefill_tps, "{:.0f}")
        if r.prefill_source == "client-lower-bound":
            prefill = f"≥{prefill}"
        tokens = f"{r.completion_tokens if r.completion_tokens is not None else NA}/{r.chunks}"
        if r.estimated:
            tokens += " est."
        cached = NA if r.cached_tokens is None or not r.prompt_tokens else \
            f"{r.cached_tokens}/{r.prompt_tokens}"
        gap = r.ttft_gap(ttft_gap_factor)
        ttft = Text(ms(r.ttft_s), style="yellow" if gap is not None else "")
        cached_cell = Text(cached, style="yellow" if r.cache_served else "")
        draft = []
        if drafting:
            t = r.server
            draft = [NA if t is None or t.draft_n is None else f"{t.draft_n_accepted or 0}/{t.draft_n}"]
        table.add_row(label, ttft, ms(r.server_ttft_s), num(r.decode_tps), prefill, tokens, cached_cell,
                      *draft, *([_energy_cell(r)] if energy else []))
    return Group(head, table, *_warnings(shown[-1], ttft_gap_factor))


def _energy_cell(r: ProbeResult) -> Text:
    if r.energy_j is not None:
        per = r.joules_per_token
        return Text(joules(r.energy_j) + (f" {joules(per)}/tok" if per is not None else ""))
    if r.energy_note is not None and r.energy_note.startswith("too short"):
        return Text("too short to read", style="dim")
    return Text(NA, style="dim")


def _warnings(latest: ProbeResult, ttft_gap_factor: float) -> list[Text]:
    """What the latest probe warns about, in its own words; why it failed, whole (the row is cut short)."""
    if not latest.ok:
        why = Text(f"! {latest.error or 'failed'}", style="red")
        if latest.status in (401, 403):
            why.append(" (the engine wants an API key)")
        return [why]
    words = [latest.cache_note] if latest.cache_note is not None else []
    if (gap := latest.ttft_gap(ttft_gap_factor)) is not None:
        words.append(gap.text())
    return [Text(f"! {w}", style="yellow") for w in words]
