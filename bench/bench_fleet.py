"""The fleet view's cost against a real Prometheus over a SYNTHETIC fleet (tests/synthetic_fleet.py:
loopback exporters with the real metric names and labels of vLLM, SGLang, llama.cpp and dcgm-exporter).

Printed figures:
- queries per refresh for 10, 50 and all engines of the fleet (--match narrows it): must not grow with N;
- enginetop's own CPU (% of one core, the scheduler's count from /proc/PID/task/*/schedstat) over
  `--seconds` and its RSS at the end, the app running headless in a child process at the default refresh
  (5 s) over 200 engines and 52 GPUs;
- key press to redrawn table (typing into the filter, median and max of 20 presses) with 200 and 500 rows.

Prometheus scrapes every 5 s (Prometheus' default is 15 s; 5 s keeps this 2-core machine from spending
itself on the synthetic exporters, which run in this process, not in the measured one).

    .venv/bin/python bench/bench_fleet.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from textual.app import App, ComposeResult
from textual.widgets import Input

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from prometheus_server import running_prometheus  # noqa: E402
from synthetic_fleet import make_fleet  # noqa: E402

from tui.fleet.options import FleetOptions  # noqa: E402
from tui.fleet.prometheus import PrometheusClient  # noqa: E402
from tui.fleet.source import FleetSource  # noqa: E402
from tui.ui.app import EnginetopApp  # noqa: E402
from tui.ui.config import AppConfig  # noqa: E402
from tui.ui.screens.fleet import FleetView  # noqa: E402
from widgets.fleet_table import FleetTable  # noqa: E402

N_NODES, GPUS_PER_NODE = 13, 4


def cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


async def queries_per_refresh(url: str, n: int) -> list[tuple[int, int, float, float]]:
    """(engines, queries per refresh, seconds of the first read, seconds of the next) for 10, ~64 and all
    engines. The first read also back-fills the alerts' history (4 range queries, once)."""
    out = []
    for match in ('{instance=~"synthetic-node-00:800[0-9]"}', '{instance=~"synthetic-node-0[0-3]:.*"}', None):
        client = PrometheusClient(url)
        source = FleetSource(client, match)
        began = time.perf_counter()
        await source.read()
        first = time.perf_counter() - began
        began = time.perf_counter()
        samples = await source.read()
        out.append((len(samples), source.queries_per_read or 0, first, time.perf_counter() - began))
        await client.aclose()
    return out


class _Bare(App):
    def compose(self) -> ComposeResult:
        yield Input()


async def round_trips(app: App, keys: int = 20) -> list[float]:
    """Seconds from a key press to the app being idle again with the screen redrawn (Textual's pilot)."""
    times = []
    async with app.run_test(size=(220, 60)) as pilot:
        view = app.screen.query(FleetView).first() if app.screen.query(FleetView) else None
        deadline = time.monotonic() + 60
        while view is not None and view.table.row_count < getattr(app, "_want", 0) and \
                time.monotonic() < deadline:
            await pilot.pause(0.5)
        app._pressing_since = time.perf_counter()
        for i in range(keys):
            started = time.perf_counter()
            await pilot.press("8" if i % 2 == 0 else "backspace")
            await pilot.pause()
            times.append(time.perf_counter() - started)
        app._rows_seen = view.table.row_count if view is not None else 0
    return times


async def key_latency(url: str, n: int) -> dict[str, float]:
    """The pilot's round trip for the fleet table and for a bare Input (Textual's own floor), and the
    table's own work per key: re-filter + re-sort (FleetView.show) and drawing the rows in view
    (FleetTable.render_lines: every line Textual asks for while the keys are pressed, per key)."""
    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=url, refresh_s=5.0), horizon_s=1800.0))
    app._want = n
    shows: list[float] = []
    renders: list[tuple[float, float]] = []  # (when, how long): Textual asks for lines several times a frame
    original_show, original_render = FleetView.show, FleetTable.render_lines

    def timed_show(self, *args, **kwargs):
        took = original_show(self, *args, **kwargs)
        shows.append(took)
        return took

    def timed_render(self, crop):
        started = time.perf_counter()
        out = original_render(self, crop)
        renders.append((started, time.perf_counter() - started))
        return out

    FleetView.show, FleetTable.render_lines = timed_show, timed_render
    try:
        fleet = await round_trips(app)
    finally:
        FleetView.show, FleetTable.render_lines = original_show, original_render
    bare = await round_trips(_Bare())
    return {"rows": app._rows_seen, "fleet_median_ms": statistics.median(fleet) * 1000,
            "fleet_max_ms": max(fleet) * 1000, "bare_median_ms": statistics.median(bare) * 1000,
            "show_median_ms": statistics.median(shows[-20:]) * 1000,
            "render_per_key_ms": sum(d for t, d in renders if t >= app._pressing_since) / len(fleet) * 1000}


def measure_app(url: str, seconds: float) -> tuple[float, float]:
    argv = [sys.executable, str(ROOT / "bench/fleet_app_under_test.py"), "--prometheus", url]
    app = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(10)  # imports, first reads, first full table
        if app.poll() is not None:
            raise RuntimeError(f"the app exited: {app.stderr.read().decode()[-2000:]}")
        start_ns, start = cpu_ns(app.pid), time.monotonic()
        time.sleep(seconds)
        used = cpu_ns(app.pid) - start_ns
        elapsed = time.monotonic() - start
        rss = psutil.Process(app.pid).memory_info().rss
    finally:
        app.terminate()
        app.wait(10)
    return used / 1e9 / elapsed * 100, rss / 2**20


def run(n: int, seconds: float, cpu: bool) -> None:
    fleet = make_fleet(n, N_NODES, GPUS_PER_NODE, specials=False).spawn()
    try:
        with running_prometheus({}, scrapes=fleet.scrapes(5.0)) as prom:
            prom.wait_for("up", min_series=n + N_NODES, timeout=120)
            time.sleep(12)
            print(f"synthetic fleet: {n} engines, {N_NODES * GPUS_PER_NODE} GPUs on {N_NODES} nodes")
            for engines, queries, first, then in asyncio.run(queries_per_refresh(prom.url, n)):
                print(f"  queries per refresh with {engines:4d} engines: {queries}; first read (with the "
                      f"alerts' back-fill) {first * 1e3:.0f} ms, a refresh {then * 1e3:.0f} ms")
            k = asyncio.run(key_latency(prom.url, n))
            print(f"  key press to redrawn table ({k['rows']} rows), pilot round trip: median "
                  f"{k['fleet_median_ms']:.0f} ms, max {k['fleet_max_ms']:.0f} ms (a bare Input: "
                  f"{k['bare_median_ms']:.0f} ms); the table's own work per key: re-filter/sort "
                  f"{k['show_median_ms']:.1f} ms + drawing {k['render_per_key_ms']:.1f} ms")
            if cpu:
                pct, rss = measure_app(prom.url, seconds)
                print(f"  enginetop CPU over {seconds:g} s at the default 5 s refresh: "
                      f"{pct:.2f}% of one core")
                print(f"  enginetop RSS: {rss:.0f} MiB")
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sizes", default="200,500", help="fleet sizes; CPU and RSS are measured at 200")
    args = parser.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        run(n, args.seconds, cpu=n == 200)


if __name__ == "__main__":
    main()
