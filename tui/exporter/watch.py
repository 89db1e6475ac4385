"""The exporter's view of each engine's own figures: polled now and then (tui.sources.engine_source, its
configuration read as the dashboard reads it), fed to a store, and judged into findings (tui.findings), which
ProbeMetrics serves as `enginetop_finding{engine,id,severity}` beside the engine's speculative acceptance.
While an engine is down, or cannot be read, neither is served: they were of a run that is over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tui.exporter.metrics import ProbeMetrics
from tui.live.store import Store
from tui.model.samples import EngineStats
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_source import EngineSource

log = logging.getLogger(__name__)


async def watch_engines(targets: Sequence[EngineTarget], metrics: ProbeMetrics, every_s: float) -> None:
    """Read every engine each `every_s` seconds, until cancelled."""
    transports = Transports()
    store = Store()
    sources = [EngineSource(t, transports, interval_s=every_s, timeout_s=5.0) for t in targets]
    try:
        while True:
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
                elif state.sample.health != "up" or state.sample.reading is None:
                    # down (the store cleared what its last run showed), or its /metrics not read this time:
                    # the figures it keeps are of an earlier reading
                    metrics.engine(target.name, state.findings, EngineStats())
                else:
                    metrics.engine(target.name, state.findings, state.stats)
            await asyncio.sleep(every_s)
    finally:
        await transports.aclose()
