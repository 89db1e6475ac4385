"""This machine's GPUs (NVML) and host (psutil) as one feed source: both block, so one thread hop a read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tui.model.samples import GpuReport, HostSample
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler


class MachineSource:
    """Reads the GPUs every `gpu_interval_s` and the host every `host_interval_s` (a multiple of the GPU
    interval in practice). The GPU panel maps GPU processes to engines through the process trees of the
    host sampler's walk, so the newest host sample is kept for the GPU reads between two host reads.
    `engine_pids` (called in the thread) says which PID is which engine's (or why none is: its port's holder
    is a tunnel or a forwarder). No `gpu`: the GPUs come from
    another source (dcgm-exporter, tui.fleet.dcgm)."""

    name = "GPU and host"

    def __init__(self, gpu: GpuSampler | None, host: HostSampler,
                 engine_pids: Callable[[], dict[str, int | str]], gpu_interval_s: float = 1.0,
                 host_interval_s: float = 2.0) -> None:
        self.gpu, self.host, self.engine_pids = gpu, host, engine_pids
        self.interval_s = min(gpu_interval_s, host_interval_s)
        self.gpu_interval_s, self.host_interval_s = gpu_interval_s, host_interval_s
        self._next_gpu = self._next_host = 0.0
        self._trees: HostSample | None = None

    async def read(self) -> list[HostSample | GpuReport]:
        now = time.monotonic()
        # a little early counts as due: the feed wakes on the shorter interval, never exactly on time
        gpu = self.gpu is not None and now >= self._next_gpu - 0.05
        host = now >= self._next_host - 0.05
        if gpu:
            self._next_gpu = now + self.gpu_interval_s
        if host:
            self._next_host = now + self.host_interval_s
        if not (gpu or host):
            return []
        return await asyncio.to_thread(self._sample, gpu, host)

    def _sample(self, gpu: bool, host: bool) -> list[HostSample | GpuReport]:
        samples: list[HostSample | GpuReport] = []
        if host:
            self._trees = self.host.sample(self.engine_pids())
            samples.append(self._trees)
        if gpu and self.gpu is not None:
            trees = self._trees
            pids = {m.engine: set(m.pids) for m in trees.engines} if trees else {}
            samples.append(self.gpu.sample(pids))
        return samples
