"""Concurrency sweep: hold N parallel streams at each level; report aggregate and per-stream rates.

The client measures itself while it does so (its CPU time, and how late a 10 ms ticker wakes on its event
loop): a client that is busy or late reports arrival times that are late too, and the result says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from tui.base.defaults import DEFAULT_LEVELS, SWEEP_WORKLOADS
from tui.base.stats import median, quantile
from tui.net.policy import public_url
from tui.probe.client import ProbeClient, ProbeTarget
from tui.probe.results import ProbeResult, token_source_of
from tui.probe.workloads import WorkloadParams, request_body
from tui.sources.host import CpuMeter

# When the client itself is this busy or this late, its figures may describe the client, not the engine.
CPU_SHARE_LIMIT = 0.8  # of one core: the event loop runs on one
LAG_P99_LIMIT_MS = 10.0
HOST_BUSY_PERCENT = 90.0


def parse_levels(text: str, flag: str = "--levels") -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); a ValueError naming `flag` for anything else."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated whole numbers, e.g. 1,2,4") from None
    if not levels or any(n < 1 for n in levels):
        raise ValueError(f"{flag} {text!r}: stream counts must be 1 or more")
    return levels


@dataclass(frozen=True, slots=True)
class SweepConfig:
    levels: tuple[int, ...] = DEFAULT_LEVELS
    duration_s: float | None = 10.0  # per level: start no new request after this
    requests_per_stream: int | None = None  # per level and stream; when set, it replaces duration_s
    workload: str = "short"
    params: WorkloadParams = field(default_factory=lambda: WorkloadParams(max_tokens=64))
    lag_interval_s: float = 0.01

    def __post_init__(self) -> None:
        if not self.levels or any(n < 1 for n in self.levels):
            raise ValueError(f"sweep levels must be positive stream counts, got {self.levels}")
        if self.requests_per_stream is None and (self.duration_s is None or self.duration_s <= 0):
            raise ValueError("a sweep level needs a positive duration or a request count")
        if self.requests_per_stream is not None and self.requests_per_stream < 1:
            raise ValueError(f"requests per stream must be at least 1, got {self.requests_per_stream}")
        if self.workload not in SWEEP_WORKLOADS:
            raise ValueError(
                f"sweep workload must be one of {', '.join(SWEEP_WORKLOADS)}, got {self.workload!r}"
            )


@dataclass(frozen=True, slots=True)
class ClientLoad:
    """How busy and how late the probing process was during one level."""

    wall_s: float
    cpu_s: float  # this process, all threads
    loop_lag_p50_ms: float | None
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    host_cpu_percent: float | None  # all cores, everyone

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def bottleneck(self) -> bool:
        lag = self.loop_lag_p99_ms
        return self.cpu_share >= CPU_SHARE_LIMIT or (lag is not None and lag >= LAG_P99_LIMIT_MS)

    @property
    def notes(self) -> tuple[str, ...]:
        notes = []
        if self.cpu_share >= CPU_SHARE_LIMIT:
            notes.append(f"the client used {self.cpu_share:.0%} of a core: it may be the bottleneck")
        if self.loop_lag_p99_ms is not None and self.loop_lag_p99_ms >= LAG_P99_LIMIT_MS:
            notes.append(
                f"the client's event loop ran up to {self.loop_lag_p99_ms:.0f} ms late (p99): "
                "arrival times are late by as much"
            )
        if self.host_cpu_percent is not None and self.host_cpu_percent >= HOST_BUSY_PERCENT:
            notes.append(
                f"host CPUs were {self.host_cpu_percent:.0f}% busy: client and engine compete for cores"
            )
        return tuple(notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "cpu_share": self.cpu_share,
            "loop_lag_p50_ms": self.loop_lag_p50_ms,
            "loop_lag_p99_ms": self.loop_lag_p99_ms,
            "loop_lag_max_ms": self.loop_lag_max_ms,
            "host_cpu_percent": self.host_cpu_percent,
            "bottleneck": self.bottleneck,
            "notes": list(self.notes),
        }


class SelfMonitor:
    """`async with SelfMonitor() as mon: ...` then `mon.load`: the client's own CPU and loop lag."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self.load: ClientLoad | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._lags.append(max(0.0, loop.time() - due))

    async def __aenter__(self) -> SelfMonitor:
        self._wall0 = time.monotonic()
        self._cpu0 = time.process_time()
        self._host = CpuMeter()
        self._task = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        host_pct = self._host.percent()
        lags_ms = [lag * 1000 for lag in self._lags]
        self.load = ClientLoad(
            wall_s=time.monotonic() - self._wall0,
            cpu_s=time.process_time() - self._cpu0,
            loop_lag_p50_ms=median(lags_ms),
            loop_lag_p99_ms=quantile(lags_ms, 0.99),
            loop_lag_max_ms=max(lags_ms) if lags_ms else None,
            host_cpu_percent=host_pct,
        )


