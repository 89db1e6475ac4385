"""The dashboard, headless, as `bench_app.py` measures it: real pollers, real redraws, fake NVML GPU."""

from __future__ import annotations

import argparse
import cProfile
import gc
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tests.fake_pynvml import FakeNvml, h200
from tui.record.writer import Recorder
from tui.run.targets import build_targets
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", action="append", required=True)
    parser.add_argument("--record", type=Path, default=None, help="record as the dashboard does by default")
    parser.add_argument("--profile", type=Path, default=None,
                        help="cProfile the event loop from SIGUSR1 to SIGUSR2 (or the app's end): stats here")
    parser.add_argument("--tty", action="store_true",
                        help="draw in the terminal it was started in (a pseudo-terminal), not headless")
    parser.add_argument("--no-freeze", action="store_true",
                        help="start-up's objects left in full collections (AppCore.run's freeze undone)")
    parser.add_argument("--gc-log", type=Path, default=None,
                        help="each collection's end (monotonic), generation and CPU seconds: here, at exit")
    args = parser.parse_args()
    if args.no_freeze:
        gc.freeze = lambda: None  # the dashboard's own call, undone for this process only
    collections: list[tuple[float, int, float]] = []
    if args.gc_log is not None:
        started = [0.0]

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                started[0] = time.thread_time()
            else:
                collections.append((time.monotonic(), info["generation"], time.thread_time() - started[0]))

        gc.callbacks.append(timed)
    targets = build_targets(args.engine)
    config = AppConfig(targets=targets, gpu_sampler=lambda: GpuSampler(FakeNvml([h200()])))
    if args.record is not None:
        config.recorder = Recorder(args.record, {t.name: t.url for t in targets})
    profiler = cProfile.Profile() if args.profile is not None else None
    if profiler is not None:  # the steady state only: the bench says when it begins (start-up is not a cycle)
        signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
        signal.signal(signal.SIGUSR2, lambda *_: profiler.disable())  # nor its end (threads joined at exit)
    try:
        app = EnginetopApp(config)
        app.run() if args.tty else app.run(headless=True, size=(200, 60))
    finally:
        if args.gc_log is not None:
            args.gc_log.write_text("".join(f"{t} {g} {cpu}\n" for t, g, cpu in collections))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        if config.recorder is not None:
            config.recorder.close()


if __name__ == "__main__":
    main()
