"""Rows an engine's column and its detail both draw: the launcher's state, the traffic through the proxy, a
router's models, a bench run on the engine."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rich.text import Text

from tui.live.engine_state import EngineState
from tui.live.glance import SlotPhase, busy_slots, native_model_facts, slot_phase
from tui.model.bench import BenchSample
from tui.model.samples import RoutedModel
from tui.model.slots import SlotState
from tui.model.traffic import TrafficSample
from widgets.fmt import IDLE, Rows, bar, cut_styled, ms, num, pct
from widgets.styles import ALARM

if TYPE_CHECKING:
    from tui.model.status import EngineStatus

def lifecycle_rows(grid: Rows, status: EngineStatus) -> None:
    """What enginetop knows as the engine's launcher: profile, PID, cold start, or the crash."""
    line = Text(status.profile or "", style="bold")
    if status.state == "crashed":
        line.append(f"  CRASHED: {status.message}", style=ALARM)
    elif status.state == "failed":
        # what to do first: a profile's file and line are in the log and on stderr, not in the column
        line.append("  " + re.sub(r"\S+\.toml:\d+: error: (?:argv\[\d+\]: )?", "", status.message),
                    style="bold red")
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


def traffic_rows(grid: Rows, traffic: TrafficSample) -> None:
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


def router_rows(grid: Rows, state: EngineState, models: tuple[RoutedModel, ...]) -> None:
    """A llama-server in router mode or llama-swap: a row per model, its status in their words; the figures
    of the loaded ones (read without ever loading one)."""
    summary = state.sample.model if state.sample and state.sample.model else "router: "
    kind, _, words = summary.partition(": ")
    grid.add_row(kind, Text(words, style="bold"))
    now = state.sample.wall if state.sample else None
    # Ollama and LM Studio: no counter moves when one of their models serves (Ollama's keep-alive says when)
    counted = state.sample is not None and state.sample.router not in ("ollama", "lm-studio")
    for model in models:
        line = model_line(state, model)
        since = state.model_status_since.get(model.id, (model.status, now))[1]
        if model.progress is not None:
            line.append(f" {model.progress:.0%}")
        if now is not None and since is not None and model.status in _COMING:
            line.append(f" for {now - since:.0f} s")
        used = state.model_used.get(model.id)
        if model.status in _UP and now is not None and counted:
            line.append(f"  last used {now - used:.0f} s ago" if used is not None else
                        "  not used while watched", style="dim")
        grid.add_row(model.id, line)
        if model.slots is not None and model.slots.error is None:
            for slot in model.slots.slots:
                grid.add_row(f"  slot {slot.id}", slot_line(slot))


def model_line(state: EngineState, model: RoutedModel) -> Text:
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
        line.append(f", slots {busy_slots(model.slots)}/{len(model.slots.slots)} busy, "
                    f"KV ≈ {pct(model.slots.kv_estimate)}")
    if model.error:
        line.append(f"  {model.error}", style="red")
    facts = native_model_facts(model, state.sample.wall if state.sample else None)
    if facts:
        line.append(f"  {facts}", style="dim")
    return line


def bench_rows(grid: Rows, bench: BenchSample) -> None:
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


def slot_line(slot: SlotState, room: int | None = None) -> Text:
    """A llama-server slot in one line. In the detail and a router's rows (no `room`): its phase in words with
    the prompt, cached and decoded tokens. In the column (`room`: the width beside its label): its context
    filled, as a bar against n_ctx where the room allows, and its phase short (idle, prefill progress, gen N).
    The phase is tui.live.glance.slot_phase's in both."""
    phase = slot_phase(slot)
    if room is not None:
        return _slot_glance(slot, phase, room)
    if phase == "idle":
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
    if phase == "prefill":
        line.append(f"  prefill {slot.prompt_processed or 0}/{slot.prompt_tokens}", style="yellow")
    else:
        line.append(f"  decoding {slot.decoded or 0}")
        if slot.remaining is not None and slot.remaining >= 0:
            line.append(f", {slot.remaining} left")
    if slot.speculative:
        line.append("  speculative", style="dim")
    return line


def _slot_glance(slot: SlotState, phase: SlotPhase, room: int) -> Text:
    """The column's slot line (slot_line with a room)."""
    held, ctx = slot.held, slot.n_ctx
    if phase == "idle":
        short = Text("idle", style="dim")
    elif phase == "prefill":
        short = Text(f"prefill {slot.prompt_processed or 0}/{slot.prompt_tokens}", style="yellow")
    else:
        short = Text(f"gen {slot.decoded or 0}", style="green")
    text = Text(f"{held:,}/{ctx:,}" if held is not None and ctx else "",
                style="" if slot.processing else "dim")
    text.append("  ")
    text.append_text(short)
    if len(text.plain) > room:  # a narrow column: the phase and its progress before the context's count
        return short
    width = min(16, room - len(text.plain) - 1)
    if held is None or not ctx or width < 4:
        cut_styled(text, room)
        return text
    return bar(held / ctx, width, "cyan" if slot.processing else "blue") + Text(" ") + text
