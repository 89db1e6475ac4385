"""One engine's column, drawn to be read in a second: state by colour, what has a capacity as a bar against
it, every rate with a sparkline of its last minutes, each finding one coloured line. Figures an engine does
not have are left out rather than shown as rows of n/a; every figure shown before stays one key away
(`enter`: the engine's detail, widgets.engine_panel.render_engine)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from rich.text import Text

from tui.live.engine_state import EngineState
from tui.live.glance import busy_slots, finish_shares, model_name
from tui.live.placement import container_words, limit_words
from tui.live.provenance import generation_note
from tui.live.shares import engine_shares
from tui.live.store import TRAFFIC_TTFT
from tui.model.findings import Finding
from tui.model.samples import EngineReading, RequestStats
from tui.model.slots import SlotsReading
from widgets.energy import joules
from widgets.engine_rows import bench_rows, lifecycle_rows, router_rows, slot_line, traffic_rows
from widgets.fmt import IDLE, Rows, bar, cut, cut_styled, mib, ms, num, shares, spark
from widgets.styles import ALARM, HEALTH_STYLE, SEVERITY_STYLE

if TYPE_CHECKING:
    from tui.compare.roofline import Roofline
    from tui.model.status import EngineStatus

MAX_SLOT_ROWS = 8
LABEL_W = 13  # the longest label: "prefill tok/s"


def render_glance(state: EngineState, status: EngineStatus | None = None, roof: Roofline | None = None,
                  width: int = 72) -> Text:
    sample, stats = state.sample, state.stats
    grid = Rows()
    if status is not None:
        lifecycle_rows(grid, status)
    if sample is None:
        grid.add_line(Text("waiting for the first poll", style="dim"))
        return grid.text()
    room = max(20, width - LABEL_W - 1)
    head = Text(f"● {sample.health}", style=HEALTH_STYLE.get(sample.health, ""))
    model = model_name(sample.model)
    if model and sample.models is None:
        head.append(f"  {model}")
    if sample.health_reason:
        head.append(f"  {sample.health_reason}", style="")
    cut_styled(head, width)
    grid.add_line(head)
    if sample.stale:
        grid.add_line(Text("stale: the last good values (the source did not answer)", style="bold yellow"))
    for alert in sample.alerts:
        grid.add_line(Text(cut(f"ALERT {alert}", width), style=ALARM))
    config = sample.config
    if config is not None:
        for text in (config.facts(), config.summary()):
            for line in textwrap.wrap(text, width, break_on_hyphens=False, max_lines=2, placeholder=" …"):
                grid.add_line(Text(line, style="dim"))
    _placement_lines(grid, state, width)
    if sample.metrics_error:
        grid.add_line(Text(cut(sample.metrics_error, width), style="bold red"))
    reading = sample.reading
    if (note := generation_note(sample)) is not None:
        grid.add_line(Text(cut(note, width), style="dim"))
    _finding_lines(grid, state.findings, width)
    if sample.models is not None:
        router_rows(grid, state, sample.models)
    if reading is not None:
        _load_rows(grid, state, room)
        _rate_rows(grid, state, reading, room)
    if stats.requests is not None:  # the proxy's, too, where the engine has neither /metrics nor /slots
        _request_lines(grid, stats.requests, room)
    if sample.slots is not None:
        _slot_lines(grid, sample.slots, room)
    if state.traffic is not None:
        traffic_rows(grid, state.traffic)
    if state.bench is not None:
        bench_rows(grid, state.bench)
    if state.rss_bytes is not None:
        grid.add_row("host RSS", mib(state.rss_bytes))
    if roof is not None:
        reached = f", {roof.pct_of_ceiling:.0f}% reached" if roof.pct_of_ceiling is not None else ""
        grid.add_row("roofline", f"ceiling {roof.ceiling_tps:.0f} tok/s{reached}")
    if stats.energy_w is not None:  # one line here; whose energy, and why none, in the detail (enter)
        per_token = f"{joules(stats.joules_per_token)}/tok" if stats.joules_per_token is not None else IDLE
        grid.add_row("energy", cut(f"{per_token} at {stats.energy_w:.1f} W ({stats.energy_scope or '?'})",
                                    room))
    if stats.counter_reset:
        grid.add_line(Text("counters reset: engine restarted", style="yellow"))
    return grid.text()


def _placement_lines(grid: Rows, state: EngineState, width: int) -> None:
    """Its container and what the container's cgroup imposes, or what holds its port instead of it."""
    if state.container is not None:
        grid.add_line(Text(cut(container_words(state.container, state.cgroup), width), style="dim"))
    if state.cgroup is not None:
        text, pressed = limit_words(state.cgroup, state.cgroup_use)
        grid.add_line(Text(cut(text, width), style="bold yellow" if pressed else "dim"))
    if state.port_note is not None:
        grid.add_line(Text(cut(f"port held by {state.port_note}", width), style="yellow"))


