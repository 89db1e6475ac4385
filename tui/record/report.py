"""`enginetop report RECORDING -o report.html`: the offline single-file report (tui.compare.report's
styles and conventions: inline SVG, no script, no network) for a whole recording.

The figures are the dashboard's: the recording is fed through a Store, which derives tok/s and TTFT from
the recorded readings as it did live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from pathlib import Path

from tui.html.page import document, ms, num, section, table
from tui.html.svg import PALETTE, frame, nice_max, tick_label
from tui.live.placement import container_words, limit_words
from tui.live.store import Store
from tui.model.events import Event, ProbeEvent
from tui.model.samples import EngineReading, EngineSample, GpuReport, HostSample
from tui.model.traffic import TrafficSample
from tui.probe.results import ProbeResult
from tui.record.reader import Recording
from tui.sources.rates import went_back
from tui.sources.requests import request_stats

MAX_POINTS = 600  # per line: a day at 1 Hz is drawn from means over 2.4 min buckets


@dataclass
class Summary:
    engines: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)  # name->key->pts
    throttle: list[tuple[float, float]] = field(default_factory=list)  # wall spans
    marks: list[tuple[float, str, str]] = field(default_factory=list)  # (wall, engine, what)
    probes: list[tuple[float, str, ProbeResult]] = field(default_factory=list)
    verdicts: list[tuple[float, dict]] = field(default_factory=list)
    sweeps: list[tuple[float, str, dict]] = field(default_factory=list)
    alerts: list[tuple[float, str]] = field(default_factory=list)
    health: dict[str, dict[str, int]] = field(default_factory=dict)
    traffic: dict[str, TrafficSample] = field(default_factory=dict)  # the proxy's last figures per engine
    # each engine's first and last reading of its last run: its requests as it counted them in between
    runs: dict[str, list[tuple[float, EngineReading]]] = field(default_factory=dict)
    # whether each poll of the run found a request running: runs keeps only its first and last readings
    running: dict[str, list[bool | None]] = field(default_factory=dict)
    # energy: each engine's (J/token, W, scope, source) whenever the store had them; each device's counter
    # at its first and last reading (GPU by label, "cpu package"); each probe's energy once it was known
    energy: dict[str, list[tuple[float, float | None, float, str | None, str | None]]] = field(
        default_factory=dict)
    counters: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # device -> first, last
    probe_energy: dict[tuple[str, float | None], ProbeResult] = field(default_factory=dict)  # (engine, sent)
    # where each engine ran: its container and its cgroup's limits as last read, and the largest share of its
    # quota's periods throttled over any window of the recording
    placement: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    most_throttled: dict[str, float] = field(default_factory=dict)


def summarize(rec: Recording) -> Summary:
    out = Summary()
    store = Store(horizon_s=60.0, max_points=60)  # only its stats are read: the windows, not the plots
    store.on_probe_energy = lambda engine, r: out.probe_energy.__setitem__((engine, r.sent_at), r)
    span_start: float | None = None
    last_wall = None
    for row in rec.rows():
        item = row.item
        if isinstance(item, GpuReport | HostSample):
            store.add(item)  # the GPUs' and the CPU package's energy windows, for each engine's J/token
            _counters(out, item, row.wall)
            if isinstance(item, HostSample):
                _placement(out, store)
        if isinstance(item, EngineSample):
            store.add(item)
            stats = store.engines[item.name].stats
            if stats.energy_w is not None:
                out.energy.setdefault(item.name, []).append(
                    (row.wall, stats.joules_per_token, stats.energy_w, stats.energy_scope,
                     stats.energy_source))
            series = out.engines.setdefault(item.name, {"gen_tps": [], "ttft_p50_s": []})
            for key in series:
                value = getattr(stats, key)
                if value is not None:
                    series[key].append((row.wall, value))
            counts = out.health.setdefault(item.name, {})
            counts[item.health] = counts.get(item.health, 0) + 1
            if item.reading is not None:
                run = out.runs.setdefault(item.name, [])
                if run and went_back(run[-1][1], item.reading):
                    run.clear()  # it restarted: the requests of its last run
                running = out.running.setdefault(item.name, [])
                if not run:
                    running.clear()
                busy = item.reading.running
                running.append(None if busy is None else busy > 0)  # a flag: a long recording has many polls
                run[1:] = [(row.t, item.reading)]
        elif isinstance(item, GpuReport):
            throttled = any(g.throttled for g in item.gpus)
            if throttled and span_start is None:
                span_start = row.wall
            elif not throttled and span_start is not None:
                out.throttle.append((span_start, row.wall))
                span_start = None
            last_wall = row.wall
        elif isinstance(item, TrafficSample):
            out.traffic[item.name] = item
        elif isinstance(item, ProbeEvent):
            store.add(item)  # its energy, once the readings after it are in
            out.probes.append((row.wall, item.engine, item.result))
        elif isinstance(item, Event):
            data = item.data
            if item.kind == "switch-result":
                what = f"switch to {data.get('to')}: " + ("ok" if data.get("ok") else
                                                           f"{data.get('failed_step')} failed")
                out.marks.append((row.wall, item.source or "", what))
            elif item.kind == "engine-state" and data.get("state") in ("crashed", "failed"):
                what = f"{data.get('state')}: {data.get('message', '')}"
                out.marks.append((row.wall, item.source or "", what))
            elif item.kind == "ab":
                for v in data.get("verdicts") or [{"pair": "", "verdict": str(data.get("summary", ""))}]:
                    out.verdicts.append((row.wall, v))
            elif item.kind == "sweep-level":
                out.sweeps.append((row.wall, item.source or "", data))
            elif item.kind == "alert":
                out.alerts.append((row.wall, f"{data.get('title', '')}: {data.get('message', '')}"))
    if span_start is not None and last_wall is not None:
        out.throttle.append((span_start, last_wall))
    return out


def _placement(out: Summary, store: Store) -> None:
    for name, state in store.engines.items():
        if state.container is not None:
            limits = limit_words(state.cgroup, state.cgroup_use)[0] if state.cgroup is not None else None
            out.placement[name] = (container_words(state.container, state.cgroup), limits)
        share = state.cgroup_use.throttled_share if state.cgroup_use is not None else None
        if share is not None:
            out.most_throttled[name] = max(share, out.most_throttled.get(name, 0.0))


def _counters(out: Summary, item: GpuReport | HostSample, wall: float) -> None:
    """Each device's energy counter at its first and last reading in the recording."""
    if isinstance(item, HostSample):
        pairs = [("cpu package", item.cpu_energy_j)]
    else:
        pairs = [(f"{g.host + ' ' if g.host else ''}gpu {g.index} {g.name or ''}".strip(), g.energy_j)
                 for g in item.gpus]
    for device, value in pairs:
        if value is not None:
            kept = out.counters.setdefault(device, [])
            kept[1:] = [(wall, value)]
            if len(kept) == 1:
                kept.append((wall, value))


