"""The A/B run's progress and verdicts (key `a`). The run itself belongs to the app (tui.compare.abrun):
escape closes this screen, the run goes on and still saves; `a` again reopens this view of it.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tui.base.paths import runs_dir
from tui.compare.ab import ABConfig, Arm
from tui.compare.abrun import ABRun
from tui.compare.analysis import verdict_words
from tui.compare.engines import AttachedEngine
from tui.lifecycle.engine import EngineInstance
from tui.lifecycle.profiles import Profile
from tui.live.store import Store
from tui.model.samples import GpuReport
from tui.model.targets import EngineTarget
from widgets.fmt import ms, num

VERDICT_STYLE = {"reproducible": "green", "not reproducible": "bold red"}


def dashboard_arm(target: EngineTarget, profile: Profile | None = None,
                  instance: EngineInstance | None = None) -> Arm:
    """An arm for an engine column. Nothing is restarted: a managed engine is measured as it runs, and its
    profile and exact argv go into the report (what the dashboard launched, not a guess)."""
    engine = AttachedEngine(target.name, target.url, target.api_key, target.basic_auth)
    if profile is None:
        return Arm(target.name, engine, url=target.url,
                   origin=f"watched by the dashboard at {target.url}, not started by enginetop")
    if instance is None or instance.name != profile.name:
        origin = f"profile {profile.name}: the dashboard had no running engine of it when the A/B began"
    elif instance.pid is None:
        origin = f"attached through profile {profile.name} at {target.url}, not started by enginetop"
    else:
        name, pid = profile.name, instance.pid
        origin = f"started by the dashboard from profile {name} (PID {pid}), not restarted for the A/B"
    argv = instance.resolved.argv if instance is not None and instance.name == profile.name else None
    return Arm(target.name, engine, argv=list(argv) if argv else None,
               engine_kind=profile.engine, url=target.url, profile_path=str(profile.path),
               notes=profile.notes, origin=origin)


# `a` on the dashboard: the engines as they run, side by side, short enough to wait for
DASHBOARD_AB = ABConfig(instances=3, blocks=2, requests_per_block=2, max_tokens=32, mode="coresident")


def start_dashboard_ab(arms: list[Arm], config: ABConfig | None, store: Store,
                       gpu_interval_s: float) -> ABRun:
    """Start the run in its own thread (`config` None: DASHBOARD_AB). The GPU is read from the dashboard's
    own NVML sampler (the store's latest report), never sampled a second time from another thread."""

    def gpu(engine_pids: dict[str, set[int]] | None = None) -> GpuReport:
        # the dashboard's report names the processes of every engine it watches (its own host walk)
        return store.gpu or GpuReport(t=time.time(), unavailable="no GPU reading yet")

    stem = runs_dir() / f"ab-{datetime.now():%Y%m%d-%H%M%S}"
    config = dataclasses.replace(config or DASHBOARD_AB, gpu_interval_s=gpu_interval_s)
    origin = f"the dashboard's GPU panel (its latest NVML reading, taken every {gpu_interval_s:g} s)"
    return ABRun(arms, config, stem, gpu=gpu, gpu_origin=origin).start()


def verdict_view(result: dict[str, Any]) -> Group:
    analysis = result["analysis"]
    units = " / ".join(sorted({arm["instance_unit"] for arm in analysis["arms"].values()}))
    table = Table(box=None, padding=(0, 1), header_style="dim")
    for col in ("arm", "decode tok/s", f"CV% {units}", "range", "TTFT", "prefill tok/s", "blocks", "verdict"):
        table.add_column(col, justify="left" if col in ("arm", "verdict") else "right", no_wrap=True)
    for name, arm in analysis["arms"].items():
        d = arm["decode_tps"]
        table.add_row(
            name, num(d.get("median")), num(arm["instance_cv_pct"]),
            f"{num(d.get('min'))}–{num(d.get('max'))}", ms(arm["ttft_s"].get("median")),
            num(arm["prefill_tps"].get("median"), "{:.0f}"), f"{arm['blocks_used']}/{arm['blocks_total']}",
            Text(verdict_words(arm), style=VERDICT_STYLE.get(arm["verdict"], "")))
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

    def __init__(self, run: ABRun) -> None:
        super().__init__()
        self.run = run
        self._shown = -1  # messages drawn so far; -1: nothing drawn yet

    def compose(self) -> ComposeResult:
        cfg = self.run.config
        units = " / ".join(sorted({arm.unit + "s" for arm in self.run.arms}))
        with Vertical() as box:
            box.border_title = (f"A/B interleaved: {' vs '.join(a.name for a in self.run.arms)} — "
                                f"{cfg.instances} {units} × {cfg.blocks} blocks × "
                                f"{cfg.requests_per_block} requests, workload {cfg.workload}")
            yield Static(Text("running…", style="yellow"), id="ab-result")
            with VerticalScroll(id="ab-log"):
                yield Static(id="ab-progress")
            yield Static(Text("escape: close (the run goes on in the background, still saves, and the "
                              "dashboard says when it is done; a: show it again)", style="dim"))
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_view()
        self.set_interval(0.5, self.refresh_view)

    def refresh_view(self) -> None:
        run = self.run
        messages = list(run.messages)  # appended by the run's thread
        if len(messages) != self._shown:
            self._shown = len(messages)
            self.query_one("#ab-progress", Static).update("\n".join(messages[-200:]))
        if not run.done:
            return
        result = self.query_one("#ab-result", Static)
        if run.error is not None:
            result.update(Text(f"A/B failed: {run.error}", style="bold red"))
        elif run.result is not None:
            saved = ", ".join(str(p) for p in run.saved)
            result.update(Group(verdict_view(run.result), Text(f"saved {saved}", style="dim")))
