"""The tables every report shares about what ran: the configuration captured from the running engines (a
column per arm, instance or engine; a row whose values differ between columns marked), and the findings a run
revealed. Both take the JSON a result keeps (tui.run.snapshot.config_json, Finding.json)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from tui.html.page import section

ROWS = (
    ("engine", "engine"), ("version", "version"), ("model", "model"), ("context_tokens", "context (tokens)"),
    ("kv_pool_tokens", "KV pool (tokens)"), ("slots", "slots"), ("kv_unified", "slots share one KV"),
    ("prefix_caching", "prefix cache"), ("kv_cache_dtype", "KV cache type"), ("block_size", "KV block"),
    ("gpu_memory_utilization", "GPU memory share"), ("flash_attn", "flash attention"),
    ("gpu_layers", "GPU layers"), ("batch_size", "batch"), ("ubatch_size", "ubatch"),
    ("spec_type", "speculative"), ("spec_n_max", "draft depth (n-max)"), ("spec_p_min", "draft p-min"),
    ("spec_draft_model", "draft model"), ("spec_synthetic", "synthetic acceptance"),
)


def _cell(value: Any) -> str:
    if value is None:
        return '<span class="muted">n/a</span>'
    if isinstance(value, bool):
        return "on" if value else "<b>off</b>"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, str) and "/" in value and len(value) > 40:
        value = value.rsplit("/", 1)[-1]
    return escape(str(value))


def config_table(columns: Sequence[tuple[str, dict[str, Any] | None]]) -> str:
    """`columns`: (label, a configuration as captured, None when it could not be). Rows whose values differ
    between the columns are highlighted and marked ≠."""
    if not any(c for _, c in columns):
        return '<p class="muted">No configuration was captured from the engines.</p>'
    head = "".join(f"<th>{escape(label)}</th>" for label, _ in columns)
    rows = []
    for key, words in ROWS:
        values = [(c or {}).get(key) for _, c in columns]
        if all(v is None for v in values):
            continue
        differ = len(columns) > 1 and len({repr(v) for v in values}) > 1
        mark = " ≠" if differ else ""
        # a value the command line left to the engine's default is said as one, never as read
        shown = [_cell(v) + (' <span class="muted">(default)</span>'
                             if key in ((c or {}).get("defaults") or ()) else "")
                 for v, (_, c) in zip(values, columns, strict=True)]
        rows.append(f'<tr{" class=diff" if differ else ""}><td>{escape(words)}{mark}</td>'
                    + "".join(f"<td>{cell}</td>" for cell in shown) + "</tr>")
    sources = [", ".join((c or {}).get("sources") or ()) or "n/a" for _, c in columns]
    rows.append("<tr><td>read from</td>" + "".join(f'<td class="muted">{escape(s)}</td>' for s in sources)
                + "</tr>")
    lacks = ["; ".join((c or {}).get("lacks") or ()) for _, c in columns]
    if any(lacks):
        cells = "".join(f'<td class="muted">{escape(x)}</td>' for x in lacks)
        rows.append(f"<tr><td>not published</td>{cells}</tr>")
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def config_section(columns: Sequence[tuple[str, dict[str, Any] | None]]) -> str:
    return section("Configuration captured from the running engines",
                   "read from each engine as it ran (never from a profile alone); ≠ marks what differs",
                   config_table(columns))


def findings_html(findings: Sequence[dict[str, Any]]) -> str:
    if not findings:
        return ('<p class="muted">No finding: nothing the judges look for held on this run (each needs '
                "enough data: see the README).</p>")
    out = []
    for f in findings:
        evidence = "".join(f"<li>{escape(e)}</li>" for e in f.get("evidence") or ())
        out.append(f'<div class="finding {escape(f["severity"])}"><b>{escape(f["engine"])}: '
                   f'{escape(f["severity"])}</b> <code>{escape(f["id"])}</code><br>{escape(f["title"])}'
                   f'<br><span class="muted">try: {escape(f["suggestion"])}</span>'
                   + (f"<ul class=muted>{evidence}</ul>" if evidence else "") + "</div>")
    return "".join(out)


def findings_section(findings: Sequence[dict[str, Any]]) -> str:
    return section("Findings", "what the engines' own figures and this run's requests revealed",
                   findings_html(findings))
