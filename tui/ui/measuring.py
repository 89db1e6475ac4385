"""Measuring the engines from the dashboard: probes (`f`, and every N seconds where asked), the concurrency
sweep (`c`) and A/B (`a`).

One room because each of these puts load on the engines, so each must know of the others: a probe waits
while a sweep or an A/B measures, and an A/B run outlives its screen (the app owns it, and says its verdict
when it ends).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from tui.base.install import command
from tui.model.targets import EngineTarget
from tui.probe.results import ProbeResult
from tui.probe.workloads import WorkloadParams
from tui.ui.core import AppCore
from tui.ui.fleet import fleet_target
from tui.ui.screens.fleet import EngineScreen
from tui.ui.screens.sweep import SweepScreen
from tui.ui.slots import Slot

if TYPE_CHECKING:  # the A/B screen brings the comparison and its report: imported when `a` is pressed
    from tui.compare.abrun import ABRun

log = logging.getLogger(__name__)


class Measuring(AppCore):
    """Probes, the sweep and A/B, started from the dashboard; a mixin of EnginetopApp."""

    ab_run: ABRun | None = None  # the app owns it: closing its screen neither stops nor loses the run

    # ---- probes ---------------------------------------------------------------------------
    async def _probe(self, target: EngineTarget) -> None:
        def keep(result: ProbeResult) -> None:
            self.store.add_probe(target.name, result)
            # A line a probe: the figures outlive the screen (bench/bench_exporter.py reads them to compare
            # the browser view's dashboard with the terminal's).
            ttft = "n/a" if result.ttft_s is None else f"{result.ttft_s * 1000:.2f}"
            log.info("probe %s %s: ttft_ms=%s decode_tps=%s %s", target.name, result.workload, ttft,
                     "n/a" if result.decode_tps is None else f"{result.decode_tps:.1f}",
                     "ok" if result.ok else f"failed: {result.error}")

        params = WorkloadParams(max_tokens=self.config.probe_max_tokens)
        await self.probes.probe(target, self.config.probe_workload, params, repeat=1, on_result=keep,
                                on_progress=lambda progress: self.store.probe_progress(target.name, progress))

    async def _probe_loop(self, slot: Slot) -> None:
        assert slot.probe_every_s
        while True:
            await asyncio.sleep(slot.probe_every_s)
            sample = self.store.engines[slot.target.name].sample
            if isinstance(self.screen, SweepScreen) or self.ab_running:
                continue  # a sweep or A/B is measuring: a probe now would add load to what it measures
            if sample is not None and sample.health == "up" and not self.probes.busy(slot.target):
                await self._probe(slot.target)

    @property
    def ab_running(self) -> bool:
        """An A/B run is measuring (its screen may be closed)."""
        return self.ab_run is not None and not self.ab_run.done

    def _ab_measuring(self) -> bool:
        """Say so when an A/B is running: extra load now would skew what it measures."""
        if self.ab_running:
            self.notify("an A/B run is measuring: wait for it (key a shows its progress)", severity="warning")
            return True
        return False

    def action_probe_now(self) -> None:
        if self._ab_measuring():
            return
        targets = [slot.target for slot in self.slots]
        if isinstance(self.screen, EngineScreen):  # an engine opened from the fleet table
            targets = [fleet_target(self.store, self.config.fleet, self.screen.engine_name)]
        started = 0
        for target in targets:
            if not self.probes.busy(target):
                self.run_worker(self._probe(target), name=f"probe {target.name}", group="probe")
                started += 1
        if not started:
            self.notify("a probe is already running on this engine" if len(targets) == 1 else
                        "a probe is already running on every engine", severity="warning")

    # ---- sweep and A/B -----------------------------------------------------------------------
    def action_sweep(self) -> None:
        if self._ab_measuring():
            return
        self.push_screen(SweepScreen([s.target for s in self.slots], self.probes, self.config.sweep))

    def action_ab(self) -> None:
        from tui.ui.screens.ab import ABScreen, dashboard_arm, start_dashboard_ab

        run = self.ab_run
        if isinstance(self.screen, ABScreen):
            return  # already showing it
        if run is not None and not run.done:
            self.push_screen(ABScreen(run))  # `a` again shows the run in progress, never starts a second
            return
        if len(self.slots) < 2:
            self.notify(f"A/B needs at least two engines on screen (or `{command()} ab PROFILE_A PROFILE_B`)",
                        severity="warning")
            return
        arms = [dashboard_arm(s.target, s.profile, s.manager.current if s.manager else None)
                for s in self.slots]
        run = self.ab_run = start_dashboard_ab(arms, self.config.ab, self.store, self.config.gpu_interval_s)

        async def tell_when_done() -> None:
            while not run.done:
                await asyncio.sleep(0.5)
            comparisons = (run.result or {}).get("analysis", {}).get("comparisons", [])
            self.record_event("ab", None, {"summary": run.summary(), "error": run.error, "verdicts": [
                {"pair": f"{c['other']} / {c['base']}", "verdict": c["verdict"],
                 "decode_ratio": c["decode_tps"]["ratio"], "ci_low": c["decode_tps"]["ci_low"],
                 "ci_high": c["decode_tps"]["ci_high"]} for c in comparisons]})
            self.notify(run.summary(), title="A/B", severity="error" if run.error else "information",
                        timeout=30)

        self.run_worker(tell_when_done(), name="A/B", group="ab")
        self.push_screen(ABScreen(run))
