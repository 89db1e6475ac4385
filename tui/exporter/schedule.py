"""When the exporter probes: every workload once per `every_s` on every engine, spread out and jittered.

One loop per engine, and each loop awaits its probe before it sleeps: two probes never overlap on one
engine (ProbeRunner refuses it too). Within a round an engine's workloads are `every_s / len(workloads)`
apart; engines start staggered across the first interval, so N engines are not all probed at one instant
and an engine shared by several names (or GPUs shared by engines) does not see a burst. Each gap is
jittered by ±`jitter` so the engines' schedules do not lock into step with each other or with a scrape.
A probe slower than its slot pushes the next one back: the spacing is a floor, never a queue.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tui.base.defaults import WORKLOADS
from tui.model.targets import EngineTarget
from tui.probe.results import ProbeResult
from tui.probe.runner import ProbeBusy, ProbeRunner
from tui.probe.workloads import WorkloadParams

log = logging.getLogger(__name__)

# Breathing room after a probe that overran its slot, so a slow engine is not probed back to back.
MIN_GAP_S = 0.5


def parse_workloads(text: str) -> tuple[str, ...]:
    """`short,agent` -> ("short", "agent"); an unknown or repeated name is a ValueError saying what exists."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError(f"--workload: give at least one of {', '.join(WORKLOADS)}")
    for name in names:
        if name not in WORKLOADS:
            raise ValueError(f"--workload: unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"--workload {text!r}: a workload is named twice")
    return names


@dataclass(frozen=True, slots=True)
class Schedule:
    every_s: float = 30.0  # each workload on each engine once per this many seconds
    workloads: tuple[str, ...] = ("short",)
    jitter: float = 0.1  # each gap is scaled by a uniform factor in [1 - jitter, 1 + jitter]
    agent_turns: int = 3  # the agent workload's conversation length: turn 2 on measures the prefix cache
    params: WorkloadParams = field(default_factory=WorkloadParams)
    rounds: int | None = None  # stop probing after this many rounds (the server keeps serving); None: never

    def __post_init__(self) -> None:
        if not self.every_s > 0:
            raise ValueError(f"--probe-every must be a positive number of seconds, got {self.every_s:g}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"--jitter must be in [0, 1), got {self.jitter:g}")
        if self.agent_turns < 1:
            raise ValueError(f"--agent-turns must be at least 1, got {self.agent_turns}")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")

    @property
    def slot_s(self) -> float:
        return self.every_s / len(self.workloads)


class ProbeScheduler:
    def __init__(self, targets: Sequence[EngineTarget], schedule: Schedule,
                 on_result: Callable[[ProbeResult], None], runner: ProbeRunner | None = None,
                 rng: random.Random | None = None) -> None:
        self.targets = list(targets)
        self.schedule = schedule
        self.on_result = on_result
        self.runner = runner or ProbeRunner()
        self.rng = rng or random.Random()

    def _gap(self, base: float) -> float:
        j = self.schedule.jitter
        return base * self.rng.uniform(1 - j, 1 + j)

    async def run(self) -> None:
        """Probe until cancelled (or `rounds` are done on every engine)."""
        try:
            async with asyncio.TaskGroup() as group:
                for i, target in enumerate(self.targets):
                    group.create_task(self._engine(i, target), name=f"probe {target.name}")
        finally:
            await self.runner.aclose()

    async def _engine(self, i: int, target: EngineTarget) -> None:
        schedule = self.schedule
        await asyncio.sleep(self._gap(schedule.slot_s * i / max(1, len(self.targets))))
        done = 0
        while schedule.rounds is None or done < schedule.rounds:
            for workload in schedule.workloads:
                started = time.monotonic()
                await self._probe(target, workload)
                spent = time.monotonic() - started
                await asyncio.sleep(max(self._gap(schedule.slot_s) - spent, MIN_GAP_S))
            done += 1

    async def _probe(self, target: EngineTarget, workload: str) -> None:
        repeat = self.schedule.agent_turns if workload == "agent" else 1
        try:
            await self.runner.probe(target, workload, self.schedule.params, repeat, on_result=self.on_result)
        except ProbeBusy:
            # Two names for one URL: their loops would overlap on one engine. Skip rather than stack.
            log.warning("%s: skipped a %s probe, another is running on the same URL", target.name, workload)
        except Exception:
            # A bug must not stop the other engines' probes or the server: log it and go on.
            log.exception("%s: %s probe crashed", target.name, workload)