def _finding_lines(grid: Rows, findings: tuple[Finding, ...], width: int) -> None:
    for f in findings:
        line = Text(f" {f.severity.upper()} ", style=SEVERITY_STYLE.get(f.severity, "bold"))
        line.append(cut(f" {f.id}: {f.title}", width - len(line.plain)))
        grid.add_line(line)


def _load_rows(grid: Rows, state: EngineState, room: int) -> None:
    sample = state.sample
    assert sample is not None and sample.reading is not None
    reading, config, shares = sample.reading, sample.config, engine_shares(sample)

    def with_bar(fraction: float | None, text: Text) -> Text:
        """A bar as wide as the room beside `text` leaves (up to 20), the text cut to the room."""
        width = min(20, room - len(text.plain) - 1)
        if fraction is None or width < 4:
            cut_styled(text, room)
            return text
        return bar(fraction, width, "green") + Text(" ") + text

    if reading.running is not None:
        slots = config.slots if config is not None else None
        text = Text(f"{reading.running:.0f}/{slots}" if slots else f"{reading.running:.0f}")
        if reading.waiting is not None:
            text.append(f"  waiting {reading.waiting:.0f}", style="bold yellow" if reading.waiting else "")
        grid.add_row("running", with_bar(shares.running, text))
    if reading.kv_cache_usage is not None:
        pool = config.kv_pool_tokens if config is not None else None
        text = Text(f"{reading.kv_cache_usage:.0%}") + Text(f" of {pool:,} tokens" if pool else "",
                                                           style="dim")
        grid.add_row("KV", with_bar(shares.kv, text))
    elif sample.slots is not None and sample.slots.kv_estimate is not None:
        text = Text(f"{sample.slots.kv_estimate:.0%} of the slots' context (estimate)", style="dim")
        grid.add_row("KV", with_bar(shares.kv, text))


def _rate_rows(grid: Rows, state: EngineState, reading: EngineReading, room: int) -> None:
    """Each rate the engine has, with its sparkline over the plots' window."""
    stats = state.stats

    def row(label: str, key: str, value: str) -> None:
        """The figure, then its sparkline as wide as the room beside it leaves (up to 24; none under 4)."""
        series = state.series.get(key) or state.glance.get(key)
        value = value.ljust(7)
        width = min(24, room - len(value) - 1)
        points = series.cells(width) if series is not None else []
        text = Text(value[:room])
        grid.add_row(label, text + Text(" ") + Text(spark(points, width).lstrip(), style="cyan")
                     if width >= 4 else text)

    if reading.generation_tokens_total is not None:
        row("gen tok/s", "gen_tps", num(stats.gen_tps, missing=IDLE))
    if reading.prompt_tokens_processed_total is not None:
        row("prompt tok/s", "prompt_processed_tps", num(stats.prompt_processed_tps, missing=IDLE))
    if reading.prompt_tokens_computed_total is not None:
        row("prefill tok/s", "prompt_computed_tps", num(stats.prompt_computed_tps, missing=IDLE))
    if reading.ttft_buckets is not None:
        row("TTFT p50/p90", "ttft_p50_s", f"{ms(stats.ttft_p50_s, IDLE)} / {ms(stats.ttft_p90_s, IDLE)}")
    elif state.traffic is not None and state.traffic.stats.ttft_p50_s is not None:
        row("TTFT p50", TRAFFIC_TTFT, f"{ms(state.traffic.stats.ttft_p50_s)} (the proxy's)")
    if reading.itl_buckets is not None:
        row("ITL p50/p90", "itl_p50_s", f"{ms(stats.itl_p50_s, IDLE)} / {ms(stats.itl_p90_s, IDLE)}")
    if stats.prefix_cache_hit_rate is not None:
        grid.add_row("cached", f"{stats.prefix_cache_hit_rate:.0%} of prompt tokens"[:room])
    if stats.spec_accept_rate is not None or stats.spec_accept_rate_total is not None:
        rate = stats.spec_accept_rate if stats.spec_accept_rate is not None else stats.spec_accept_rate_total
        length = stats.spec_accept_length if stats.spec_accept_length is not None \
            else stats.spec_accept_length_total
        grid.add_row("spec", f"{num(rate and rate * 100, '{:.0f}')}% accepted, {num(length, '{:.2f}')} "
                     "tokens a step"[:room])


