"""One engine's column: health, model, load, throughput, cache, speculation, latency."""

from __future__ import annotations

import textwrap
import time
from typing import TYPE_CHECKING

from rich.text import Text

from tui.live.store import EngineState
from tui.model.bench import BenchSample
from tui.model.config import EngineConfig
from tui.model.findings import Finding
from tui.model.samples import RequestStats, RoutedModel
from tui.model.slots import SlotsReading, SlotState
from tui.model.traffic import TrafficSample
from widgets.fmt import IDLE, NA, Rows, mib, ms, num, pct
from widgets.panel import Panel

if TYPE_CHECKING:  # a type only: widgets never reach into the lifecycle code
    from tui.compare.roofline import Roofline
    from tui.model.status import EngineStatus

HEALTH_STYLE = {"up": "bold green", "loading": "bold yellow", "starting": "bold yellow", "down": "bold red"}


def _shown(exposed: bool, value: str) -> str:
    """A value the engine exposes but has no traffic for reads "–"; one it never exposes reads "n/a"."""
    if value != NA:
        return value
    return IDLE if exposed else NA


class EnginePanel(Panel, can_focus=True):
    DEFAULT_CSS = """
    EnginePanel { border: round $primary; padding: 0 1; height: auto; min-height: 16; }
    EnginePanel:focus { border: double $accent; }
    """

    def __init__(self, name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.engine_name = name
        self._shown: tuple[EngineState, EngineStatus | None, Roofline | None] | None = None
        self.border_title = name

    def show(self, state: EngineState, status: EngineStatus | None = None,
             roof: Roofline | None = None) -> None:
        self._shown = (state, status, roof)
        # Before its first layout a panel has no width yet: the findings are then wrapped for a usual column,
        # and again to its own width once it has one (on_resize)
        width = self.size.width - 4 if self.size.width else 96
        self.redraw(render_engine(state, status, roof, width=max(40, width)))

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(*self._shown)


def _lifecycle_rows(grid: Rows, status: EngineStatus) -> None:
    """What enginetop knows as the engine's launcher: profile, PID, cold start, or the crash."""
    line = Text(status.profile or "", style="bold")
    if status.state == "crashed":
        line.append(f"  CRASHED: {status.message}", style="bold white on red")
    elif status.state == "failed":
        line.append(f"  {status.message}", style="bold red")
    elif status.state == "switching":
        line.append(f"  {status.message}", style="yellow")
    else:
        line.append(f"  {status.message}")
        if status.cold_start_s is not None:
            line.append(f", cold start {status.cold_start_s:.1f} s", style="dim")
    grid.add_row("profile", line)
    if status.state == "crashed":
        for tail in status.log_tail[-6:]:
            grid.add_row("", Text(tail[-100:], style="red"))


def _traffic_rows(grid: Rows, traffic: TrafficSample) -> None:
    """The user's own requests through the proxy: labelled "traffic" so they are never read as probes."""
    s = traffic.stats
    if traffic.error:
        grid.add_row("traffic", Text(traffic.error, style="bold red"))
        return
    head = Text(f"{num(s.requests_per_s, '{:.2f}', IDLE)} req/s, {s.in_flight} in flight", style="bold")
    if s.errors or s.abandoned:
        head.append(f", {s.errors} errors, {s.abandoned} abandoned", style="bold red")
    head.append(f"  (last {s.window_s:.0f} s via {traffic.proxy_url})", style="dim")
    grid.add_row("traffic", head)
    grid.add_row("traffic TTFT", f"{ms(s.ttft_p50_s, IDLE)} / {ms(s.ttft_p90_s, IDLE)}  p50/p90")
    grid.add_row("traffic ITL", f"{ms(s.itl_p50_s, IDLE)} / {ms(s.itl_p90_s, IDLE)}  p50/p90")
    grid.add_row("traffic decode", f"{num(s.decode_tps_p50, missing=IDLE)} tok/s per request (p50)")
    grid.add_row("traffic prompt", f"{num(s.prompt_tokens_mean, '{:.0f}', IDLE)} tokens/request, "
                 f"{pct(s.cached_share, IDLE)} cached")
    if s.capacity_rps:  # `enginetop capacity` measured this engine: how much of it the traffic uses
        used = (s.requests_per_s or 0.0) / s.capacity_rps
        line = Text(f"{num(s.requests_per_s, '{:.2f}', '0')} of {s.capacity_rps:.3g} req/s capacity "
                    f"({used * 100:.0f}% used)", style="bold red" if used >= 0.9 else "")
        grid.add_row("headroom", line)
    if s.slo is not None:
        met = Text(f"{s.slo}: ", style="")
        if s.slo_met is None:
            met.append(f"no streamed request in the last {(s.slo_window_s or 0) / 60:.0f} min", style="dim")
        else:
            met.append(f"{s.slo_met * 100:.1f}% met", style="bold" if s.slo_met >= 0.95 else "bold red")
            met.append(f" of {s.slo_requests} requests (last {(s.slo_window_s or 0) / 60:.0f} min)",
                       style="dim")
        grid.add_row("traffic SLO", met)


_UP = ("loaded", "ready")  # llama-server router, llama-swap
_COMING = ("loading", "downloading", "starting", "stopping")


def _router_rows(grid: Rows, state: EngineState, models: tuple[RoutedModel, ...]) -> None:
    """A llama-server in router mode or llama-swap: a row per model, its status in their words; the figures
    of the loaded ones (read without ever loading one)."""
    summary = state.sample.model if state.sample and state.sample.model else "router: "
    kind, _, words = summary.partition(": ")
    grid.add_row(kind, Text(words, style="bold"))
    now = state.sample.wall if state.sample else None
    for model in models:
        line = _model_line(state, model)
        since = state.model_status_since.get(model.id, (model.status, now))[1]
        if model.progress is not None:
            line.append(f" {model.progress:.0%}")
        if now is not None and since is not None and model.status in _COMING:
            line.append(f" for {now - since:.0f} s")
        used = state.model_used.get(model.id)
        if model.status in _UP and now is not None:
            line.append(f"  last used {now - used:.0f} s ago" if used is not None else
                        "  not used while watched", style="dim")
        grid.add_row(model.id, line)
        if model.slots is not None and model.slots.error is None:
            for slot in model.slots.slots:
                grid.add_row(f"  slot {slot.id}", _slot_line(slot))


def _model_line(state: EngineState, model: RoutedModel) -> Text:
    if model.failed:
        code = f" (exit code {model.exit_code})" if model.exit_code is not None else ""
        return Text(f"failed to load{code}", style="bold red")
    style = "bold green" if model.status in _UP else "yellow" if model.status in _COMING else "dim"
    line = Text(model.status, style=style)
    if model.in_flight:
        oldest = f", oldest {model.oldest_ms / 1000:.1f} s" if model.oldest_ms is not None else ""
        line.append(f"  {model.in_flight} in flight{oldest}")
    if model.reading is not None:
        r = model.reading
        line.append(f"  {num(r.running, '{:.0f}')} running, {num(r.waiting, '{:.0f}')} waiting, "
                    f"{num(state.model_gen_tps.get(model.id), missing=IDLE)} gen tok/s")
    if model.slots is not None and model.slots.error is None:
        busy = sum(s.processing for s in model.slots.slots)
        line.append(f", slots {busy}/{len(model.slots.slots)} busy, KV ≈ {pct(model.slots.kv_estimate)}")
    if model.error:
        line.append(f"  {model.error}", style="red")
    return line


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
    busy = sum(s.processing for s in slots.slots)
    grid.add_row("slots", f"{busy} of {len(slots.slots)} processing")
    grid.add_row("KV (estimate)", Text(f"{pct(slots.kv_estimate)} of the slots' context held "
                                       "(prompt + decoded tokens / n_ctx)", style="dim"))
    for slot in slots.slots:
        grid.add_row(f"slot {slot.id}", _slot_line(slot))


def _slot_line(slot: SlotState) -> Text:
    if not slot.processing:
        line = Text("idle", style="dim")
        if slot.task is not None and slot.prompt_tokens is not None:
            # llama-server zeroes an ended task's counters; what it keeps is the tokens in the slot's cache
            line.append(f"  last task: {slot.prompt_tokens} tokens in its cache", style="dim")
        return line
    line = Text("processing", style="bold green")
    if slot.prompt_tokens is not None:  # while decoding, n_prompt_tokens counts the decoded ones too
        line.append(f"  prompt {slot.prompt_tokens - (slot.decoded or 0)}")
        if slot.prompt_cached:
            line.append(f" ({slot.prompt_cached} cached)")
    if not slot.decoded and slot.prompt_tokens:
        line.append(f"  prefill {slot.prompt_processed or 0}/{slot.prompt_tokens}", style="yellow")
    else:
        line.append(f"  decoding {slot.decoded or 0}")
        if slot.remaining is not None and slot.remaining >= 0:
            line.append(f", {slot.remaining} left")
    if slot.speculative:
        line.append("  speculative", style="dim")
    return line


def _bench_rows(grid: Rows, bench: BenchSample) -> None:
    """A bench or capacity run on this engine, as it goes (another process's, read from its live file)."""
    p = bench.progress
    what = p.workload.rsplit("/", 1)[-1]
    if p.command == "capacity":
        head = Text(f"capacity, level {p.level or 0}"
                    + (f" at {p.level_rate:.3g} req/s" if p.level_rate else ""), style="bold")
        if p.capacity_rps:
            head.append(f", highest passed {p.capacity_rps:.3g} req/s")
    else:
        head = Text("bench", style="bold")
    head.append(f"  {p.state}: {p.sent}/{p.planned} sent, {p.in_flight} in flight")
    if p.errors:
        head.append(f", {p.errors} errors", style="bold red")
    head.append(f"  ({what}, PID {p.pid})", style="dim")
    grid.add_row(p.command, head)
    if p.error:
        grid.add_row("", Text(p.error, style="bold red"))
    if p.note:
        grid.add_row("", Text(p.note, style="yellow"))
    grid.add_row(f"{p.command} TTFT", f"{ms(p.ttft_p50_s, IDLE)} / {ms(p.ttft_p90_s, IDLE)}  p50/p90 "
                 f"(last {p.window_s:.0f} s)")
    grid.add_row(f"{p.command} ITL", f"{ms(p.itl_p50_s, IDLE)} / {ms(p.itl_p90_s, IDLE)}  p50/p90")
    if p.slo is not None:
        grid.add_row(f"{p.command} SLO", Text(f"{p.slo}: {pct(p.attainment, IDLE)} met so far",
                                              style="bold" if (p.attainment or 0) >= 0.95 else "bold red"))


SEVERITY_STYLE = {"error": "bold white on red", "warning": "bold yellow", "info": "bold cyan"}
LABEL_WIDTH = 16  # the widest label of a column, about


def _wrapped(grid: Rows, label: str, text: str, width: int, style: str = "",
             first_style: str | None = None) -> None:
    """A long value over as many rows as the column needs (a finding, the configuration)."""
    lines = textwrap.wrap(text, max(20, width - LABEL_WIDTH), break_on_hyphens=False) or [""]
    for i, line in enumerate(lines):
        shown = first_style if i == 0 and first_style else style
        grid.add_row(label if i == 0 else "", Text(line, style=shown))


def _config_rows(grid: Rows, config: EngineConfig | None, width: int) -> None:
    """What the engine is really set to, in one line, and what it does not publish."""
    if config is None:
        return
    if facts := config.facts():
        _wrapped(grid, "facts", facts, width)
    _wrapped(grid, "config", config.summary(), width)
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
    total = sum(n for _, n in counts)
    return " ".join(f"{reason} {n / total:.0%}" for reason, n in counts) if total else NA


def _request_rows(grid: Rows, rs: RequestStats, width: int) -> None:
    """Each request's life as the engine timed it, over the latency window (vLLM, SGLang)."""
    ended = NA if rs.ended is None else f"{rs.ended:.0f} ended, {rs.requests_per_s or 0:.2f} req/s"
    finish = f"  {_shares(rs.finish_window)}" if rs.finish_window else ""
    since = " · ".join(f"{r} {n:.0f}" for r, n in rs.finish_total)
    _wrapped(grid, "requests", ended + finish + (f" (since start: {since})" if since else ""), width)
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
        grid.add_row("spec accept", _shown(exposed, "n/a" if total is None else
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
        _lifecycle_rows(grid, status)

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
        grid.add_row("ALERT", Text(alert, style="bold white on red"))
    grid.add_row("url", sample.url)
    if sample.job is not None:  # read through Prometheus: the labels that tell it apart
        where = f"job {sample.job}, instance {sample.instance}, node {sample.host or NA}"
        grid.add_row("scraped", where + "".join(f", {k} {v}" for k, v in sample.labels))
    # llama-server names the model by its file path: the file name is what tells models apart
    if sample.models is None:  # a router's or llama-swap's own row below says what it serves
        grid.add_row("model", sample.model.rsplit("/", 1)[-1] if sample.model else NA)
    _config_rows(grid, sample.config, width)
    if sample.metrics_error:
        grid.add_row("metrics", Text(sample.metrics_error, style="bold red"))
    _finding_rows(grid, state.findings, width)
    if reading is None:
        if state.traffic is not None:  # the engine's own metrics failing does not stop its traffic
            _traffic_rows(grid, state.traffic)
        if sample.models is not None:
            _router_rows(grid, state, sample.models)
        if sample.slots is not None:
            _slot_rows(grid, sample.slots)
        _prefill_row(grid, state)
        if state.bench is not None:
            _bench_rows(grid, state.bench)
        return grid.text()

    def has(attr: str) -> bool:
        return getattr(reading, attr) is not None

    grid.add_row("dialect", reading.dialect)
    if reading.origin is not None:  # not the engine's /metrics: say where the figures came from
        _wrapped(grid, "source", f"from {reading.origin}: llama-server runs without --metrics, which adds "
                 "waiting requests, decode time and totals since its start", width, style="dim")
    grid.add_row("running", num(reading.running, "{:.0f}"))
    grid.add_row("waiting", num(reading.waiting, "{:.0f}"))
    grid.add_row("gen tok/s", _shown(has("generation_tokens_total"), num(stats.gen_tps)))
    # The same two quantities on every engine (help screen): all prompt tokens, and those really prefilled.
    processed = has("prompt_tokens_processed_total")
    grid.add_row("prompt tok/s", _shown(processed, num(stats.prompt_processed_tps)))
    computed = has("prompt_tokens_computed_total") or (processed and has("prompt_tokens_cached_total"))
    grid.add_row("prefill tok/s", _shown(computed, num(stats.prompt_computed_tps)))
    if has("generation_seconds_total"):
        grid.add_row("decode busy", _shown(True, num(stats.decode_tps_busy, "{:.1f} tok/s")))
    cache_exposed = has("prefix_cache_queries_total") or has("cache_hit_rate_gauge")
    grid.add_row("prefix hit", _shown(cache_exposed, pct(stats.prefix_cache_hit_rate)))
    _spec_rows(grid, state, has("spec_draft_tokens_total") or has("spec_accept_rate_gauge"))
    grid.add_row("KV cache", pct(reading.kv_cache_usage))
    ttft_exposed = has("ttft_buckets")
    itl_exposed = has("itl_buckets")
    grid.add_row("TTFT p50/p90", f"{_shown(ttft_exposed, ms(stats.ttft_p50_s))} / "
                 f"{_shown(ttft_exposed, ms(stats.ttft_p90_s))}")
    grid.add_row("ITL p50/p90", f"{_shown(itl_exposed, ms(stats.itl_p50_s))} / "
                 f"{_shown(itl_exposed, ms(stats.itl_p90_s))}")
    if stats.requests is not None:
        _request_rows(grid, stats.requests, width)
    grid.add_row("host RSS", mib(state.rss_bytes) if state.rss_bytes is not None else NA)
    if sample.slots is not None:
        _slot_rows(grid, sample.slots)
    _prefill_row(grid, state)
    if state.traffic is not None:
        _traffic_rows(grid, state.traffic)
    if state.bench is not None:
        _bench_rows(grid, state.bench)
    if roof is not None:
        line = f"ceiling {roof.ceiling_tps:.0f} tok/s ({roof.bytes_per_token / 1e9:.2f} GB/token at " \
               f"{roof.bandwidth_bps / 1e9:.0f} GB/s {roof.bandwidth_source})"
        if roof.pct_of_ceiling is not None:
            line += f", {roof.pct_of_ceiling:.0f}% reached"
        grid.add_row("roofline", line)
    if stats.counter_reset:
        grid.add_row("", Text("counters reset: engine restarted", style="yellow"))
    return grid.text()
