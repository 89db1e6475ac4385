"""The probe panel draws what the results say: the engine's TTFT beside the client's, and their warnings."""

from __future__ import annotations

import io

from rich.console import Console

from tui.probe.results import ProbeResult
from tui.probe.timings import ServerTimings
from widgets.probe_panel import render_probes


def drawn(results: list[ProbeResult], factor: float = 2.0) -> str:
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(render_probes(results, factor))
    return console.export_text()


def result(first_token_at: float, prompt_ms: float, cached: int = 1) -> ProbeResult:
    return ProbeResult(engine="e", url="u", workload="short", index=0, wall_start=0.0, sent_at=10.0,
                       connect_s=0.0004, first_token_at=first_token_at, last_token_at=first_token_at + 1.0,
                       ended_at=first_token_at + 1.0, status=200, prompt_tokens=50, cached_tokens=cached,
                       completion_tokens=65, chunks=65,
                       server=ServerTimings(source="llamacpp", prompt_ms=prompt_ms, cache_n=cached))


def test_engine_ttft_is_drawn_beside_the_clients() -> None:
    text = drawn([result(10.090, 80.0)])
    assert "TTFT 90 ms (engine 80 ms)" in text
    assert "engine" in text.splitlines()[1]  # the column header
    assert "!" not in text  # nothing to warn about


def test_the_latest_probes_warnings_are_drawn_in_its_own_words() -> None:
    late = result(10.200, 20.0, cached=45)
    text = drawn([result(10.090, 80.0), late])
    assert late.cache_note is not None and late.cache_note in text
    gap = late.ttft_gap()
    assert gap is not None and f"! {gap.text()}" in text
    assert "! " not in drawn([late], factor=20.0).replace(f"! {late.cache_note}", "")  # the user's factor
