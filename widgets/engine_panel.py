"""One engine's column: health, model, load, throughput, cache, speculation, latency."""

from __future__ import annotations

import textwrap
import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from tui.live.engine_state import EngineState
from tui.live.glance import busy_slots, finish_shares, model_name
from tui.live.placement import container_words, limit_words
from tui.live.provenance import COUNTER_ONLY, counter_only, missed_note
from tui.model.config import EngineConfig
from tui.model.findings import Finding
from tui.model.samples import RequestStats
from tui.model.slots import SlotsReading
from widgets.energy import energy_rows
from widgets.engine_glance import render_glance, render_row
from widgets.engine_rows import bench_rows, lifecycle_rows, router_rows, slot_line, traffic_rows
from widgets.fmt import IDLE, NA, Rows, mib, ms, num, pct, shares
from widgets.panel import Panel
from widgets.styles import ALARM, HEALTH_STYLE, SEVERITY_STYLE

if TYPE_CHECKING:  # a type only: widgets never reach into the lifecycle code
    from tui.compare.roofline import Roofline
    from tui.model.status import EngineStatus


def _idle_or_na(exposed: bool, value: str) -> str:
    """`value`, or where it is not available: "–" for a figure the engine exposes but had no traffic for,
    "n/a" for one it never exposes."""
    if value != NA:
        return value
    return IDLE if exposed else NA


