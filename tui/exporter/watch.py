"""The exporter's view of each engine's own figures: polled now and then (tui.sources.engine_source, its
configuration read as the dashboard reads it), fed to a store, and judged into findings (tui.findings), which
ProbeMetrics serves as `enginetop_finding{engine,id,severity}` beside the engine's speculative acceptance.
While an engine is down, or cannot be read, neither is served: they were of a run that is over (an engine
up but unread keeps the series of a proxy in front of it: they are of its answers, not of a reading).

This machine's GPUs and host (the CPU packages' RAPL counter) are read into the same store at each round, so
each engine's joules per generated token is served (`enginetop_joules_per_token{engine,scope}`) beside every
device's energy counter (`enginetop_energy_joules_total{device,vendor}`).

A separate `enginetop proxy` read with `traffic` (its URL) adds the per-request series of an engine that
publishes none (llama.cpp): finish reasons, lengths, prefill/decode/end to end, as the answers said them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tui.exporter.metrics import ProbeMetrics
from tui.live.engine_state import relayed
from tui.live.store import Store
from tui.model.samples import EngineStats
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.proxy.source import RemoteTraffic
from tui.sources.engine_source import EngineSource, LocalPids
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler

log = logging.getLogger(__name__)


async def watch_engines(targets: Sequence[EngineTarget], metrics: ProbeMetrics, every_s: float,
                        gpu: GpuSampler | None = None, host: HostSampler | None = None,
                        traffic: Sequence[str] = ()) -> None:
    """Read every engine (and this machine's GPUs and host) each `every_s` seconds, until cancelled."""
    transports = Transports()
    store = Store()
    sources = [EngineSource(t, transports, interval_s=every_s, timeout_s=5.0) for t in targets]
    gpu = gpu if gpu is not None else GpuSampler()
    host = host if host is not None else HostSampler()
    pids = LocalPids(list(targets))
    proxies = [RemoteTraffic(url, timeout_s=min(5.0, every_s)) for url in traffic]

    def machine() -> None:
        sample = host.sample(pids())
        store.add(sample)
        store.add(gpu.sample({m.engine: set(m.pids) for m in sample.engines}))

    try:
        while True:
            try:
                await asyncio.to_thread(machine)
                metrics.devices(store.gpu, store.host)
            except Exception as exc:  # the machine's figures are extra: the engines' go on without them
                log.warning("reading this machine's GPUs and host failed: %r", exc)
            for proxy in proxies:  # first: the engines' stats then carry the proxy's per-request figures
                for answers in await proxy.read():
                    store.add(answers)
            read = await asyncio.gather(*(s.read() for s in sources), return_exceptions=True)
            for target, samples in zip(targets, read, strict=True):
                if isinstance(samples, BaseException):
                    log.warning("reading %s's figures failed: %r", target.name, samples)
                    metrics.gone(target.name)
                    continue
                for sample in samples:
                    store.add(sample)
                state = store.engines.get(target.name)
                if state is None or state.sample is None:
                    metrics.gone(target.name)
                elif state.sample.health != "up":
                    # down: what it was last found to be is of a run that is over, so nothing of it is served
                    metrics.gone(target.name)
                elif state.sample.reading is None:
                    # nothing read this time (llama-server with neither --metrics nor /slots): what it was
                    # last found to be is of an earlier reading, but the proxy's requests are not of one
                    metrics.engine(target.name, (), EngineStats(requests=relayed(state)))
                else:
                    metrics.engine(target.name, state.findings, state.stats)
                if state is not None and state.sample is not None and state.sample.health == "up":
                    metrics.placement(target.name, state.container, state.cgroup, state.cgroup_use)
            await asyncio.sleep(every_s)
    finally:
        for source in sources:
            await source.aclose()  # a llama-server's slot watch, a router's event stream
        for proxy in proxies:
            await proxy.aclose()
        await transports.aclose()
        await asyncio.to_thread(gpu.close)
