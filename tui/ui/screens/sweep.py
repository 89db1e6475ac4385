"""Concurrency sweep (key `c`): every engine in turn, one table each side by side, and one plot.

Engines are swept one after another, never at once: two engines sharing a GPU (or these CPUs) would
each measure the other's load.
"""

from __future__ import annotations

import asyncio

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from tui.model.targets import EngineTarget
from tui.probe.runner import ProbeBusy, ProbeRunner
from tui.probe.sweep import LevelResult, SweepConfig
from widgets.fmt import ms, num
from widgets.plots import COLORS


def level_table(name: str, levels: list[LevelResult], status: str) -> Group:
    table = Table(box=None, padding=(0, 1), header_style="dim")
    for col in ("streams", "agg tok/s", "per-stream", "TTFT p50", "TTFT p90", "errors"):
        table.add_column(col, justify="right", no_wrap=True)
    notes: list[str] = []
    for lv in levels:
        table.add_row(str(lv.level), num(lv.aggregate_tps), num(lv.per_stream_tps_p50), ms(lv.ttft_p50_s),
                      ms(lv.ttft_p90_s), Text(str(lv.failed), style="red" if lv.failed else ""))
        if lv.client.bottleneck:
            notes.append(f"{lv.level} streams: client may be the bottleneck ({', '.join(lv.client.notes)})")
        if lv.token_source in ("chunks", "mixed"):
            notes.append(f"{lv.level} streams: tokens estimated from chunks")
        notes.extend(f"{lv.level} streams: {e}" for e in lv.errors)
    return Group(Text(f"{name}  {status}", style="bold"), table, *(Text(n, style="yellow") for n in notes))


class SweepScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "close", "Stop / close")]
    DEFAULT_CSS = """
    SweepScreen { align: center middle; }
    SweepScreen > Vertical { width: 98%; height: 92%; border: thick $primary; background: $surface; }
    SweepScreen #tables { height: auto; }
    SweepScreen #tables > Static { width: 1fr; padding: 0 1; }
    SweepScreen PlotextPlot { height: 1fr; min-height: 10; }
    """

    def __init__(self, targets: list[EngineTarget], runner: ProbeRunner, config: SweepConfig) -> None:
        super().__init__()
        self.targets = targets
        self.runner = runner
        self.config = config
        self.levels: dict[str, list[LevelResult]] = {t.name: [] for t in targets}
        self.status: dict[str, str] = {t.name: "waiting" for t in targets}

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = (f"concurrency sweep: levels {', '.join(map(str, self.config.levels))}, "
                                f"workload {self.config.workload}")
            with Horizontal(id="tables"):
                for i in range(len(self.targets)):
                    yield Static(id=f"sweep-{i}")
            yield PlotextPlot(id="sweep-plot")
            yield Static(Text("escape: stop and close", style="dim"))
        yield Footer()

    def on_mount(self) -> None:
        self._draw()
        self.run_worker(self._sweep_all(), name="sweep", group="sweep", exclusive=True)

    async def _sweep_all(self) -> None:
        for target in self.targets:
            self.status[target.name] = "running…"
            self._draw()

            def on_level(level: LevelResult, name: str = target.name) -> None:
                self.levels[name].append(level)
                record = getattr(self.app, "record_event", None)  # kept in the session's recording
                if record is not None:
                    record("sweep-level", name, level.to_json())
                self._draw()

            for _ in range(600):  # a probe already in flight finishes first (at most a minute)
                if not self.runner.busy(target):
                    break
                self.status[target.name] = "waiting for the probe in flight…"
                self._draw()
                await asyncio.sleep(0.1)
            try:
                await self.runner.sweep(target, self.config, on_level)
                self.status[target.name] = "done"
            except ProbeBusy as exc:
                self.status[target.name] = f"skipped: {exc}"
            self._draw()

    def _draw(self) -> None:
        for i, t in enumerate(self.targets):
            self.query_one(f"#sweep-{i}", Static).update(level_table(t.name, self.levels[t.name],
                                                                     self.status[t.name]))
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("aggregate tok/s by concurrency")
        plt.xlabel("parallel streams")
        # levels double, so they are spaced evenly by their position, labelled with their value
        position = {level: i for i, level in enumerate(self.config.levels)}
        plt.xticks(list(position.values()), [str(level) for level in position])
        plt.xlim(-0.2, max(len(position) - 0.8, 0.2))
        for i, (name, levels) in enumerate(self.levels.items()):
            points = [(position[lv.level], lv.aggregate_tps) for lv in levels if lv.aggregate_tps is not None]
            if points:
                plt.plot([p[0] for p in points], [p[1] for p in points], label=name,
                         color=COLORS[i % len(COLORS)], marker="braille")
        plot.refresh()

    def action_close(self) -> None:
        self.workers.cancel_group(self, "sweep")
        self.dismiss()
