"""The async API for the dashboard: one probe (or sweep) at a time per engine, cancellable.

Use from a Textual worker (an asyncio task):

    runner = ProbeRunner()
    results = await runner.probe(target, "short", repeat=5, on_result=post)  # post sees each one
    sweep = await runner.sweep(target, SweepConfig(levels=(1, 2, 4)), on_level=...)

Cancelling the worker's task stops the request in flight; its connection is closed. A second probe on a
busy engine raises `ProbeBusy` at once instead of queueing behind the first.

Every call sends prompts no earlier call sent, even when given the same WorkloadParams again (the
dashboard probes with the same params and request index 0 each time): the call's number is appended to
the params' nonce, which every prompt's first word is hashed from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import Callable

from tui.model.samples import PromptProgress
from tui.probe.client import ProbeClient, ProbeLimits, ProbeTarget
from tui.probe.results import ProbeResult
from tui.probe.sweep import LevelResult, SweepConfig, SweepResult, run_sweep
from tui.probe.workloads import WorkloadParams, run_workload


class ProbeBusy(RuntimeError):
    """A probe is already running against this engine."""


class ProbeRunner:
    def __init__(self, limits: ProbeLimits | None = None) -> None:
        self._limits = limits
        self._client: ProbeClient | None = None
        self._active: dict[str, asyncio.Task[object]] = {}
        self._calls = itertools.count()

    def _key(self, target: ProbeTarget) -> str:
        return target.url.rstrip("/")

    def busy(self, target: ProbeTarget) -> bool:
        return self._key(target) in self._active

    def _claim(self, target: ProbeTarget) -> str:
        key = self._key(target)
        if key in self._active:
            raise ProbeBusy(f"a probe is already running on {target.name}")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("ProbeRunner must be used from an asyncio task")
        self._active[key] = task
        if self._client is None:
            # Created lazily inside the running loop that will use it.
            self._client = ProbeClient(self._limits)
        return key

    async def probe(
        self,
        target: ProbeTarget,
        workload: str = "short",
        params: WorkloadParams | None = None,
        repeat: int = 1,
        on_result: Callable[[ProbeResult], None] | None = None,
        on_progress: Callable[[PromptProgress], None] | None = None,
    ) -> tuple[ProbeResult, ...]:
        """Run `repeat` requests (agent: turns) in order; `on_result` sees each one as it completes,
        `on_progress` a long prompt's prefill progress as it streams (llama-server)."""
        key = self._claim(target)
        results: list[ProbeResult] = []
        try:
            assert self._client is not None
            params = self._fresh(params or WorkloadParams(), target)
            workload_iter = run_workload(self._client, target, workload, params, repeat, on_progress)
            async with contextlib.aclosing(workload_iter):
                async for result in workload_iter:
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
        finally:
            self._active.pop(key, None)
        return tuple(results)

    async def sweep(
        self,
        target: ProbeTarget,
        config: SweepConfig | None = None,
        on_level: Callable[[LevelResult], None] | None = None,
    ) -> SweepResult:
        key = self._claim(target)
        try:
            assert self._client is not None
            config = config or SweepConfig()
            config = dataclasses.replace(config, params=self._fresh(config.params, target))
            return await run_sweep(self._client, target, config, on_level)
        finally:
            self._active.pop(key, None)

    def _fresh(self, params: WorkloadParams, target: ProbeTarget) -> WorkloadParams:
        """The params with this call's own nonce (no two calls of this runner share a prompt), naming the
        target's model when it has one (a router's)."""
        return dataclasses.replace(params, nonce=f"{params.nonce}.{next(self._calls)}",
                                   model=params.model or target.model)

    async def aclose(self) -> None:
        for task in list(self._active.values()):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