def _thin(points: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    width = (t1 - t0) / MAX_POINTS or 1.0
    buckets: dict[int, list[tuple[float, float]]] = {}
    for t, v in points:
        buckets.setdefault(int((t - t0) / width), []).append((t, v))
    return [(b[0][0], sum(v for _, v in b) / len(b)) for _, b in sorted(buckets.items())]


def time_chart(lines: dict[str, list[tuple[float, float]]], t0: float, t1: float, *, title: str, unit: str,
               spans: list[tuple[float, float]], marks: list[tuple[float, str, str]], scale: float = 1.0,
               dots: dict[str, list[tuple[float, float]]] | None = None, width: int = 940,
               height: int = 280) -> str:
    """Lines against wall-clock time, probe results as dots (at the instant each figure measured),
    throttled spans shaded red, switches and crashes as dashed lines."""
    dots = dots or {}
    left, right, top, bottom = 64, 150, 34, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    ys = [v * scale for pts in (*lines.values(), *dots.values()) for _, v in pts]
    ymax = nice_max(max(ys) if ys else 1.0)
    span = (t1 - t0) or 1.0
    px = lambda t: left + plot_w * (t - t0) / span  # noqa: E731
    py = lambda v: top + plot_h * (1 - v * scale / ymax)  # noqa: E731
    out = frame(title, width, height)
    for a, b in spans:
        out.append(f'<rect x="{px(a):.1f}" y="{top}" width="{max(1.0, px(b) - px(a)):.1f}" height="{plot_h}" '
                   f'fill="#dc2626" fill-opacity="0.15"><title>GPU throttled {_clock(a)}–{_clock(b)}'
                   "</title></rect>")
    for i in range(5):
        tick = ymax * i / 4
        ty = top + plot_h * (1 - tick / ymax)
        out.append(f'<line x1="{left}" y1="{ty:.1f}" x2="{left + plot_w}" y2="{ty:.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" font-size="11" fill="#6b7280" '
                   f'text-anchor="end">{tick_label(tick)}</text>')
        tx = t0 + span * i / 4
        out.append(f'<text x="{px(tx):.1f}" y="{top + plot_h + 16}" font-size="11" fill="#6b7280" '
                   f'text-anchor="middle">{_clock(tx)}</text>')
    out.append(f'<text x="12" y="{top + plot_h / 2:.1f}" font-size="11" fill="#374151" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + plot_h / 2:.1f})">{escape(unit)}</text>')
    for t, engine, what in marks:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + plot_h}" stroke="#111827" '
                   f'stroke-dasharray="4 3"><title>{escape(engine)} {_clock(t)}: {escape(what)}'
                   "</title></line>")
    for i, (name, pts) in enumerate(lines.items()):
        color = PALETTE[i % len(PALETTE)]
        for t, v in dots.get(name, []):
            out.append(f'<circle cx="{px(t):.1f}" cy="{py(v):.1f}" r="3.5" fill="#ffffff" stroke="{color}" '
                       f'stroke-width="2"><title>probe {escape(name)} {_clock(t)}: '
                       f"{tick_label(v * scale)}</title>"
                       "</circle>")
        pts = _thin(pts, t0, t1)
        if pts:
            coords = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in pts)
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        ly = top + 14 + 18 * i
        out.append(f'<rect x="{left + plot_w + 14}" y="{ly - 8}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{left + plot_w + 32}" y="{ly + 2}" font-size="11" fill="#111827">'
                   f"{escape(name[:20])}</text>")
    out.append("</svg>")
    return "\n".join(out)