@dataclass(frozen=True, slots=True)
class LevelResult:
    level: int  # parallel streams
    requests: int
    ok: int
    wall_s: float  # level start -> last request end
    completion_tokens: int  # of successful requests
    aggregate_tps: float | None  # completion tokens / wall
    per_stream_tps_p50: float | None  # median per-request decode tok/s
    per_stream_tps_p10: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    token_source: str | None  # "server", "chunks" (estimated), "mixed"
    client: ClientLoad
    errors: tuple[str, ...]  # distinct, first few
    results: tuple[ProbeResult, ...] = field(default=(), repr=False)

    @property
    def failed(self) -> int:
        return self.requests - self.ok

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "level",
            "level": self.level,
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.failed,
            "error_texts": list(self.errors),
            "wall_s": self.wall_s,
            "completion_tokens": self.completion_tokens,
            "aggregate_tps": self.aggregate_tps,
            "per_stream_tps_p50": self.per_stream_tps_p50,
            "per_stream_tps_p10": self.per_stream_tps_p10,
            "ttft_s_p50": self.ttft_p50_s,
            "ttft_s_p90": self.ttft_p90_s,
            "token_source": self.token_source,
            "estimated_from_chunks": self.token_source in ("chunks", "mixed"),
            "client": self.client.to_json(),
        }


@dataclass(frozen=True, slots=True)
class SweepResult:
    engine: str
    url: str
    workload: str
    levels: tuple[LevelResult, ...]

    @property
    def requests(self) -> int:
        return sum(lv.requests for lv in self.levels)

    @property
    def ok(self) -> int:
        return sum(lv.ok for lv in self.levels)

    def to_json(self) -> dict[str, Any]:
        best = max(self.levels, key=lambda lv: lv.aggregate_tps or 0.0, default=None)
        return {
            "type": "sweep_summary",
            "engine": self.engine,
            "url": self.url,
            "workload": self.workload,
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.requests - self.ok,
            "best_level": best.level if best is not None and best.aggregate_tps else None,
            "best_aggregate_tps": best.aggregate_tps if best is not None else None,
            "client_bottleneck_levels": [lv.level for lv in self.levels if lv.client.bottleneck],
        }


def _summarise_level(level: int, started: float, results: list[ProbeResult], load: ClientLoad) -> LevelResult:
    good = [r for r in results if r.ok]
    ends = [r.ended_at for r in results if r.ended_at is not None]
    wall = (max(ends) - started) if ends else load.wall_s
    tokens = sum(r.completion_tokens or 0 for r in good)
    errors: list[str] = []
    for r in results:
        if r.error is not None and r.error not in errors and len(errors) < 5:
            errors.append(r.error)
    return LevelResult(
        level=level,
        requests=len(results),
        ok=len(good),
        wall_s=wall,
        completion_tokens=tokens,
        aggregate_tps=tokens / wall if good and wall > 0 else None,
        per_stream_tps_p50=median(r.decode_tps for r in good),
        per_stream_tps_p10=quantile((r.decode_tps for r in good), 0.1),
        ttft_p50_s=median(r.ttft_s for r in good),
        ttft_p90_s=quantile((r.ttft_s for r in good), 0.9),
        token_source=token_source_of(good),
        client=load,
        errors=tuple(errors),
        results=tuple(results),
    )


async def _run_level(
    client: ProbeClient, target: ProbeTarget, config: SweepConfig, level: int, first_index: int
) -> LevelResult:
    results: list[ProbeResult] = []
    next_index = first_index

    async def stream() -> None:
        nonlocal next_index
        done = 0
        while True:
            if config.requests_per_stream is not None:
                if done >= config.requests_per_stream:
                    return
            elif time.monotonic() >= deadline:
                return
            index = next_index  # distinct seeds across streams and levels: no prompt-cache repeats
            next_index += 1
            body = request_body(config.workload, config.params, index)
            results.append(await client.chat(target, body, workload=config.workload, index=index))
            done += 1

    async with SelfMonitor(config.lag_interval_s) as monitor:
        started = time.monotonic()
        deadline = started + (config.duration_s or 0.0)
        async with asyncio.TaskGroup() as group:
            for _ in range(level):
                group.create_task(stream())
    assert monitor.load is not None
    return _summarise_level(level, started, results, monitor.load)


async def iter_sweep(
    client: ProbeClient, target: ProbeTarget, config: SweepConfig
) -> AsyncIterator[LevelResult]:
    """Run the levels in order, yielding each level's result as soon as it is done."""
    index = 0
    for level in config.levels:
        result = await _run_level(client, target, config, level, index)
        index += result.requests
        yield result


async def run_sweep(
    client: ProbeClient,
    target: ProbeTarget,
    config: SweepConfig,
    on_level: Callable[[LevelResult], None] | None = None,
) -> SweepResult:
    levels: list[LevelResult] = []
    async for level in iter_sweep(client, target, config):
        levels.append(level)
        if on_level is not None:
            on_level(level)
    return SweepResult(engine=target.name, url=public_url(target.url), workload=config.workload,
                       levels=tuple(levels))
