"""The one feed loop: each source on its own cadence, a slow or broken source holds up nobody, every sample
reaches the store and its listeners."""

from __future__ import annotations

import asyncio
import time

from waiting import until_async

from tui.live.feed import Feed
from tui.live.store import Store
from tui.model.events import ProbeEvent
from tui.model.samples import EngineSample, EngineStats, GpuReport


class Ticker:
    def __init__(self, name: str, interval_s: float, delay_s: float = 0.0, fail: bool = False) -> None:
        self.name, self.interval_s, self.delay_s, self.fail = name, interval_s, delay_s, fail
        self.reads = 0

    async def read(self) -> list[EngineSample | GpuReport]:
        self.reads += 1
        if self.fail:
            raise RuntimeError(f"{self.name} is broken")
        await asyncio.sleep(self.delay_s)
        now = time.monotonic()
        if self.name == "gpu":
            return [GpuReport(t=now)]
        return [EngineSample(name=self.name, url="http://x", t=now, wall=time.time(), health="up")]


async def test_sources_are_read_on_their_own_cadence_and_feed_the_store() -> None:
    store = Store()
    seen: list[object] = []
    store.listeners.append(seen.append)
    errors: list[tuple[str, str]] = []
    fast, slow, broken, gpu = Ticker("fast", 0.05), Ticker("slow", 0.05, delay_s=0.5), \
        Ticker("broken", 0.05, fail=True), Ticker("gpu", 0.1)
    feed = Feed(store, [fast, slow, broken, gpu], on_error=lambda name, e: errors.append((name, str(e))))
    task = asyncio.create_task(feed.run())
    # the slow source's first read takes 0.5 s: its second starts once that one ended, never before
    await until_async(lambda: slow.reads == 2, "the slow source's second read", timeout=10, every=0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert slow.reads == 2, slow.reads  # a read in flight is never stacked on: the first, then one more
    assert fast.reads >= 5, fast.reads  # not held up by the slow one (about 10 in those 0.5 s)
    assert 2 <= gpu.reads <= fast.reads // 2 + 1, (gpu.reads, fast.reads)  # its own cadence: half as often
    assert broken.reads >= 5 and errors and errors[0] == ("broken", "broken is broken")
    assert store.engines["fast"].sample is not None and store.gpu is not None
    assert "slow" in store.engines  # its first read ended within the time
    fed = sum(isinstance(s, EngineSample) and s.name == "fast" for s in seen)
    assert fed in (fast.reads - 1, fast.reads), (fed, fast.reads)  # the last read may be cut by the cancel

    store.add_probe("fast", "a result", t=1.0)
    assert seen[-1] == ProbeEvent("fast", 1.0, "a result")


def test_figures_a_source_computed_itself_are_shown_as_they_are() -> None:
    store = Store()
    stats = EngineStats(gen_tps=123.0, ttft_p50_s=0.05)
    state = store.add_engine_sample(EngineSample(name="e", url="http://x", t=5.0, wall=0.0, health="up",
                                                 stats=stats))
    assert state.stats is stats
    assert state.series["gen_tps"].points[-1] == (5.0, 123.0)
