"""`enginetop snapshot`: two readings of every source of the run, `interval` apart, as one JSON object.

The sources are the run's own (tui.run.sources.build_sources): engines polled directly, this machine's
GPUs and host, and a fleet's Prometheus and dcgm-exporters. Engines polled directly give rates over the
two readings; the fleet's over Prometheus' own rate window. "gpus" are this machine's (NVML) unless
dcgm-exporters read them, never both.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from tui.fleet.source import FleetSource
from tui.model.samples import EngineSample, EngineStats, GpuReport, HostSample
from tui.run.sources import RunOptions, build_sources
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.sources.rates import derive


def engine_json(first: EngineSample, second: EngineSample) -> dict[str, Any]:
    reading = second.reading
    stats = EngineStats()
    if first.reading is not None and reading is not None:
        stats = derive(first.reading, first.t, reading, second.t)
    out: dict[str, Any] = {
        "url": second.url,
        "dialect": reading.dialect if reading else None,
        "health": second.health,
        "health_reason": second.health_reason,
        "metrics_error": second.metrics_error,
        "model": second.model,
        "running": reading.running if reading else None,
        "waiting": reading.waiting if reading else None,
        "kv_cache_usage": reading.kv_cache_usage if reading else None,
        "prompt_tokens_processed_total": reading.prompt_tokens_processed_total if reading else None,
        "prompt_tokens_computed_total": reading.prompt_tokens_computed_total if reading else None,
        "prompt_tokens_cached_total": reading.prompt_tokens_cached_total if reading else None,
        "generation_tokens_total": reading.generation_tokens_total if reading else None,
        "interval_s": round(second.t - first.t, 3),
    }
    out.update(dataclasses.asdict(stats))
    return out


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
        "interval_s": float(source.queries.windows.rate.rstrip("s")),
    }
    out.update(dataclasses.asdict(s.stats or EngineStats()))
    out.update({"job": s.job, "instance": s.instance, "host": s.host, "labels": dict(s.labels),
                "stale": s.stale, "alerts": list(s.alerts)})
    return out


def _gpus_json(report: GpuReport | None) -> dict[str, Any]:
    if report is None:
        return {"gpus": [], "gpu_unavailable": None, "driver_version": None}
    return {"gpus": [dataclasses.asdict(g) for g in report.gpus], "gpu_unavailable": report.unavailable,
            "driver_version": report.driver_version}


async def take_snapshot(options: RunOptions, interval: float = 1.0, *,
                        gpu_sampler: Callable[[], GpuSampler] = GpuSampler,
                        host_sampler: Callable[[], HostSampler] = HostSampler) -> dict[str, Any]:
    gpu: GpuReport | None = None
    run = build_sources(dataclasses.replace(options, machine=True), gpu_report=lambda: gpu,
                        gpu_sampler=gpu_sampler, host_sampler=host_sampler)
    try:
        assert run.host is not None
        await asyncio.to_thread(run.host.sample, {})  # primes the CPU meter: the second reading is a real %
        started = asyncio.get_running_loop().time()
        first = await asyncio.gather(*(e.read() for e in run.engines))
        await asyncio.sleep(max(0.0, interval - (asyncio.get_running_loop().time() - started)))
        second = await asyncio.gather(*(e.read() for e in run.engines))
        host = await asyncio.to_thread(run.host.sample, run.local_pids())
        if run.gpu is not None:
            gpu = await asyncio.to_thread(run.gpu.sample, {})
        out: dict[str, Any] = {
            "engines": {e.target.name: engine_json(a[0], b[0])
                        for e, a, b in zip(run.engines, first, second, strict=True)},
            **_gpus_json(gpu),
            "host": dataclasses.asdict(host) if isinstance(host, HostSample) else None,
        }
        fleet = run.fleet
        if fleet is None:
            return out
        errors = []
        if fleet.gpus is not None:
            [gpu] = await fleet.gpus.read()
            out.update(_gpus_json(gpu), driver_version=None)
            if fleet.gpus.error:
                errors.append(fleet.gpus.error)
        if fleet.engines is not None:
            samples = await fleet.engines.read()
            if fleet.engines.error:
                errors.append(fleet.engines.error)
            out["engines"].update({s.name: fleet_engine_json(s, fleet.engines) for s in samples})
            out["prometheus"] = fleet.client.shown if fleet.client else None
        out["error"] = "; ".join(errors) or None
        return out
    finally:
        await run.aclose()


def any_engine_down(snapshot: dict[str, Any]) -> bool:
    return any(e["health"] == "down" for e in snapshot["engines"].values())