class EnginePanel(Panel, can_focus=True):
    """The engine's column at a glance (widgets.engine_glance); `enter` asks for its detail, every figure
    (render_engine below), which the app shows on a screen of its own."""

    DEFAULT_CSS = """
    EnginePanel { border: round $primary; padding: 0 1; height: auto; min-height: 8; }
    EnginePanel:focus { border: double $accent; }
    EnginePanel.row { border: none; padding: 0; min-height: 1; height: 1; }
    EnginePanel.row:focus { background: $accent 30%; }
    """
    BINDINGS = [Binding("enter", "detail", "Detail")]

    class DetailAsked(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    def __init__(self, name: str, row: bool = False, **kwargs) -> None:
        """`row`: the engine in one line, for a dashboard of more engines than fit as columns."""
        super().__init__(**kwargs)
        if row:
            self.add_class("row")
        self.engine_name = name
        self._drawn_from: tuple[EngineState, EngineStatus | None, Roofline | None] | None = None
        self.border_title = name

    def action_detail(self) -> None:
        self.post_message(self.DetailAsked(self.engine_name))

    def show(self, state: EngineState, status: EngineStatus | None = None,
             roof: Roofline | None = None) -> None:
        self._drawn_from = (state, status, roof)
        if self.has_class("row"):
            self.redraw(render_row(state, self.size.width or 120))
            return
        # Before its first layout a panel has no width yet: the findings are then cut for a usual column,
        # and again to its own width once it has one (on_resize)
        width = self.size.width - 4 if self.size.width else 96
        self.redraw(render_glance(state, status, roof, width=max(36, width)))

    def on_resize(self) -> None:
        if self._drawn_from is not None:
            self.show(*self._drawn_from)


def _prefill_row(grid: Rows, state: EngineState) -> None:
    """A probe's long prompt while the engine works through it (llama-server's return_progress)."""
    p = state.prefill
    if p is not None:
        cached = f", {p.cache} from cache" if p.cache else ""
        grid.add_row("probe prefill", Text(f"{p.processed}/{p.total} tokens ({p.fraction:.0%} of the work"
                                           f"{cached}), {p.time_ms / 1000:.1f} s", style="yellow"))


def _slot_rows(grid: Rows, slots: SlotsReading) -> None:
    """llama-server's slots, a row each, and the KV use they imply: an estimate (not in /metrics any more)."""
    if slots.error:
        grid.add_row("slots", Text(slots.error, style="yellow"))
        return
    grid.add_row("slots", f"{busy_slots(slots)} of {len(slots.slots)} processing")
    grid.add_row("KV (estimate)", Text(f"{pct(slots.kv_estimate)} of the slots' context held "
                                       "(tokens in the slots / n_ctx)", style="dim"))
    for slot in slots.slots:
        grid.add_row(f"slot {slot.id}", slot_line(slot))


LABEL_WIDTH = 16  # the widest label of a column, about


def _wrapped(grid: Rows, label: str, text: str, width: int, style: str = "",
             first_style: str | None = None) -> None:
    """A long value over as many rows as the column needs (a finding, the configuration). `first_style`: the
    first row's, its label too (a finding's severity: one coloured line, as the column draws it)."""
    lines = textwrap.wrap(text, max(20, width - LABEL_WIDTH), break_on_hyphens=False) or [""]
    for i, line in enumerate(lines):
        if i == 0 and first_style:
            grid.add_row(label, Text(line, style=first_style), label_style=first_style)
        else:
            grid.add_row(label if i == 0 else "", Text(line, style=style))


def _config_rows(grid: Rows, config: EngineConfig | None, width: int) -> None:
    """What the engine is really set to, in one line, and what it does not publish."""
    if config is None:
        return
    if facts := config.facts():
        _wrapped(grid, "facts", facts, width)
    _wrapped(grid, "config", config.summary(), width)
    if config.sampling:
        _wrapped(grid, "sampling", "  ".join(f"{k} {v}" for k, v in config.sampling) + " (the engine's "
                 "defaults)", width)
    if config.lacks:
        more = f" (+{len(config.lacks) - 1} more)" if len(config.lacks) > 1 else ""
        _wrapped(grid, "", f"not published: {config.lacks[0]}{more}", width, style="dim")


def _secs(value: float | None) -> str:
    if value is None:
        return NA
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _three(values: tuple[float | None, ...] | None, fmt=_secs) -> str:
    return NA if values is None else "/".join(fmt(v) for v in values)


def _shares(counts: tuple[tuple[str, float], ...]) -> str:
    return shares(ended) if (ended := finish_shares(counts)) else NA


def _request_rows(grid: Rows, rs: RequestStats, width: int) -> None:
    """Each request's life as the engine timed it, over the latency window (vLLM, SGLang), or as the answers
    relayed by enginetop's proxy said it (an engine without such series: llama.cpp)."""
    ended = NA if rs.ended is None else f"{rs.ended:.0f} ended, {rs.requests_per_s or 0:.2f} req/s"
    if rs.origin == "proxy":
        ended += f" (via enginetop's proxy, last {rs.window_s:.0f} s)"
    finish = f"  {_shares(rs.finish_window)}" if rs.finish_window else ""
    since = " · ".join(f"{r} {n:.0f}" for r, n in rs.finish_total)
    start = "since start" if rs.origin is None else "since this run's first request through the proxy"
    _wrapped(grid, "requests", ended + finish + (f" ({start}: {since})" if since else ""), width)
    phases = [(name, q) for name, q in (("queue", rs.queue_s), ("prefill", rs.prefill_s),
                                        ("decode", rs.decode_s), ("e2e", rs.e2e_s)) if q is not None]
    if phases:
        _wrapped(grid, "p50/p90/p99", " · ".join(f"{name} {_three(q)}" for name, q in phases), width)
    if rs.prompt_len is not None or rs.gen_len is not None:
        def tokens(v: float | None) -> str:
            return NA if v is None else f"{v:,.0f}"
        _wrapped(grid, "length", f"prompt avg/p50/p90 {_three(rs.prompt_len, tokens)} · generated "
                 f"{_three(rs.gen_len, tokens)}", width)
    serving = []
    if rs.busy_share is not None:
        serving.append(f"busy {rs.busy_share:.0%}")
    if rs.gen_tps_serving is not None:
        serving.append(f"{rs.gen_tps_serving:.1f} gen tok/s while serving")
    if rs.tokens_per_step is not None:
        serving.append(f"{rs.tokens_per_step:.1f} tokens/step")
    if rs.preemptions_per_s is not None:
        serving.append(f"{rs.preemptions_per_s:.2f} preemptions/s")
    if serving:
        _wrapped(grid, "serving", " · ".join(serving), width)


def _finding_rows(grid: Rows, findings: tuple[Finding, ...], width: int) -> None:
    """Each finding in full (wrapped to the column), since when it holds, and what to try."""
    for f in findings:
        since = f" (since {time.strftime('%H:%M:%S', time.localtime(f.since_wall))})" if f.since_wall else ""
        _wrapped(grid, f.severity.upper(), f.title + since, width, first_style=SEVERITY_STYLE[f.severity])
        _wrapped(grid, "  try", f.suggestion, width, style="dim")


def _spec_rows(grid: Rows, state: EngineState, exposed: bool) -> None:
    """Speculative decoding: acceptance, mean accepted length, per draft position and drafts/s over the
    window, or since the engine started when nothing drafted in the window; "off" where the engine says so."""
    stats = state.stats
    config = state.sample.config if state.sample else None
    off = config is not None and config.spec_type == "off"
    if off and not exposed:
        grid.add_row("spec", "off")
        return
    setting = ""
    if config is not None and config.spec_type not in (None, "off"):
        setting = f"  ({config.spec_type}" + (f", n={config.spec_n_max}" if config.spec_n_max else "") + ")"
    if stats.spec_accept_rate is not None:
        length = num(stats.spec_accept_length, "{:.2f}")
        grid.add_row("spec accept", f"{pct(stats.spec_accept_rate)}, length {length}, "
                     f"{num(stats.spec_drafts_per_s)} drafts/s{setting}")
        per_pos, since = stats.spec_accept_per_pos, ""
        if per_pos is None:  # counters the engine made only within the window: the totals say it
            per_pos, since = stats.spec_accept_per_pos_total, " since start"
    else:
        total = stats.spec_accept_rate_total
        length = num(stats.spec_accept_length_total, "{:.2f}")
        grid.add_row("spec accept", _idle_or_na(exposed, "n/a" if total is None else
                                           f"{pct(total)}, length {length} since start{setting}"))
        per_pos = stats.spec_accept_per_pos_total
        since = " since start"
    if per_pos:
        grid.add_row("spec per pos", " ".join(f"{r * 100:.0f}%" for r in per_pos) + since)


def render_engine(state: EngineState, status: EngineStatus | None = None,
                  roof: Roofline | None = None, width: int = 72) -> Text:
    sample, stats = state.sample, state.stats
    reading = sample.reading if sample else None
    grid = Rows()
    if status is not None:
        lifecycle_rows(grid, status)

    if sample is None:
        grid.add_row("health", Text("waiting for first poll", style="dim"))
        return grid.text()
    health = Text(sample.health, style=HEALTH_STYLE.get(sample.health, ""))
    if sample.health_reason:
        health.append(f"  {sample.health_reason}", style="")
    grid.add_row("health", health)
    if sample.stale:
        grid.add_row("", Text("stale: the last good values (the source did not answer)", style="bold yellow"))
    for alert in sample.alerts:
        grid.add_row("ALERT", Text(alert, style=ALARM))
    grid.add_row("url", sample.url)
    if sample.job is not None:  # read through Prometheus: the labels that tell it apart
        where = f"job {sample.job}, instance {sample.instance}, node {sample.host or NA}"
        grid.add_row("scraped", where + "".join(f", {k} {v}" for k, v in sample.labels))
    # llama-server names the model by its file path: the file name is what tells models apart
    if sample.models is None:  # a router's or llama-swap's own row below says what it serves
        grid.add_row("model", model_name(sample.model) or NA)
    _config_rows(grid, sample.config, width)
    if sample.metrics_error:
        grid.add_row("metrics", Text(sample.metrics_error, style="bold red"))
    _finding_rows(grid, state.findings, width)
    if reading is None:
        if state.traffic is not None:  # the engine's own metrics failing does not stop its traffic
            traffic_rows(grid, state.traffic)
        if sample.models is not None:
            router_rows(grid, state, sample.models)
        if sample.slots is not None:
            _slot_rows(grid, sample.slots)
        _prefill_row(grid, state)
        if state.bench is not None:
            bench_rows(grid, state.bench)
        return grid.text()

    def has(attr: str) -> bool:
        return getattr(reading, attr) is not None

    grid.add_row("dialect", reading.dialect)
    if reading.origin is not None:  # not the engine's /metrics: say where the figures came from
        _wrapped(grid, "source", f"from {reading.origin}: llama-server runs without --metrics, which adds "
                 "waiting requests, decode time and totals since its start", width, style="dim")
    if (missed := missed_note(reading)) is not None:
        _wrapped(grid, "missed", missed, width, style="dim")
    if counter_only(sample):
        _wrapped(grid, "gen source", COUNTER_ONLY, width, style="dim")
    grid.add_row("running", num(reading.running, "{:.0f}"))
    grid.add_row("waiting", num(reading.waiting, "{:.0f}"))
    grid.add_row("gen tok/s", _idle_or_na(has("generation_tokens_total"), num(stats.gen_tps)))
    # The same two quantities on every engine (help screen): all prompt tokens, and those really prefilled.
    processed = has("prompt_tokens_processed_total")
    grid.add_row("prompt tok/s", _idle_or_na(processed, num(stats.prompt_processed_tps)))
    computed = has("prompt_tokens_computed_total") or (processed and has("prompt_tokens_cached_total"))
    grid.add_row("prefill tok/s", _idle_or_na(computed, num(stats.prompt_computed_tps)))
    if has("generation_seconds_total"):
        grid.add_row("decode busy", _idle_or_na(True, num(stats.decode_tps_busy, "{:.1f} tok/s")))
    cache_exposed = has("prefix_cache_queries_total") or has("cache_hit_rate_gauge")
    grid.add_row("prefix hit", _idle_or_na(cache_exposed, pct(stats.prefix_cache_hit_rate)))
    _spec_rows(grid, state, has("spec_draft_tokens_total") or has("spec_accept_rate_gauge"))
    grid.add_row("KV cache", pct(reading.kv_cache_usage))
    ttft_exposed = has("ttft_buckets")
    itl_exposed = has("itl_buckets")
    grid.add_row("TTFT p50/p90", f"{_idle_or_na(ttft_exposed, ms(stats.ttft_p50_s))} / "
                 f"{_idle_or_na(ttft_exposed, ms(stats.ttft_p90_s))}")
    grid.add_row("ITL p50/p90", f"{_idle_or_na(itl_exposed, ms(stats.itl_p50_s))} / "
                 f"{_idle_or_na(itl_exposed, ms(stats.itl_p90_s))}")
    if stats.requests is not None:
        _request_rows(grid, stats.requests, width)
    grid.add_row("host RSS", mib(state.rss_bytes) if state.rss_bytes is not None else NA)
    if state.container is not None:
        _wrapped(grid, "container", container_words(state.container, state.cgroup), width)
    if state.cgroup is not None:
        _wrapped(grid, "limits", limit_words(state.cgroup, state.cgroup_use)[0], width)
    if state.port_note is not None:
        _wrapped(grid, "port held by", state.port_note, width, style="yellow")
    if sample.slots is not None:
        _slot_rows(grid, sample.slots)
    _prefill_row(grid, state)
    if state.traffic is not None:
        traffic_rows(grid, state.traffic)
    if state.bench is not None:
        bench_rows(grid, state.bench)
    if roof is not None:
        line = f"ceiling {roof.ceiling_tps:.0f} tok/s ({roof.bytes_per_token / 1e9:.2f} GB/token at " \
               f"{roof.bandwidth_bps / 1e9:.0f} GB/s {roof.bandwidth_source})"
        if roof.pct_of_ceiling is not None:
            line += f", {roof.pct_of_ceiling:.0f}% reached"
        grid.add_row("roofline", line)
    energy_rows(grid, stats)
    if stats.counter_reset:
        grid.add_row("", Text("counters reset: engine restarted", style="yellow"))
    return grid.text()
