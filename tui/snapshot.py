"""`enginetop snapshot`: two readings of every source, `interval` apart, as one JSON object."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from tui.sources.engine import EngineTarget, poll_engine
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.sources.keepalive import Transports
from tui.sources.rates import derive
from tui.sources.samples import EngineSample, EngineStats

EXIT_ENGINE_DOWN = 3


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


async def take_snapshot(targets: list[EngineTarget], interval: float = 1.0, timeout: float = 2.0,
                        gpu: GpuSampler | None = None, host: HostSampler | None = None) -> dict[str, Any]:
    gpu = gpu or GpuSampler()
    host = host or HostSampler()
    transports = Transports()

    async def poll_all() -> list[EngineSample]:
        polls = (poll_engine(transports.for_url(t.url), t, timeout=timeout) for t in targets)
        return await asyncio.gather(*polls)

    try:
        host.sample({})  # primes the host's CPU meter so the second reading is a real percentage
        started = time.monotonic()
        first = await poll_all()
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
        second = await poll_all()
    finally:
        await transports.aclose()
    gpu_report = await asyncio.to_thread(gpu.sample, {})
    host_sample = await asyncio.to_thread(host.sample, {})
    return {
        "engines": {a.name: engine_json(a, b) for a, b in zip(first, second, strict=True)},
        "gpus": [dataclasses.asdict(g) for g in gpu_report.gpus],
        "gpu_unavailable": gpu_report.unavailable,
        "driver_version": gpu_report.driver_version,
        "host": dataclasses.asdict(host_sample),
    }


def any_engine_down(snapshot: dict[str, Any]) -> bool:
    return any(e["health"] == "down" for e in snapshot["engines"].values())