def _request_lines(grid: Rows, rs: RequestStats, room: int) -> None:
    parts = []
    if rs.e2e_s is not None:
        parts.append(f"e2e p50 {ms(rs.e2e_s[0])} p99 {ms(rs.e2e_s[2])}")
    if rs.queue_s is not None:
        parts.append(f"queue p90 {ms(rs.queue_s[1])}")
    if rs.requests_per_s is not None:
        parts.append(f"{rs.requests_per_s:.2f} req/s")
    if ended := finish_shares(rs.finish_window):
        parts.append(shares(ended))
    if rs.preemptions_per_s:
        parts.append(f"{rs.preemptions_per_s:.2f} preempt/s")
    if parts:  # the proxy's figures say so: they are the client's view, not the engine's own series
        grid.add_row("requests" if rs.origin is None else "proxy reqs", cut(" · ".join(parts), room))


def _slot_lines(grid: Rows, slots: SlotsReading, room: int) -> None:
    if slots.error:
        grid.add_row("slots", Text(cut(slots.error, room), style="yellow"))
        return
    if len(slots.slots) > MAX_SLOT_ROWS:
        grid.add_row("slots", f"{busy_slots(slots)} of {len(slots.slots)} processing")
        return
    for slot in slots.slots:
        grid.add_row(f"slot {slot.id}", slot_line(slot, room))


def render_row(state: EngineState, width: int = 120) -> Text:
    """The engine in one line, for a dashboard of more engines than fit as columns (as the fleet table):
    name, state, model, load, generation with its sparkline, TTFT, KV, the most severe finding."""
    sample, stats = state.sample, state.stats
    line = Text(f"{state.name[:18]:<18} ", style="bold")
    if sample is None:
        return line + Text("waiting for the first poll", style="dim")
    line.append(f"● {sample.health:<8}", style=HEALTH_STYLE.get(sample.health, ""))
    model = model_name(sample.model) or ""
    line.append(f" {model[:22]:<22}", style="dim")
    reading = sample.reading
    if reading is not None:
        slots = sample.config.slots if sample.config is not None else None
        running = num(reading.running, "{:.0f}", "–")
        line.append(f" run {running}{f'/{slots}' if slots else ''}")
        if reading.waiting:
            line.append(f" wait {reading.waiting:.0f}", style="bold yellow")
        series = state.series.get("gen_tps")
        line.append(" ")
        line.append(spark(series.cells(8) if series else [], 8), style="cyan")
        line.append(f" {num(stats.gen_tps, missing=IDLE)} tok/s")
        if stats.ttft_p50_s is not None:
            line.append(f"  TTFT {ms(stats.ttft_p50_s)}")
        if reading.kv_cache_usage is not None:
            line.append("  KV ")
            line += bar(reading.kv_cache_usage, 6, "green")
    elif sample.metrics_error or sample.health_reason:
        line.append(f" {sample.metrics_error or sample.health_reason}", style="dim")
    if state.findings:
        f = state.findings[0]
        line.append("  ")
        line.append(f" {f.severity.upper()} ", style=SEVERITY_STYLE.get(f.severity, "bold"))
        line.append(f" {f.id}")
    cut_styled(line, width)
    return line
