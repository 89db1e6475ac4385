"""`enginetop record`: the dashboard's sources, feed and recorder without a screen, for unattended runs.

The same sources feed the same store (so what is recorded is what the dashboard would have recorded),
a clean close on SIGTERM/SIGINT, and a line a minute on stderr saying what was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tui.lifecycle.switch import StateChanges
from tui.live.feed import Feed
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.record.writer import Recorder
from tui.run.sources import RunOptions, build_sources
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler


def secrets_of(targets: list[EngineTarget]) -> tuple[str, ...]:
    out = []
    for t in targets:
        out.append(t.api_key or "")
        if t.basic_auth:
            out.append(t.basic_auth[1])
    return tuple(s for s in out if s)


async def _watch_managers(managers: Sequence[Any], recorder: Recorder, say: Callable[[str], None]) -> None:
    """An engine started here that exits on its own is a crash: recorded with its exit code and log tail."""
    states = StateChanges()
    while managers:
        for i, manager in enumerate(managers):
            status = manager.poll_status()
            if states.changed(i, status):
                recorder.event("engine-state", status.profile, status.event_data())
                if status.state == "crashed":
                    say(f"{status.profile} crashed: {status.message}")
        await asyncio.sleep(1.0)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def record(options: RunOptions, recorder: Recorder, *,
                 gpu_sampler: Callable[[], GpuSampler] = GpuSampler,
                 host_sampler: Callable[[], HostSampler] = HostSampler,
                 say: Callable[[str], None] = print, line_every_s: float = 60.0,
                 store: Store | None = None, duration_s: float | None = None,
                 managers: Sequence[Any] = ()) -> str:
    """Record the run's sources (tui.run.sources: the same the dashboard reads) until SIGTERM/SIGINT (or
    `duration_s`); returns why it stopped."""
    store = store or Store()
    store.listeners.append(recorder)
    run = build_sources(options, gpu_report=lambda: store.gpu, gpu_sampler=gpu_sampler,
                        host_sampler=host_sampler)
    stop = asyncio.Event()
    why = ["duration reached"]
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        why[0] = f"{sig.name} received"
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)

    def on_error(name: str, exc: BaseException) -> None:
        say(f"{name} failed: {type(exc).__name__}: {exc}")

    await run.start()
    feed = asyncio.create_task(Feed(store, run.all(), on_error=on_error).run())
    watch = asyncio.create_task(_watch_managers(managers, recorder, say))
    started = time.monotonic()
    what = [t.name for t in (*options.watched, *options.launched)]
    if run.fleet is not None and run.fleet.client is not None:
        what.append(f"the fleet in {run.fleet.client.shown}")
    say(f"recording {', '.join(what) or 'GPUs'} to {recorder.path} (pid {os.getpid()})")
    try:
        while not stop.is_set():
            timeout = line_every_s
            if duration_s is not None:
                timeout = min(timeout, max(0.0, started + duration_s - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout)
            if recorder.error:
                why[0] = recorder.error
                break
            if stop.is_set() or (duration_s is not None and time.monotonic() - started >= duration_s):
                break
            health = [s.sample.health if s.sample else "no answer" for s in store.engines.values()]
            if len(health) <= 8:
                ups = ", ".join(f"{n}: {h}" for n, h in zip(store.engines, health, strict=True))
            else:  # a fleet: counts, not 500 names a minute
                ups = ", ".join(f"{health.count(h)} {h}" for h in sorted(set(health)))
            say(f"{recorder.rows} rows, {_size(recorder.path) / 1e6:.2f} MB in {recorder.path} after "
                f"{(time.monotonic() - started) / 60:.0f} min; {ups}")
    finally:
        for task in (feed, watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        await run.aclose()
    return why[0]
