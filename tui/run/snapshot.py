"""`enginetop snapshot`: every source of the run read into one store, as one JSON object.

The sources are the run's own (tui.run.sources.build_sources): engines polled directly, this machine's
GPUs and host, and a fleet's Prometheus and dcgm-exporters, all feeding a Store as they feed the
dashboard's. Engines polled directly give rates over two readings `interval` apart; the fleet's over
Prometheus' own rate window. "gpus" are this machine's (NVML) unless dcgm-exporters read them, never both.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from tui.fleet.source import FleetSource
from tui.live.engine_state import EngineState
from tui.live.feed import Source
from tui.live.placement import container_words, limit_words
from tui.live.store import Store
from tui.model.samples import EngineSample, EngineStats
from tui.record.codec import encode
from tui.run.sources import RunOptions, build_sources
from tui.sources.config import config_json
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler


def engine_json(state: EngineState) -> dict[str, Any]:
    """An engine polled directly: its last reading, and the rates the store derived over the two."""
    sample = state.sample
    assert sample is not None
    reading = sample.reading
    out: dict[str, Any] = {
        "url": sample.url,
        "dialect": reading.dialect if reading else None,
        # where the figures came from when not /metrics ("/slots": a llama-server without --metrics)
        "origin": reading.origin if reading else None,
        "health": sample.health,
        "health_reason": sample.health_reason,
        "metrics_error": sample.metrics_error,
        "model": sample.model,
        "running": reading.running if reading else None,
        "waiting": reading.waiting if reading else None,
        "kv_cache_usage": reading.kv_cache_usage if reading else None,
        "prompt_tokens_processed_total": reading.prompt_tokens_processed_total if reading else None,
        "prompt_tokens_computed_total": reading.prompt_tokens_computed_total if reading else None,
        "prompt_tokens_cached_total": reading.prompt_tokens_cached_total if reading else None,
        "generation_tokens_total": reading.generation_tokens_total if reading else None,
        "interval_s": round(state.readings[-1][0] - state.readings[0][0], 3) if state.readings else 0.0,
        # llama-server: its slots; in router mode each model with its status (and a loaded one's figures)
        "slots": encode(sample.slots) if sample.slots is not None else None,
        "models": [encode(m) for m in sample.models] if sample.models is not None else None,
        # what the engine is really set to, and what that means for its traffic (tui.findings)
        "config": config_json(sample.config),
        "findings": [f.json() for f in state.findings],
        # where its processes run (tui.sources.port_holder): its container, what the container's cgroup
        # imposes and its counters over the interval, in the words the column shows; or what holds its port
        "container": encode(state.container) if state.container is not None else None,
        "cgroup": encode(state.cgroup) if state.cgroup is not None else None,
        "cgroup_use": encode(state.cgroup_use) if state.cgroup_use is not None else None,
        "placement": container_words(state.container, state.cgroup) if state.container is not None else None,
        "limits": limit_words(state.cgroup, state.cgroup_use)[0] if state.cgroup is not None else None,
        "port_held_by": state.port_note,
        "host_rss_bytes": state.rss_bytes,
    }
    out.update(dataclasses.asdict(state.stats))
    if state.traffic is not None:
        out["traffic"] = dataclasses.asdict(state.traffic.stats) | {"proxy_url": state.traffic.proxy_url,
                                                                    "error": state.traffic.error}
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


async def take_snapshot(options: RunOptions, interval: float = 1.0, *,
                        gpu_sampler: Callable[[], GpuSampler] = GpuSampler,
                        host_sampler: Callable[[], HostSampler] = HostSampler) -> dict[str, Any]:
    """Every source read into one store, twice `interval` apart (the fleet's once: Prometheus has its own
    rate window), and the store's engines, GPUs and host as JSON."""
    store = Store()
    # the engines' interval too: a llama-server's slots are watched while busy until the second reading,
    # which comes `interval` later (tui.sources.slot_watch stops when not read for a few intervals)
    run = build_sources(dataclasses.replace(options, machine=True, gpu_interval_s=interval,
                                            host_interval_s=interval, poll_interval_s=interval),
                        gpu_report=lambda: store.gpu, gpu_sampler=gpu_sampler, host_sampler=host_sampler)

    async def read(sources: list[Source]) -> None:
        for samples in await asyncio.gather(*(s.read() for s in sources)):
            for sample in samples:
                store.add(sample)

    # The machine first in each round, and alone. First: an engine's energy per token is attributed as its
    # reading is added (Store.add_engine_sample), against the host and GPU readings the store holds then. The
    # dashboard's feed polls on, so its next engine reading meets the newest host reading; a snapshot has two
    # rounds only, and with the engines added first their second readings met the host's first reading alone
    # ("CPU energy not read yet (two readings needed)") while the host's own window had two. Alone: a host
    # reading is timed before its process walk and RAPL read, and beside the engines' first polls (their
    # clients made, their replies parsed, in this thread) its RAPL read came tens of ms late in the first
    # round only: over one second, the package's watts read 5-10 % low.
    machine: list[Source] = [run.machine] if run.machine else []
    for engine in run.engines:  # known before the first host reading: it carries their containers' counters
        store.engine(engine.target.name, engine.target.url)
    try:
        started = asyncio.get_running_loop().time()
        await read(machine)  # the host's first reading primes its CPU meter
        await read(list(run.engines))
        await asyncio.sleep(max(0.0, interval - (asyncio.get_running_loop().time() - started)))
        await read(machine)
        await read([*run.engines, *run.traffic, *(run.fleet.all() if run.fleet else [])])
    finally:
        await run.aclose()
    names = {e.target.name for e in run.engines}
    engines = {name: engine_json(store.engines[name]) for name in names}
    gpu, host = store.gpu, store.host
    out: dict[str, Any] = {
        "engines": engines,
        "gpus": [dataclasses.asdict(g) for g in gpu.gpus] if gpu else [],
        "gpu_unavailable": gpu.unavailable if gpu else None,
        "driver_version": gpu.driver_version if gpu else None,
        "host": dataclasses.asdict(host) if host else None,
    }
    fleet = run.fleet
    if fleet is None:
        return out
    if fleet.engines is not None:
        engines.update({name: fleet_engine_json(state.sample, fleet.engines)
                        for name, state in store.engines.items() if name not in names and state.sample})
        out["prometheus"] = fleet.client.shown if fleet.client else None
    errors = [source.error for source in (fleet.gpus, fleet.engines) if source is not None and source.error]
    out["error"] = "; ".join(errors) or None
    return out


def any_engine_down(snapshot: dict[str, Any]) -> bool:
    return any(e["health"] == "down" for e in snapshot["engines"].values())
