"""How much of a workload one engine takes: the highest arrival rate at which its SLO attainment holds.

A search over levels, each a run of the workload's requests at one arrival rate (Poisson, constant or gamma
arrivals of its requests, or its own timeline compressed to that rate), long enough to mean something (at
least `level_s` seconds and `min_requests` requests). The rate doubles from `start_rate` while levels pass,
halves while they fail, then bisects between the highest pass and the lowest fail until they are within
`precision` of each other. A level ends early when it cannot pass (more requests already missed the SLO than
the attainment allows) or when the engine is over-saturated: requests in flight and TTFT both rising over
three windows running, a queue that only grows (Watch). Every level is kept: the curve (rate against
attainment, TTFT p90 and goodput) is part of the result.

Requests go out independently (a session's turns are not chained): the load is set by the rate alone.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from tui.base.stats import median, quantile
from tui.model.findings import Finding
from tui.model.samples import EngineSample
from tui.model.slo import Slo
from tui.model.targets import EngineTarget
from tui.model.workload import Workload
from tui.probe.client import ProbeLimits
from tui.probe.results import ProbeResult
from tui.sources.energy_meter import EnergyMeter
from tui.sources.engine_source import is_local
from tui.workload.bench import Bench, EngineRun
from tui.workload.evidence import run_findings
from tui.workload.prompts import PromptMaker
from tui.workload.schedule import Planned, ScheduleError, gaps, parse_arrival
from tui.workload.slo import met
from tui.workload.workers import WorkerBench, WorkerPool, make_bench

Stop = Literal["cannot pass", "over-saturated", "interrupted"]
_SEVERITY = {"error": 0, "warning": 1, "info": 2}
WINDOW_ARRIVALS = 8  # an over-saturation window holds at least this many arrivals at the level's rate
QUEUE_GROWTH = 3  # requests: how much the queue must grow over three windows to be called growing


@dataclass(frozen=True)
class Search:
    slo: Slo
    attainment: float = 0.95  # the share of requests that must meet every SLO term
    arrival: str = "poisson"  # poisson | constant | gamma:CV | trace (the workload's timeline, compressed)
    start_rate: float = 1.0
    level_s: float = 20.0
    min_requests: int = 20
    precision: float = 0.1  # stop when the lowest fail is within this share above the highest pass
    max_levels: int = 12
    min_rate: float = 0.01
    settle_s: float = 1.0  # between levels: what an ended level left in the engine drains
    window_s: float = 3.0  # over-saturation: in flight and TTFT compared window to window
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.attainment <= 1:
            raise ScheduleError(f"--attainment must be in (0, 1], got {self.attainment}")
        if not self.start_rate > 0:
            raise ScheduleError("--start-rate must be a positive number of requests per second")
        if not self.level_s > 0 or self.min_requests < 1:
            raise ScheduleError("--level-s must be positive and --min-requests at least 1")
        if not 0 < self.precision < 1:
            raise ScheduleError(f"--precision must be in (0, 1), got {self.precision}")
        if self.arrival != "trace":
            parse_arrival(self.arrival)


@dataclass(frozen=True)
class Level:
    rate: float  # asked, requests per second
    planned: int
    sent: int
    ok: int
    good: int  # met every SLO term
    duration_s: float
    achieved_rps: float | None  # sent / duration
    attainment: float | None  # good / sent
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    goodput_rps: float | None
    passed: bool
    stopped: Stop | None = None  # why the level ended before its plan did
    why: str | None = None
    # the machine's energy over the level and per generated token (tui.sources.energy.run_energy)
    energy_j: float | None = None
    joules_per_token: float | None = None
    energy_source: str | None = None
    energy_scope: str | None = None
    energy_note: str | None = None


@dataclass
class CapacityResult:
    engine: str
    url: str
    slo: str
    attainment: float
    arrival: str
    capacity_rps: float | None = None  # the highest rate that passed; None: none did
    levels: list[Level] = field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0

    def json(self) -> dict[str, Any]:
        return {**asdict(self), "levels": [asdict(x) for x in self.levels]}


def level_plan(workload: Workload, rate: float, search: Search, level: int) -> list[Planned]:
    """The requests of one level: the workload's requests in order (from the start again when it runs out),
    as many as `level_s` at `rate` asks for and at least `min_requests`, each at its arrival time."""
    requests = [replace(r, session_id=None, delay_ms=None) for r in workload.requests]
    if not requests:
        raise ScheduleError(f"{workload.path} has no requests")
    count = max(search.min_requests, math.ceil(rate * search.level_s))
    chosen = [requests[i % len(requests)] for i in range(count)]
    if search.arrival == "trace":
        stamps = [r.timestamp_ms for r in workload.requests]
        if any(s is None for s in stamps) or len(stamps) < 2:
            raise ScheduleError(f"{workload.path} has no timeline to compress (--arrival trace): give "
                                "--arrival poisson")
        times = [float(s or 0.0) / 1000.0 for s in stamps]
        span = times[-1] - times[0]
        natural = (len(times) - 1) / span if span > 0 else None
        if natural is None:
            raise ScheduleError(f"{workload.path}: every request has the same timestamp; give --arrival "
                                "poisson")
        scale = natural / rate  # the timeline compressed (or stretched) to `rate` on average
        laps = [(i // len(times)) * (span + 1.0 / natural) for i in range(count)]
        at = [laps[i] + (times[i % len(times)] - times[0]) for i in range(count)]
        return [Planned(i, r, t * scale) for i, (r, t) in enumerate(zip(chosen, at, strict=True))]
    kind, cv = parse_arrival(search.arrival)
    arrivals, t = [], 0.0
    for gap in gaps(rate, kind, cv, count, search.seed + level):
        arrivals.append(t)
        t += gap
    return [Planned(i, r, arrivals[i]) for i, r in enumerate(chosen)]


class Watch:
    """Ends a level early: when it can no longer pass, or when the engine is over-saturated: over three
    successive windows (each at least `window_s` and long enough for WINDOW_ARRIVALS arrivals) the mean
    number in flight and the TTFT both rose every time, the queue by at least QUEUE_GROWTH requests and the
    TTFT by half. Random arrivals make either one rise now and then; both, three windows running, is a queue
    that only grows."""

    def __init__(self, bench: Bench | WorkerBench, search: Search, planned: int, rate: float) -> None:
        self.bench = bench
        self.search = search
        self.planned = planned
        self.window_s = max(search.window_s, WINDOW_ARRIVALS / rate)
        self.points: list[tuple[float, int, float | None]] = []  # (t, in flight, TTFT signal)

    def verdict(self, now: float, started: float) -> tuple[Stop, str] | None:
        results = [r for _, r in self.bench.run.results]
        missed = sum(1 for r in results if not met(self.search.slo, r))
        allowed = math.floor((1 - self.search.attainment) * self.planned + 1e-9)
        if missed > allowed:
            return "cannot pass", (f"{missed} of {self.planned} requests already missed the SLO "
                                   f"(at most {allowed} may)")
        self.points.append((now, self.bench.in_flight, self._ttft(now)))
        w = self.window_s
        if now - started < 3 * w:
            return None
        windows = [[p for p in self.points if now - (k + 1) * w < p[0] <= now - k * w] for k in (2, 1, 0)]
        flights = [_mean([p[1] for p in window]) for window in windows]
        ttfts = [median([p[2] for p in window if p[2] is not None]) for window in windows]
        if any(f is None for f in flights) or any(t is None for t in ttfts):
            return None
        f1, f2, f3 = (float(f or 0.0) for f in flights)
        t1, t2, t3 = (float(t or 0.0) for t in ttfts)
        if f1 < f2 < f3 and f3 >= f1 + QUEUE_GROWTH and t1 < t2 < t3 and t3 >= 1.5 * t1:
            return "over-saturated", (f"in flight {f1:.1f} -> {f2:.1f} -> {f3:.1f} and TTFT "
                                      f"{t1 * 1000:.0f} -> {t2 * 1000:.0f} -> {t3 * 1000:.0f} ms over "
                                      f"{w:.0f} s windows")
        return None

    def _ttft(self, now: float) -> float | None:
        """The TTFT of the requests that got their first token in the last window; while none did, how long
        the oldest request in flight has been out (its TTFT, if it is still waiting)."""
        since = now - self.window_s
        ttfts = [r.ttft_s for _, r in self.bench.run.results
                 if r.ttft_s is not None and r.first_token_at is not None and r.first_token_at > since]
        if ttfts:
            return median(ttfts)
        return self.bench.oldest_wait_s(now)


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def level_of(rate: float, planned: int, run: EngineRun, search: Search, stopped: tuple[Stop, str] | None,
             ) -> Level:
    results = [r for _, r in run.results]
    sent = len(results)
    good = sum(1 for r in results if met(search.slo, r))
    ttfts = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    span = run.duration_s or None
    # a level ended early never passes; one that ran out its plan passes on its attainment over all of it
    attainment = good / sent if sent else None
    passed = stopped is None and attainment is not None and attainment >= search.attainment - 1e-9
    return Level(rate=rate, planned=planned, sent=sent, ok=sum(1 for r in results if r.ok), good=good,
                 duration_s=run.duration_s, achieved_rps=sent / span if span else None, attainment=attainment,
                 ttft_p50_s=quantile(ttfts, 0.5), ttft_p90_s=quantile(ttfts, 0.9),
                 goodput_rps=good / span if span else None, passed=passed,
                 stopped=stopped[0] if stopped else None, why=stopped[1] if stopped else None)


class Capacity:
    """One engine's search."""

    def __init__(self, target: EngineTarget, workload: Workload, search: Search, *, model: str | None = None,
                 limits: ProbeLimits | None = None, tokenizer: str | None = None,
                 on_level: Callable[[str, Level], None] | None = None,
                 on_bench: Callable[[Bench | WorkerBench, float], None] | None = None,
                 workers: int = 1, meter: Callable[[], EnergyMeter] | None = None) -> None:
        self.target = target
        self.workload = workload
        self.search = search
        self.model = model
        self.limits = limits
        self.tokenizer = tokenizer  # --tokenizer: read by each level's bench (each worker's own)
        self.pool = WorkerPool(workers) if workers > 1 else None  # --workers: one pool for every level
        self.on_level = on_level
        self.on_bench = on_bench  # told of each level's bench as it starts (the live view follows it)
        self.meter = meter  # the machine's energy over each level (None: not measured)
        self.result = CapacityResult(target.name, target.url, str(search.slo), search.attainment,
                                     search.arrival)
        self._prompts: PromptMaker | None = None
        self.sent: list[tuple[Planned, ProbeResult]] = []  # every level's requests
        self.max_in_flight = 0
        # Each level's own evidence, for its findings (`findings`): rate, requests, the most in flight at once
        self.level_sent: list[tuple[float, list[tuple[Planned, ProbeResult]], int]] = []

    async def run(self) -> CapacityResult:
        t0 = time.monotonic()
        try:
            await self._search()
        except Exception as exc:  # this engine's search ends with the levels it has; others go on
            self.result.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.pool is not None:
                await asyncio.to_thread(self.pool.close)
            self.result.duration_s = time.monotonic() - t0
            passed = [x.rate for x in self.result.levels if x.passed]
            self.result.capacity_rps = max(passed) if passed else None
        return self.result

    async def _search(self) -> None:
        s = self.search
        rate = s.start_rate
        best_pass: float | None = None
        low_fail: float | None = None
        for _ in range(s.max_levels):
            level = await self.level(rate)
            if level.sent == 0:
                raise RuntimeError(f"nothing was sent at {rate:g} req/s")
            if level.passed:
                best_pass = max(best_pass or 0.0, rate)
            else:
                low_fail = rate if low_fail is None else min(low_fail, rate)
            if best_pass is None:
                rate = (low_fail or rate) / 2
                if rate < s.min_rate:
                    return  # not even the lowest rate holds the SLO
            elif low_fail is None:
                rate = best_pass * 2
            elif low_fail <= best_pass * (1 + s.precision):
                return
            else:
                rate = math.sqrt(best_pass * low_fail)  # halfway on the log scale
            await asyncio.sleep(s.settle_s)

    async def level(self, rate: float) -> Level:
        planned = level_plan(self.workload, rate, self.search, len(self.result.levels))
        bench = make_bench(self.target, planned, self.pool, model=self.model,
                           block_size=self.workload.block_size, limits=self.limits, prompts=self._prompts,
                           prompt_seed=self.workload.prompt_seed, tokenizer=self.tokenizer)
        await bench.ready()
        self._prompts = bench.prompts
        watch = Watch(bench, self.search, len(planned), rate)
        if self.on_bench is not None:
            self.on_bench(bench, rate)
        meter = self.meter().__enter__() if self.meter is not None else None
        task = asyncio.ensure_future(bench.go())
        stopped: tuple[Stop, str] | None = None
        started = time.monotonic()
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.5)
                if not task.done() and (stopped := watch.verdict(time.monotonic(), started)) is not None:
                    task.cancel()
                    break
        except asyncio.CancelledError:  # Ctrl-C: the level so far is kept, marked
            task.cancel()
            stopped = ("interrupted", "the run was interrupted")
            await asyncio.gather(task, return_exceptions=True)
            self._keep(self._energy(level_of(rate, len(planned), bench.run, self.search, stopped), meter,
                                    bench.run))
            raise
        finally:  # whatever ended the level, its meter's thread stops with it
            if meter is not None:
                meter.close()
        await asyncio.gather(task, return_exceptions=True)
        self.sent += bench.run.results
        self.max_in_flight = max(self.max_in_flight, bench.max_in_flight)
        self.level_sent.append((rate, list(bench.run.results), bench.max_in_flight))
        return self._keep(self._energy(level_of(rate, len(planned), bench.run, self.search, stopped), meter,
                                       bench.run))

    def _energy(self, level: Level, meter: EnergyMeter | None, run: EngineRun) -> Level:
        """The level with what its generated tokens cost (the meter's energy over the level)."""
        if meter is None:
            return level
        meter.close()
        tokens = sum(r.completion_tokens or 0 for _, r in run.results if r.ok)
        got = meter.result(tokens, is_local(self.target.url))
        return replace(level, energy_j=got["energy_j"], joules_per_token=got["joules_per_token"],
                       energy_source=got["energy_source"], energy_scope=got["energy_scope"],
                       energy_note=got["energy_note"])

    def findings(self, block_size: int | None, before: EngineSample | None,
                 after: EngineSample | None) -> list[Finding]:
        """What the run revealed, each level judged on its own requests: its prompts' shared prefixes, its
        refusals, its TTFT against the engine's own time, its peak in flight. A level replays the workload
        from its start, so an earlier level's requests are neither its evidence nor the prefixes its prompts
        share, and what a slow level showed is not what a fast one did. The engine's configuration (read
        before the run) and its speculative counters (before and after it) are judged once, over the whole
        run. A finding that held at several levels is kept once: the most severe, at the highest rate; its
        title says the level, and its figures `level_rps`."""
        name = self.target.name
        if before is None:
            return []
        kept: dict[str, tuple[Finding, float | None]] = {
            f.id: (f, None) for f in run_findings(name, [], block_size, before, after)}
        for rate, sent, peak in self.level_sent:
            for f in run_findings(name, sent, block_size, before, None, peak):
                had = kept.get(f.id)
                if had is not None and (_SEVERITY[had[0].severity], -(had[1] or 0.0)) <= \
                        (_SEVERITY[f.severity], -rate):
                    continue
                kept[f.id] = (replace(f, title=f"at {rate:.3g} req/s: {f.title}",
                                      figures=(*f.figures, ("level_rps", rate))), rate)
        return sorted((f for f, _ in kept.values()), key=lambda f: _SEVERITY[f.severity])

    def _keep(self, level: Level) -> Level:
        self.result.levels.append(level)
        if self.on_level is not None:
            self.on_level(self.target.name, level)
        return level