def _clock(wall: float) -> str:
    return datetime.fromtimestamp(wall).strftime("%H:%M:%S")


def render_recording(rec: Recording) -> str:
    s = summarize(rec)
    if rec.empty:
        t0 = t1 = time.time()
    else:
        assert rec.start is not None and rec.end is not None
        t0, t1 = rec.wall(rec.start), rec.wall(rec.end)
    names = ", ".join(s.engines) or "no engines"
    head = (f'<p class="kicker">enginetop recording</p><h1>{escape(names)}</h1>'
            f'<p class="meta">{escape(rec.path.name)} · {datetime.fromtimestamp(t0):%Y-%m-%d %H:%M:%S} – '
            f'{datetime.fromtimestamp(t1):%H:%M:%S} ({(t1 - t0) / 60:.1f} min) · host '
            f'{escape(rec.meta.get("host", "?"))} · {rec.count} rows</p>')
    if rec.damage:
        head += f'<p class="note">{escape(rec.damage)}</p>'
    gen = {n: e["gen_tps"] for n, e in s.engines.items()}
    ttft = {n: e["ttft_p50_s"] for n, e in s.engines.items()}
    wall_of = rec.mono_to_wall  # probe instants are on the recording's monotonic clock
    probe_gen: dict[str, list[tuple[float, float]]] = {}
    probe_ttft: dict[str, list[tuple[float, float]]] = {}
    for _, engine, r in s.probes:
        if r.decode_at is not None and r.decode_tps is not None:
            probe_gen.setdefault(engine, []).append((r.decode_at + wall_of, r.decode_tps))
        if r.ttft_at is not None and r.ttft_s is not None:
            probe_ttft.setdefault(engine, []).append((r.ttft_at + wall_of, r.ttft_s))
    charts = (time_chart(gen, t0, t1, title="generation tok/s: engine counters (lines), probe decode (dots)",
                         unit="tok/s", spans=s.throttle, marks=s.marks, dots=probe_gen)
              + time_chart(ttft, t0, t1, title="TTFT p50: engine histograms (lines), probes (dots)",
                           unit="ms", scale=1000.0, spans=s.throttle, marks=s.marks, dots=probe_ttft))
    throttled = sum(b - a for a, b in s.throttle)
    body = [head, section("Over time", f"GPU throttled {throttled:.0f} s in {len(s.throttle)} span(s) "
                           "(red); switches and crashes dashed", charts)]
    rows = [[escape(n), *(str(c.get(h, 0)) for h in ("up", "loading", "starting", "down"))]
            for n, c in s.health.items()]
    body.append(section("Engines", "polls by health", table(["engine", "up", "loading", "starting", "down"],
                                                              rows, numeric=(1, 2, 3, 4))))
    if s.placement:
        body.append(section("Where the engines ran", "each engine's container and what its cgroup imposed, "
                            "as last read; the most of its CPU quota's periods throttled over any window",
                            table(["engine", "container", "limits", "most throttled"],
                                  [[escape(n), escape(where), escape(limits or "n/a"),
                                    num(None if n not in s.most_throttled else s.most_throttled[n] * 100, 0,
                                        "%")]
                                   for n, (where, limits) in s.placement.items()], numeric=(3,))))
    probe_rows = [[_clock(w), escape(e), escape(r.workload), "ok" if r.ok else escape(r.error or "failed"),
                   ms(r.ttft_s), num(r.decode_tps), num(r.prefill_tps), str(r.completion_tokens or ""),
                   _probe_energy(s.probe_energy.get((e, r.sent_at)))]
                  for w, e, r in s.probes]
    body.append(section("Probes", f"{len(s.probes)} probe request(s)", table(
        ["time", "engine", "workload", "result", "TTFT", "decode tok/s", "prefill tok/s", "tokens", "energy"],
        probe_rows, numeric=(4, 5, 6, 7, 8))))
    body.append(_energy_section(s))
    events = [[_clock(w), escape(e), escape(what)] for w, e, what in s.marks]
    body.append(section("Switches and crashes", f"{len(events)} event(s)",
                         table(["time", "engine", "what"], events)))
    body.append(section("A/B verdicts", f"{len(s.verdicts)} comparison(s) in this session", table(
        ["time", "pair", "decode ratio", "95% interval", "verdict"],
        [[_clock(w), escape(v.get("pair", "")), num(v.get("decode_ratio"), 3),
          f"{num(v.get('ci_low'), 3)} – {num(v.get('ci_high'), 3)}", escape(str(v.get("verdict", "")))]
         for w, v in s.verdicts], numeric=(2,))))
    body.append(section("Concurrency sweeps", f"{len(s.sweeps)} level(s) measured", table(
        ["time", "engine", "streams", "ok", "aggregate tok/s", "TTFT p50"],
        [[_clock(w), escape(e), str(d.get("level")), f"{d.get('ok')}/{d.get('requests')}",
          num(d.get("aggregate_tps")), ms(d.get("ttft_s_p50"))] for w, e, d in s.sweeps],
        numeric=(2, 3, 4, 5))))
    traffic_rows = [[escape(n), str(t.stats.total_requests), str(t.stats.total_errors),
                     str(t.stats.total_abandoned), f"{ms(t.stats.ttft_p50_s)} / {ms(t.stats.ttft_p90_s)}",
                     f"{ms(t.stats.itl_p50_s)} / {ms(t.stats.itl_p90_s)}", num(t.stats.decode_tps_p50),
                     num(t.stats.prompt_tokens_mean, 0),
                     "n/a" if t.stats.cached_share is None else f"{t.stats.cached_share * 100:.1f}%"]
                    for n, t in s.traffic.items()]
    body.append(section("Real traffic", "the user's own requests, measured by enginetop's proxy (totals; "
                        "latencies over the last window of the session)", table(
        ["engine", "requests", "errors", "abandoned", "TTFT p50/p90", "ITL p50/p90", "decode tok/s",
         "prompt tokens", "cached"], traffic_rows, numeric=(1, 2, 3, 6, 7, 8))))
    request_rows = []
    for name, run in s.runs.items():
        traffic = s.traffic.get(name)
        relayed = traffic.stats.per_request if traffic is not None and traffic.error is None else None
        rs = request_stats(run, s.running.get(name)) or relayed
        if rs is None:
            continue
        finish = " ".join(f"{r} {n:.0f}" for r, n in rs.finish_window)
        since = " ".join(f"{r} {n:.0f}" for r, n in rs.finish_total)
        seen = "" if rs.origin is None else f" (via the proxy, its last {rs.window_s:.0f} s)"
        request_rows.append([escape(name + seen), num(rs.ended, 0), num(rs.requests_per_s, 2), escape(finish),
                             escape(since),
                             *(" / ".join(ms(v) for v in q) if q else "n/a"
                               for q in (rs.queue_s, rs.prefill_s, rs.decode_s, rs.e2e_s)),
                             num(rs.prompt_len[0] if rs.prompt_len else None, 0),
                             num(rs.gen_len[0] if rs.gen_len else None, 0), num(rs.preemptions_per_s, 2),
                             num(rs.tokens_per_step, 1),
                             num(None if rs.busy_share is None else rs.busy_share * 100, 0, "%"),
                             num(rs.gen_tps_serving)])
    body.append(section("Requests, as the engines timed them", "over each engine's last run in the recording "
                        "(vLLM's per-request histograms and counters; an engine without them, as llama.cpp: "
                        "the last window of answers relayed by enginetop's proxy; p50 / p90 / p99); finish "
                        "reasons since start: since the engine started (the proxy's: since its first request "
                        "in this run); busy: the share of polls that found a request running", table(
        ["engine", "ended", "req/s", "finish reasons", "since start", "queue", "prefill", "decode",
         "end to end", "prompt avg", "generated avg", "preemptions/s", "tokens/step", "busy",
         "gen tok/s while serving"],
        request_rows, numeric=(1, 2, 9, 10, 11, 12, 13, 14))))
    body.append(section("Alerts", f"{len(s.alerts)} warning(s) shown",
                         table(["time", "alert"], [[_clock(w), escape(a)] for w, a in s.alerts])))
    return document(f"enginetop recording · {names}", "".join(body), str(rec.path))


