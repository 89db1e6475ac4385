"""The exporter's view of each engine's own figures: polled now and then (tui.sources.engine_source, its
configuration read as the dashboard reads it), fed to a store, and judged into findings (tui.findings), which
ProbeMetrics serves as `enginetop_finding{engine,id,severity}` beside the engine's speculative acceptance."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tui.exporter.metrics import ProbeMetrics
from tui.live.store import Store
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
            for samples in await asyncio.gather(*(s.read() for s in sources), return_exceptions=True):
                if isinstance(samples, BaseException):
                    log.warning("reading an engine's figures failed: %r", samples)
                    continue
                for sample in samples:
                    store.add(sample)
            for target in targets:
                state = store.engines.get(target.name)
                if state is not None:
                    metrics.engine(target.name, state.findings, state.stats)
            await asyncio.sleep(every_s)
    finally:
        await transports.aclose()
