"""`enginetop snapshot --prometheus URL [--dcgm URL] --json`: the fleet as today's snapshot prints engines:
"engines" keyed by engine name with today's keys plus job, instance and host (figures over Prometheus' own
rate window, which `interval_s` gives), "gpus" a list with today's GPU keys plus host."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from tui.fleet.options import FleetOptions, make_sources
from tui.fleet.source import FleetSource
from tui.snapshot import take_snapshot
from tui.sources.engine import EngineTarget
from tui.sources.host import HostSampler
from tui.sources.samples import EngineSample, EngineStats, GpuReport


def _seconds(window: str) -> float:
    return float(window.rstrip("s"))


def fleet_engine_json(s: EngineSample, source: FleetSource) -> dict[str, Any]:
    r = s.reading
    out: dict[str, Any] = {
        "url": s.url, "dialect": source.engines.get(s.name, (None, None))[1], "health": s.health,
        "health_reason": s.health_reason, "metrics_error": s.metrics_error, "model": s.model,
        "running": r.running if r else None, "waiting": r.waiting if r else None,
        "kv_cache_usage": r.kv_cache_usage if r else None,
        "prompt_tokens_processed_total": r.prompt_tokens_processed_total if r else None,
        "prompt_tokens_computed_total": None, "prompt_tokens_cached_total": None,
        "generation_tokens_total": r.generation_tokens_total if r else None,
        "interval_s": _seconds(source.queries.windows.rate),
    }
    out.update(dataclasses.asdict(s.stats or EngineStats()))
    out.update({"job": s.job, "instance": s.instance, "host": s.host, "labels": dict(s.labels),
                "stale": s.stale, "alerts": list(s.alerts)})
    return out


async def take_fleet_snapshot(options: FleetOptions, targets: list[EngineTarget], interval: float = 1.0,
                              timeout: float = 2.0) -> dict[str, Any]:
    sources = make_sources(options, lambda: report)
    report: GpuReport | None = None
    try:
        if targets:
            out = await take_snapshot(targets, interval=interval, timeout=timeout)
        else:
            host = HostSampler()
            host.sample({})
            time.sleep(min(interval, 0.2))  # the CPU meter needs two readings
            out = {"engines": {}, "gpus": [], "gpu_unavailable": None, "driver_version": None,
                   "host": dataclasses.asdict(host.sample({}))}
        errors = []
        if sources.gpus is not None:
            [report] = await sources.gpus.read()
            out["gpus"] = [dataclasses.asdict(g) for g in report.gpus]
            out["gpu_unavailable"] = report.unavailable
            out["driver_version"] = None
            if sources.gpus.error:
                errors.append(sources.gpus.error)
        if sources.engines is not None:
            samples = await sources.engines.read()
            if sources.engines.error:
                errors.append(sources.engines.error)
            out["engines"].update({s.name: fleet_engine_json(s, sources.engines) for s in samples})
            out["prometheus"] = sources.client.shown if sources.client else None
        out["error"] = "; ".join(errors) or None
        return out
    finally:
        await sources.aclose()
