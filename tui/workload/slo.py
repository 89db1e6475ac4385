"""A bench's requests judged against an SLO (tui.model.slo): the figures of a probe result."""

from __future__ import annotations

from tui.model.slo import RequestFigures, Slo, tpot
from tui.probe.results import ProbeResult


def tpot_s(result: ProbeResult) -> float | None:
    return tpot(result.ttft_s, result.e2e_s, result.completion_tokens)


def figures(result: ProbeResult) -> RequestFigures:
    return RequestFigures(result.ok, result.ttft_s, tpot_s(result), result.e2e_s,
                          max(result.gaps_s) if result.gaps_s else None)


def met(slo: Slo, result: ProbeResult) -> bool:
    return slo.met(figures(result))
