"""A bench or capacity run, live in the dashboard: the run writes its figures to a small file in the data
dir's live/ folder (rewritten whole, then renamed, twice a second), and any dashboard reads every such file
as a source: the engines it watches (matched by URL) show the run's progress and the live TTFT and ITL of its
requests, with the SLO. No flag on either side: start a dashboard, start a bench in another terminal.

A finished run's file stays, so its final figures are seen; the dashboard stops showing a run KEEP_S after
its last write, and each new run removes files older than a day.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import psutil

from tui.base.paths import live_dir
from tui.base.stats import quantile
from tui.model.bench import BenchProgress, BenchSample, RunState
from tui.model.slo import Slo
from tui.model.targets import EngineTarget
from tui.workload.slo import met

if TYPE_CHECKING:  # types only: the dashboard reads live files and never runs a bench itself
    from tui.workload.bench import Bench
    from tui.workload.workers import WorkerBench

WINDOW_S = 30.0  # the live figures: requests that ended in the last half minute
WRITE_S = 0.5
KEEP_S = 600.0  # a run's figures stay on the dashboard this long after its last write
PRUNE_S = 86400.0


@dataclass
class Shown:
    """One engine's part as the run shows it: its URL and the figures so far."""

    url: str
    progress: BenchProgress


def progress_of(bench: Bench | WorkerBench | None, command: str, workload: str, slo: Slo | None,
                state: RunState, planned: int, now: float, **extra: Any) -> BenchProgress:
    """The figures of a part: all its requests so far, the live ones of the last WINDOW_S."""
    results = [r for _, r in bench.run.results] if bench is not None else []
    recent = [r for r in results if r.ok and r.ended_at is not None and r.ended_at >= now - WINDOW_S]
    ttfts = sorted(r.ttft_s for r in recent if r.ttft_s is not None)
    gaps = sorted(g for r in recent for g in r.gaps_s)
    limit = slo.limits_ms.get("ttft") if slo is not None else None
    return BenchProgress(
        command=command, pid=os.getpid(), workload=workload, state=state, planned=planned,
        sent=bench.sent if bench is not None else 0, done=len(results), ok=sum(r.ok for r in results),
        errors=sum(not r.ok for r in results), in_flight=bench.in_flight if bench is not None else 0,
        window_s=WINDOW_S, ttft_p50_s=quantile(ttfts, 0.5), ttft_p90_s=quantile(ttfts, 0.9),
        itl_p50_s=quantile(gaps, 0.5), itl_p90_s=quantile(gaps, 0.9),
        slo=str(slo) if slo is not None else None, slo_ttft_s=limit / 1000.0 if limit else None,
        attainment=sum(met(slo, r) for r in results) / len(results) if slo is not None and results else None,
        note=bench.run.prompt_note if bench is not None else None, **extra)


class LiveFile:
    """Where one run writes its figures."""

    def __init__(self, command: str, directory: Path | None = None) -> None:
        self.directory = directory or live_dir()
        self.path = self.directory / f"{command}-{os.getpid()}.json"
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in self.directory.glob("*.json"):  # a day-old run is nobody's live view any more
            with contextlib.suppress(OSError):
                if time.time() - old.stat().st_mtime > PRUNE_S:
                    old.unlink()

    def write(self, shown: dict[str, Shown]) -> None:
        data = {"updated_wall": time.time(),
                "engines": [{"name": name, "url": s.url, "progress": asdict(s.progress)}
                            for name, s in shown.items()]}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(orjson.dumps(data))
        os.replace(tmp, self.path)

    async def keep_writing(self, snapshot: Callable[[], dict[str, Shown]]) -> None:
        """Write `snapshot()` every WRITE_S until cancelled, then once more (the final figures)."""
        try:
            while True:
                self.write(snapshot())
                await asyncio.sleep(WRITE_S)
        finally:
            with contextlib.suppress(OSError):
                self.write(snapshot())


def _key(url: str) -> str:
    return url.rstrip("/")


class LiveRuns:
    """Every run's live file, as BenchSamples for the engines this dashboard watches (by URL). The newest run
    on an engine wins; a run whose process is gone before it finished reads "failed".

    A run writes by renaming a whole file into the folder, so a folder whose mtime has not moved holds the
    same figures: it is read again only while a run shown is still going (its live TTFT is plotted every
    read, and its process may die without a last write). The store keeps each engine's last sample, so a
    read that finds nothing new returns nothing. A dashboard with no run to show then costs one stat a
    second, not a thread hop and a listing. (A rename in the clock tick of the change before it leaves the
    mtime as it was; a run writes every WRITE_S, so its next write shows.)"""

    def __init__(self, targets: list[EngineTarget], directory: Path | None = None,
                 interval_s: float = 1.0) -> None:
        self.names = {_key(t.url): t.name for t in targets}
        self.directory = directory or live_dir()
        self.interval_s = interval_s
        self.name = "bench runs"
        self._scanned: int | None = None  # the folder's mtime (ns) at the last scan that found no run going

    async def read(self) -> list[BenchSample]:
        try:
            mtime = self.directory.stat().st_mtime_ns  # one syscall on a local folder
        except OSError:
            return []  # no folder yet: no run has ever written here
        if mtime == self._scanned:
            return []
        samples = await asyncio.to_thread(self._scan)
        going = any(s.progress.state in ("preparing", "running") for s in samples)
        self._scanned = None if going else mtime
        return samples

    def _scan(self) -> list[BenchSample]:
        t, wall = time.monotonic(), time.time()
        newest: dict[str, BenchSample] = {}
        try:
            files = list(self.directory.glob("*.json"))
        except OSError:
            return []
        for path in files:
            try:
                if wall - path.stat().st_mtime > KEEP_S:
                    continue
                data = orjson.loads(path.read_bytes())
                updated = float(data["updated_wall"])
                for item in data["engines"]:
                    name = self.names.get(_key(str(item["url"])))
                    if name is None:
                        continue
                    progress = BenchProgress(**item["progress"])
                    if progress.state in ("preparing", "running") and not psutil.pid_exists(progress.pid):
                        progress = replace(progress, state="failed",
                                            error=f"the run (PID {progress.pid}) ended without finishing")
                    sample = BenchSample(name, str(item["url"]), t, wall, progress, updated)
                    if name not in newest or newest[name].updated_wall < updated:
                        newest[name] = sample
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a file being replaced, or from another version: the next read will do
        return list(newest.values())
