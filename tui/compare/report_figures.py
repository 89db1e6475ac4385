"""The report's measured figures: single-stream decode, the parameter sweep, concurrency, the A/B verdicts,
the roofline and throttling, each a section of tables and inline SVG charts (tui.html).

Each section draws what the result holds: the summaries and verdicts tui.compare.analysis computed, the
blocks and concurrency levels as measured. Worked out here, at render time, are only ratios between those
figures and the roofline (from the result's roofline input, tui.compare.roofline), so a result re-rendered
with other roofline inputs gets its own.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tui.compare.analysis import unit_of, units_of, verdict_words
from tui.compare.roofline import cross_platform, roofline
from tui.compare.sweep_param import best_value, margins, sweep_table
from tui.html.page import ms, num, section, table
from tui.html.svg import Bar, Series, bar_chart, line_chart


def verdict_html(v: str | None, words: str | None = None) -> str:
    """A verdict as the report colours it (the header's cards use it too): green, red, amber for the rest."""
    cls = {"reproducible": "ok", "not reproducible": "bad"}.get(v or "", "warn")
    return f'<span class="{cls}">{escape(words or v or "n/a")}</span>'


def _reproduction(a: dict[str, Any]) -> str:
    d = a["decode_tps"]
    cv = a["instance_cv_pct"]
    spread = f"{num(d['min'])}–{num(d['max'])}" if d["min"] is not None else ""
    unit = a["instance_unit"]
    cv_words = f"{a['instances']} {unit}"
    if cv is not None:
        cv_words = f"CV {num(cv, 1, '%')} across {cv_words}"
    verdict = verdict_html(a["verdict"], verdict_words(a))
    return f'{verdict}<br><span class="muted">{cv_words}; blocks {spread}</span>'


def single_stream_section(result: dict[str, Any]) -> str:
    analysis = result["analysis"]["arms"]
    rows, bars = [], []
    for arm in sorted(result["arms"], key=lambda a: -(analysis[a["name"]]["decode_tps"]["median"] or 0)):
        a = analysis[arm["name"]]
        rows.append(
            [
                escape(arm["name"]),
                num(a["decode_tps"]["median"]),
                _joules_cell(a.get("joules_per_token"), a.get("energy_scope"), a.get("energy_note")),
                _reproduction(a),
                num(a["server_decode_tps"]["median"]),
                ms(a["ttft_s"]["median"]),
                num(a["prefill_tps"]["median"], 0),
                num(a["gpu_util_pct"], 0, "%"),
                num(a["power_w"], 0, " W"),
                num(a["mem_bw_pct"], 0, "%"),
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
                note=f"CV {cv:.1f}% · {verdict_words(a)}" if cv is not None else verdict_words(a),
            )
        )
    grid = table(
        [
            "Arm",
            "decode tok/s",
            "J / token",
            "Reproduction",
            "server decode tok/s",
            "TTFT",
            "prefill tok/s",
            "GPU util",
            "Power",
            "Mem BW",
        ],
        rows,
        numeric=(1, 2, 4, 5, 6, 7, 8, 9),
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
        block_ms = [b["ttft_s"] * 1000 for b in mine if b["ttft_s"] is not None]
        ttft_bars.append(Bar(arm["name"], _times(t["median"], 1000), _times(t["min"], 1000),
                             _times(t["max"], 1000), block_ms))
    ttft_chart = bar_chart(
        ttft_bars, title="Time to first token (client wall clock): median, min–max, blocks", unit="ms"
    )
    body = grid + chart + ttft_chart
    return section("Single-stream decode", "The figure that decides interactive use", body)


def _joules_cell(summary: dict[str, Any] | None, scope: str | None, note: str | None) -> str:
    """Joules per generated token (median over blocks, its range) and whose energy it is; why not, muted."""
    median_j = (summary or {}).get("median")
    if median_j is None:
        return f'<span class="muted">{escape(note or "n/a")}</span>'
    spread = ""
    if summary and summary.get("min") is not None and summary.get("max") is not None:
        spread = f' <span class="muted">{summary["min"]:.3g}–{summary["max"]:.3g}</span>'
    whose = f' <span class="muted">({escape(scope)})</span>' if scope else ""
    return f"{median_j:.3g}{spread}{whose}"


def _times(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def _spec_cells(spec: dict[str, Any] | None) -> list[str]:
    if spec is None:
        return ['<span class="muted">off</span>', "", ""]
    rate, length = spec.get("acceptance_rate"), spec.get("mean_accepted_length")
    per_pos = " ".join(f"{p * 100:.0f}%" for p in spec.get("per_position") or ())
    return [num(rate * 100 if rate is not None else None, 1, "%"), num(length, 2),
            escape(per_pos) or '<span class="muted">n/a</span>']


def sweep_section(result: dict[str, Any]) -> str:
    if result["kind"] != "sweep":
        return ""
    rows = sweep_table(result)
    best = best_value(rows)
    option = result.get("sweep", {}).get("option", "value")
    drafting = any(r.get("spec") is not None for r in rows)
    body_rows = [
        [
            escape(str(r["value"])) + (" <b>(best)</b>" if best is r else ""),
            num(r["decode_tps"]),
            _joules_cell({"median": r.get("joules_per_token")}, r.get("energy_scope"), None),
            f'{verdict_html(r["verdict"])} <span class="muted">CV {num(r["instance_cv_pct"], 1, "%")}, '
            f"{r['instances']} inst., {num(r['decode_min'])}–{num(r['decode_max'])}</span>",  # sweeps restart
            *(_spec_cells(r.get("spec")) if drafting else []),
            ms(r["ttft_s"]),
            num(r["gpu_util_pct"], 0, "%"),
            num(r["power_w"], 0, " W"),
            num(r["mem_bw_pct"], 0, "%"),
        ]
        for r in rows
    ]
    spec_head = ["acceptance", "mean accepted length", "accepted per draft position"] if drafting else []
    grid = table(
        [option, "decode tok/s", "J / token", "Reproduction", *spec_head, "TTFT", "GPU util", "Power",
         "Mem BW"],
        body_rows,
        numeric=(1, 2, *((4, 5) if drafting else ()), *(range(7, 11) if drafting else range(4, 8))),
    )
    values = ", ".join(str(r["value"]) for r in rows)
    series = [
        Series("median", [(float(i), r["decode_tps"]) for i, r in enumerate(rows)]),
        Series("min", [(float(i), r["decode_min"]) for i, r in enumerate(rows)], color="#9ca3af"),
        Series("max", [(float(i), r["decode_max"]) for i, r in enumerate(rows)], color="#9ca3af"),
    ]
    chart = line_chart(series, title=f"Decode tok/s by {option}",
                       x_label=f"{option} (in the order given: {values})", y_label="tok/s")
    if drafting:
        rates = [(float(i), (r["spec"] or {}).get("acceptance_rate")) for i, r in enumerate(rows)]
        chart += line_chart(
            [Series("acceptance rate", [(x, v * 100 if v is not None else None) for x, v in rates])],
            title=f"Speculative acceptance by {option}", x_label=f"{option} (in the order given: {values})",
            y_label="% of drafted tokens accepted")
    if best:
        m = margins(rows, best)
        ahead = []
        if m["over_next"] is not None:
            ahead.append(f"{m['over_next']:.2f}× the next ({escape(str(m['next']))})")
        if m["over_off"] is not None:
            ahead.append(f"{m['over_off']:.2f}× speculation off ({escape(str(m['off']))})")
        advice = (f'<p class="note">Best reproducible value: <b>{escape(str(best["value"]))}</b> at '
                  f"{best['decode_tps']:.1f} tok/s" + (": " + ", ".join(ahead) if ahead else "") + ".</p>")
    else:
        advice = '<p class="note">No value was reproducible: do not pick one from these numbers.</p>'
    return section(
        "Parameter sweep", "Defaults can be the worst setting: measure each value", grid + advice + chart
    )


def concurrency_section(result: dict[str, Any]) -> str:
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
        cells += [num(table_of.get((a, level), {}).get("aggregate_tps")) for a in arms]
        cells += [num(table_of.get((a, level), {}).get("per_stream_tps_p50")) for a in arms]
        if len(arms) >= 2:
            x = table_of.get((arms[0], level), {}).get("aggregate_tps")
            y = table_of.get((arms[1], level), {}).get("aggregate_tps")
            cells.append(f"{y / x:.2f}×" if x and y else num(None))
        body.append(cells)
    grid = table(head, body, numeric=tuple(range(1, len(head))))
    chart = line_chart(
        [
            Series(a, [(float(lv), table_of.get((a, lv), {}).get("aggregate_tps")) for lv in levels])
            for a in arms
        ],
        title="Aggregate throughput by concurrency",
        x_label="concurrent streams",
        y_label="tok/s (end to end)",
    )
    return section(
        "Concurrency",
        "End-to-end aggregate throughput (queueing and TTFT included), on each arm's first "
        f"{units_of(result)}",
        grid + chart,
    )


def verdicts_section(result: dict[str, Any]) -> str:
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
                    f"{e['ratio']:.3f}×" if e["ratio"] is not None else num(None),
                    f"{num(e['ci_low'], 3)} – {num(e['ci_high'], 3)}",
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
    return section(
        "A/B verdicts",
        "Ratio of medians with a 95% bootstrap interval; a ratio is only worth what "
        "both arms' reproducibility is worth",
        table(["Pair", "Metric", "Ratio", "95% interval", "Verdict"], rows, numeric=(2,)) + chart,
    )


def _plain(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def roofline_section(result: dict[str, Any]) -> str:
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
                    num(info["bandwidth_bps"] / 1e9, 0, " GB/s"),
                    num(info["bytes_per_token"] / 1e9, 2, " GB"),
                    num(r.ceiling_tps, 1),
                    num(r.measured_tps),
                    num(r.pct_of_ceiling, 0, "%"),
                ]
            )
        parts.append(
            table(
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
    return section(
        "Roofline",
        "Decode reads every weight once per token: bandwidth / bytes is a hard ceiling",
        "".join(parts),
    )


def throttling_section(result: dict[str, Any]) -> str:
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
                num(a["temp_c_max"], 0, " °C"),
                num(a["power_w"], 0, " W"),
                num(a.get("host_cpu_pct"), 0, "%"),
            ]
        )
    flagged = [b for b in result["blocks"] if b.get("throttled")]
    extra = (
        ""
        if not flagged
        else '<p class="note">Throttled blocks: '
        + ", ".join(
            f"{escape(b['arm'])} {unit_of(result, b['arm'])} {b['instance'] + 1} block {b['block'] + 1}"
            for b in flagged
        )
        + "</p>"
    )
    return section(
        "Throttling",
        "Clock-event reasons seen while each block ran (idle and user-set clocks are not throttling)",
        table(
            ["Arm", "Throttled blocks", "Excluded", "Reasons", "Max temp", "Mean power", "Host CPU busy"],
            rows,
            numeric=(1, 2, 4, 5, 6),
        )
        + extra,
    )