def write_recording_report(rec: Recording, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_recording(rec), encoding="utf-8")
    return out


def is_recording(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _probe_energy(r: ProbeResult | None) -> str:
    if r is None:
        return ""
    if r.energy_j is None:
        return f'<span class="muted">{escape(r.energy_note or "n/a")}</span>'
    per = f" ({r.joules_per_token:.3g} J/token)" if r.joules_per_token is not None else ""
    return f"{r.energy_j:.1f} J{per}"


def _energy_section(s: Summary) -> str:
    """Energy per generated token per engine over the session, and each device's energy counter over it."""
    rows = []
    for name, points in s.energy.items():
        generating = sorted(j for _, j, _, _, _ in points if j is not None)
        median_j = generating[len(generating) // 2] if generating else None
        watts = sum(w for _, _, w, _, _ in points) / len(points)
        scopes = ", ".join(sorted({p[3] for p in points if p[3]}))
        sources = ", ".join(sorted({p[4] for p in points if p[4]}))
        rows.append([escape(name), num(median_j, 3), num(watts), str(len(generating)), escape(scopes),
                     escape(sources)])
    engines = table(["engine", "J/token (median while generating)", "W (mean)", "polls generating", "whose",
                     "measured by"], rows, numeric=(1, 2, 3))
    devices = [[escape(d), f"{b[1] - a[1]:,.1f} J", f"{(b[1] - a[1]) / (b[0] - a[0]):.1f} W"
                if b[0] > a[0] else "n/a"] for d, (a, b) in s.counters.items()]
    counters = table(["device", "energy counter's change over the recording", "mean power"], devices,
                     numeric=(1, 2))
    return section("Energy", "joules per generated token from each engine's GPUs (or the CPU package for an "
                   "engine on this machine's CPU) over the dashboard's window, and every energy counter "
                   "recorded", engines + counters)
