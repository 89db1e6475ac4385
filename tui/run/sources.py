"""The one place a run's sources are built from its options: the dashboard, `record`, `snapshot` and `web`
(through the dashboard it serves) all call `build_sources`, so each reads the same things the same way.

What reads the GPUs is decided here, once: this machine's NVML, unless dcgm-exporters (--dcgm, or those a
Prometheus scrapes) read them, so two GPU sources never write the same series. `nvml=True` asks for both
anyway (a local GPU beside remote ones is then the caller's explicit choice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tui.live.feed import Source
from tui.model.samples import GpuReport
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_source import EngineSource, LocalPids
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.sources.machine import MachineSource

# The proxy (aiohttp, ~10 MB), the fleet's clients and the bench runs' machinery are imported only by a run
# that has them (build_sources): a dashboard that watches engines never pays for them.
if TYPE_CHECKING:
    from tui.fleet.options import FleetOptions, FleetSources
    from tui.proxy.options import ProxyOptions
    from tui.proxy.server import TrafficProxy
    from tui.proxy.source import ProxyTraffic, RemoteTraffic
    from tui.workload.live import LiveRuns


@dataclass
class RunOptions:
    watched: list[EngineTarget] = field(default_factory=list)  # engines only looked at
    launched: list[EngineTarget] = field(default_factory=list)  # engines enginetop starts (profiles)
    fleet: FleetOptions | None = None  # Prometheus and/or dcgm-exporters
    proxy: ProxyOptions | None = None  # a traffic proxy in front of some of the engines, run by this process
    traffic: list[str] = field(default_factory=list)  # URLs of separate `enginetop proxy` processes to read
    bench_runs: bool = False  # bench and capacity runs on the engines, from their live files (the dashboard)
    nvml: bool | None = None  # None: this machine's NVML unless dcgm-exporters read the GPUs
    machine: bool = True  # GPU and host of this machine (the fleet table has no place for them)
    poll_interval_s: float = 1.0
    poll_timeout_s: float | None = None  # default: twice the interval, at most 2 s
    gpu_interval_s: float = 1.0
    host_interval_s: float = 2.0

    @property
    def reads_nvml(self) -> bool:
        if not self.machine:
            return False
        if self.nvml is not None:
            return self.nvml
        return self.fleet is None or not (self.fleet.dcgm or self.fleet.prometheus)


@dataclass
class RunSources:
    """What a run reads. `engines` are in the order of `watched` then `launched`."""

    engines: list[EngineSource]
    transports: Transports
    gpu: GpuSampler | None
    host: HostSampler | None
    machine: MachineSource | None
    fleet: FleetSources | None
    local_pids: LocalPids
    proxy: TrafficProxy | None = None
    traffic: list[ProxyTraffic | RemoteTraffic] = field(default_factory=list)
    runs: LiveRuns | None = None

    def all(self) -> list[Source]:
        sources: list[Source] = list(self.engines)
        if self.fleet is not None:
            sources.extend(self.fleet.all())
        if self.machine is not None:
            sources.append(self.machine)
        sources.extend(self.traffic)
        if self.runs is not None:
            sources.append(self.runs)
        return sources

    async def start(self) -> None:
        """What listens rather than polls: the proxy. When its address cannot be bound, ListenError, and the
        run goes on without it."""
        if self.proxy is not None:
            from tui.proxy.source import ProxyTraffic

            try:
                await self.proxy.start()
            except BaseException:
                self.proxy = None
                self.traffic = [s for s in self.traffic if not isinstance(s, ProxyTraffic)]
                raise

    async def aclose(self) -> None:
        for engine in self.engines:
            await engine.aclose()
        if self.proxy is not None:
            await self.proxy.stop()
        for source in self.traffic:
            if hasattr(source, "aclose"):  # a separate proxy's client (RemoteTraffic)
                await source.aclose()
        await self.transports.aclose()
        if self.fleet is not None:
            await self.fleet.aclose()
        if self.gpu is not None:
            await asyncio.to_thread(self.gpu.close)


def build_sources(options: RunOptions, *, gpu_report: Callable[[], GpuReport | None] = lambda: None,
                  engine_pids: Callable[[], dict[str, int | str]] | None = None,
                  gpu_sampler: Callable[[], GpuSampler] = GpuSampler,
                  host_sampler: Callable[[], HostSampler] = HostSampler) -> RunSources:
    """`gpu_report`: the newest local GPU report, for the fleet's engines on this machine. `engine_pids`:
    which PID serves which engine (called in the machine source's thread); by default the watched
    loopback engines found by their port."""
    transports = Transports()
    every = options.poll_interval_s
    timeout = options.poll_timeout_s
    engines = [EngineSource(t, transports, every, timeout_s=timeout) for t in options.watched]
    engines += [EngineSource(t, transports, every, launched_by_us=True, timeout_s=timeout)
                for t in options.launched]
    fleet = None
    if options.fleet is not None:
        from tui.fleet.options import make_sources

        fleet = make_sources(options.fleet, gpu_report, transports)
    local_pids = LocalPids(options.watched)
    gpu = gpu_sampler() if options.reads_nvml else None
    host = host_sampler() if options.machine else None
    machine = None
    if host is not None:
        machine = MachineSource(gpu, host, engine_pids or local_pids, options.gpu_interval_s,
                                options.host_interval_s)
    proxy: TrafficProxy | None = None
    traffic: list[ProxyTraffic | RemoteTraffic] = []
    if options.proxy or options.traffic:
        from tui.proxy.options import build_proxy
        from tui.proxy.source import ProxyTraffic, RemoteTraffic

        proxy = build_proxy(options.proxy, options.watched + options.launched) if options.proxy else None
        traffic = [ProxyTraffic(proxy, every)] if proxy is not None else []
        traffic += [RemoteTraffic(url, every) for url in options.traffic]
    runs: LiveRuns | None = None
    if options.bench_runs:
        from tui.workload.live import LiveRuns

        runs = LiveRuns(options.watched + options.launched, interval_s=every)
    return RunSources(engines, transports, gpu, host, machine, fleet, local_pids, proxy, traffic, runs)
