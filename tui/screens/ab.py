"""Interleaved A/B over the engines on screen (key `a`): probe blocks A B A B…, no restarts.

Watched engines are attached servers, so their "instances" are rounds in time. The result and its
offline HTML report are written beside the engine logs; fresh-instance A/B is `enginetop ab`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.engines import AttachedEngine
from tui.compare.report import write_report, write_result
from tui.paths import runs_dir
from tui.sources.engine import EngineTarget
from widgets.fmt import ms, num

VERDICT_STYLE = {"reproducible": "green", "not reproducible": "bold red"}


def verdict_view(result: dict[str, Any]) -> Group:
    analysis = result["analysis"]
    table = Table(box=None, padding=(0, 1), header_style="dim")
    for col in ("arm", "decode tok/s", "CV% inst.", "range", "TTFT", "prefill tok/s", "blocks", "verdict"):
        table.add_column(col, justify="left" if col in ("arm", "verdict") else "right", no_wrap=True)
    for name, arm in analysis["arms"].items():
        d = arm["decode_tps"]
        table.add_row(
            name, num(d.get("median")), num(arm["instance_cv_pct"]),
            f"{num(d.get('min'))}–{num(d.get('max'))}", ms(arm["ttft_s"].get("median")),
            num(arm["prefill_tps"].get("median"), "{:.0f}"), f"{arm['blocks_used']}/{arm['blocks_total']}",
            Text(arm["verdict"], style=VERDICT_STYLE.get(arm["verdict"], "")))
    lines: list[Any] = [table]
    for cmp in analysis["comparisons"]:
        d = cmp["decode_tps"]
        if d["ratio"] is not None:
            lines.append(Text(f"{cmp['other']} / {cmp['base']} decode: {d['ratio']:.3f}× "
                              f"(95% CI {num(d['ci_low'], '{:.3f}')}–{num(d['ci_high'], '{:.3f}')})"))
        lines.append(Text(cmp["verdict"], style="bold"))
    lines.extend(Text(e, style="red") for e in result.get("errors", []))
    return Group(*lines)


class ABScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    ABScreen { align: center middle; }
    ABScreen > Vertical { width: 96%; height: 90%; border: thick $primary; background: $surface; }
    ABScreen #ab-log { height: 1fr; }
    """

    def __init__(self, targets: list[EngineTarget], config: ABConfig) -> None:
        super().__init__()
        self.targets = targets
        self.config = config
        self.messages: list[str] = []
        self.result: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = (f"A/B interleaved: {' vs '.join(t.name for t in self.targets)} — "
                                f"{self.config.instances} rounds × {self.config.blocks} blocks × "
                                f"{self.config.requests_per_block} requests, workload {self.config.workload}")
            yield Static(Text("running…", style="yellow"), id="ab-result")
            with VerticalScroll(id="ab-log"):
                yield Static(id="ab-progress")
            yield Static(Text("escape: close (the run goes on in the background and still saves)",
                              style="dim"))

    def on_mount(self) -> None:
        if len(self.targets) < 2:
            self.query_one("#ab-result", Static).update(
                Text("A/B needs at least two engines on screen (or use `enginetop ab PROFILE_A PROFILE_B`)",
                     style="bold red"))
            return
        self.run_worker(self._run(), name="A/B", group="ab", exclusive=True)

    def _progress(self, message: str) -> None:
        self.messages.append(message)
        self.query_one("#ab-progress", Static).update("\n".join(self.messages[-200:]))

    async def _run(self) -> None:
        arms = [Arm(name=t.name, engine=AttachedEngine(t.name, t.url, t.api_key), url=t.url)
                for t in self.targets]

        def progress(message: str) -> None:
            self.app.call_from_thread(self._progress, message)

        result = await asyncio.to_thread(run_comparison, arms, self.config, progress=progress)
        stem = runs_dir() / f"ab-{datetime.now():%Y%m%d-%H%M%S}"
        await asyncio.to_thread(write_result, result, stem.with_suffix(".json"))
        await asyncio.to_thread(write_report, result, stem.with_suffix(".html"))
        self.result = result
        self.query_one("#ab-result", Static).update(Group(
            verdict_view(result), Text(f"saved {stem}.json (+ CSV) and {stem}.html", style="dim")))