def curve_table(results: list[CapacityResult]) -> str:
    """Per engine, its levels in the order run, and the capacity found."""
    lines = []
    for r in results:
        found = "none of the rates tried" if r.capacity_rps is None else f"{r.capacity_rps:.3g} req/s"
        lines.append(f"{r.engine}: capacity {found} at SLO {r.slo} met by >= {r.attainment * 100:g}% "
                     f"({r.arrival} arrivals)")
        lines.append(f"  {'rate':>8} {'sent':>6} {'achieved':>9} {'attained':>9} {'TTFT p90':>9} "
                     f"{'goodput':>8} {'J/token':>8}  verdict")
        for x in r.levels:
            att = "n/a" if x.attainment is None else f"{x.attainment * 100:.1f}%"
            p90 = "n/a" if x.ttft_p90_s is None else f"{x.ttft_p90_s * 1000:.0f} ms"
            ach = "n/a" if x.achieved_rps is None else f"{x.achieved_rps:.3g}"
            good = "n/a" if x.goodput_rps is None else f"{x.goodput_rps:.3g}"
            verdict = "pass" if x.passed else f"fail ({x.stopped}: {x.why})" if x.stopped else "fail"
            jpt = "n/a" if x.joules_per_token is None else f"{x.joules_per_token:.3g}"
            lines.append(f"  {x.rate:>8.3g} {x.sent:>6} {ach:>9} {att:>9} {p90:>9} {good:>8} {jpt:>8}  "
                         f"{verdict}")
        scopes = sorted({x.energy_scope for x in r.levels if x.energy_scope})
        if scopes:
            lines.append(f"  J/token: the energy of {', '.join(scopes)} over each level's generated tokens")
        if r.error:
            lines.append(f"  stopped: {r.error}")
    side = [f"{r.engine} {'n/a' if r.capacity_rps is None else f'{r.capacity_rps:.3g}'}" for r in results]
    lines.append("capacity (req/s): " + ", ".join(side))
    return "\n".join(lines)
