"""The offline report of a bench or capacity result (`enginetop report RESULT.json`): the engines side by
side, CDFs of TTFT and ITL per engine with the SLO's limits drawn on them, and for capacity the curve of each
engine's levels (rate against attainment, TTFT p90 and goodput)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from tui.html.config import config_section, findings_section
from tui.html.page import document, ms, num, section, table
from tui.html.svg import Series, cdf_chart, line_chart

BENCH_SCHEMA = "enginetop.bench/1"
CAPACITY_SCHEMA = "enginetop.capacity/1"
CDF_POINTS = (
    400  # a CDF drawn from at most this many of its values (evenly spaced ranks): the page stays small
)


def is_workload_result(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema") in (BENCH_SCHEMA, CAPACITY_SCHEMA)


def cdf(values: list[float]) -> list[tuple[float, float | None]]:
    values = sorted(values)
    n = len(values)
    if n == 0:
        return []
    ranks = (
        range(n)
        if n <= CDF_POINTS
        else sorted({round(i * (n - 1) / (CDF_POINTS - 1)) for i in range(CDF_POINTS)})
    )
    return [(values[i], (i + 1) / n) for i in ranks]


def _slo_limits(text: str | None) -> dict[str, float]:
    out = {}
    for term in (text or "").split():
        name, _, value = term.partition(":")
        out[name] = float(value)
    return out


def _spread(s: dict[str, Any]) -> str:
    return " / ".join(ms(s.get(k)) for k in ("p50", "p90", "p99"))


def bench_body(result: dict[str, Any]) -> str:
    engines = result["engines"]
    limits = _slo_limits(result.get("slo"))
    rows = [
        ("requests ok / sent", [f"{e['ok']} / {e['requests']}" for e in engines]),
        ("errors", [str(e["errors"]) for e in engines]),
        ("wrong output length", [str(e["wrong_length"]) for e in engines]),
        ("TTFT p50 / p90 / p99", [_spread(e["ttft_s"]) for e in engines]),
        ("TPOT p50 / p90 / p99", [_spread(e["tpot_s"]) for e in engines]),
        ("ITL p50 / p90 / p99", [_spread(e["itl_s"]) for e in engines]),
        ("E2E p50 / p90 / p99", [_spread(e["e2el_s"]) for e in engines]),
        ("decode tok/s p50", [num(e["decode_tps_p50"]) for e in engines]),
        ("requests/s", [num(e["requests_per_s"], 2) for e in engines]),
        ("output tok/s", [num(e["output_tokens_per_s"]) for e in engines]),
        ("J / output token", [_joules(e) for e in engines]),
        (
            "cached share",
            [
                num(e["cached_share"] * 100 if e["cached_share"] is not None else None, 1, "%")
                for e in engines
            ],
        ),
        (
            "send lateness p50 / p99",
            [f"{ms(e['lateness_s']['p50'])} / {ms(e['lateness_s']['p99'])}" for e in engines],
        ),
    ]
    if result.get("slo"):
        rows += [
            (
                f"SLO {result['slo']} met",
                [
                    num(e["attainment"] * 100 if e["attainment"] is not None else None, 1, "%")
                    for e in engines
                ],
            ),
            ("goodput req/s", [num(e["goodput_rps"], 2) for e in engines]),
        ]
    side = table(
        ["", *(e["engine"] for e in engines)],
        [[name, *values] for name, values in rows],
        numeric=range(1, len(engines) + 1),
    )
    notes = "".join(
        f'<p class="note">{escape(e["engine"])}: stopped early: {escape(e["error"])}</p>'
        for e in engines
        if e.get("error")
    ) + "".join(f'<p class="note">{escape(e["engine"])}: {escape(e["prompt_note"])}</p>'
                for e in engines if e.get("prompt_note"))
    ttft = [
        Series(e["engine"], cdf([r["ttft_ms"] for r in e["per_request"] if r["ttft_ms"] is not None]))
        for e in engines
    ]
    itl = [Series(e["engine"], cdf([g for r in e["per_request"] for g in r["itl_ms"]])) for e in engines]
    charts = cdf_chart(
        ttft,
        title="TTFT, share of requests at or under",
        x_label="TTFT (ms)",
        marks=[(limits["ttft"], f"SLO ttft {limits['ttft']:g} ms")] if "ttft" in limits else [],
    )
    charts += cdf_chart(
        itl,
        title="Inter-token gaps, share at or under",
        x_label="ITL (ms)",
        marks=[(limits["itl"], f"SLO itl {limits['itl']:g} ms")] if "itl" in limits else [],
    )
    plan = {
        "trace": f"recorded times x{result.get('speed')}",
        "rate": f"{result.get('rate')} req/s, {result.get('arrival')} arrivals",
        "concurrency": f"closed loop, {result.get('concurrency')} in flight",
    }.get(result.get("mode", ""), "")
    return (
        f'<p class="kicker">enginetop bench</p><h1>{escape(result["workload"])}</h1>'
        f'<p class="meta">{result["requests"]} requests ({result["kind"]}), {plan}'
        f"{', interrupted' if result.get('interrupted') else ''}</p>"
        + section("Side by side", "every engine got the same requests on the same plan", side + notes)
        + section("Latency distributions", "dashed: the SLO's limit", charts)
    )


def capacity_body(result: dict[str, Any]) -> str:
    engines = result["engines"]
    head = ["engine", "capacity req/s", "levels", "time"]
    rows = [
        [escape(e["engine"]), num(e["capacity_rps"], 3), str(len(e["levels"])), num(e["duration_s"], 0, " s")]
        for e in engines
    ]
    body = table(head, rows, numeric=(1, 2, 3))
    for key, title, unit, scale in (
        ("attainment", "SLO attainment by arrival rate", "share met", 100.0),
        ("ttft_p90_s", "TTFT p90 by arrival rate", "ms", 1000.0),
        ("goodput_rps", "Goodput by arrival rate", "good req/s", 1.0),
    ):
        series = [
            Series(
                e["engine"],
                [(x["rate"], x[key] * scale if x[key] is not None else None) for x in e["levels"]],
            )
            for e in engines
        ]
        body += line_chart(
            series, title=title, x_label="arrival rate (req/s)", y_label=unit, categorical_x=False
        )
    for e in engines:
        level_rows = [
            [
                num(x["rate"], 3),
                str(x["sent"]),
                num(x["attainment"] * 100 if x["attainment"] is not None else None, 1, "%"),
                ms(x["ttft_p90_s"]),
                num(x["goodput_rps"], 2),
                _joules(x),
                "pass"
                if x["passed"]
                else escape(f"fail: {x['stopped']}: {x['why']}")
                if x["stopped"]
                else "fail",
            ]
            for x in e["levels"]
        ]
        body += f"<h3>{escape(e['engine'])}</h3>" + table(
            ["rate", "sent", "SLO met", "TTFT p90", "goodput", "J / token", "verdict"], level_rows,
            numeric=(0, 1, 2, 3, 4, 5)
        )
    return (
        f'<p class="kicker">enginetop capacity</p><h1>{escape(result["workload"])}</h1>'
        f'<p class="meta">SLO {result["slo"]} met by at least {result["attainment"] * 100:g}% of requests, '
        f"{result['arrival']} arrivals, levels of {result['level_s']:g} s</p>"
        + section("Capacity", "the highest arrival rate whose level held the SLO", body)
    )


def engines_told(result: dict[str, Any]) -> str:
    """What ran and what the run revealed: the configuration captured from each engine, and the findings
    (results written before they were kept have neither)."""
    engines = result["engines"]
    if not any("config" in e for e in engines):
        return ""
    return config_section([(e["engine"], e.get("config")) for e in engines]) + findings_section(
        [f for e in engines for f in e.get("findings") or ()])


def write_workload_report(result: dict[str, Any], out: Path, source: str) -> Path:
    body = bench_body(result) if result["schema"] == BENCH_SCHEMA else capacity_body(result)
    body += engines_told(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        document(f"enginetop {result['schema'].split('.')[1].split('/')[0]}", body, source), encoding="utf-8"
    )
    return out


def _joules(part: dict[str, Any]) -> str:
    """Joules per generated token with whose energy it is (a result written before energy was read: n/a)."""
    value = part.get("joules_per_token")
    if value is None:
        note = part.get("energy_note")
        return f'<span class="muted">{escape(note)}</span>' if note else "n/a"
    scope = part.get("energy_scope")
    return f"{value:.3g}" + (f' <span class="muted">({escape(scope)})</span>' if scope else "")
