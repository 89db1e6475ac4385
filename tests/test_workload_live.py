"""A bench run shows in any dashboard as it goes (no flag on either side), and an engine whose capacity was
measured shows its headroom: the real traffic through the proxy against that capacity, and the share of it
that met the SLO. Against a loopback engine, with the dashboard's own sources."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import threading
import time

import httpx
import orjson

from tests.screen import screen_text
from tests.sse_server import Scenario, SSEServer
from tests.test_dashboard import make_app, wait_for
from tests.test_proxy_llama import proxy_options
from tests.waiting import until
from tui.cli.main import main
from tui.model.targets import EngineTarget
from tui.proxy.headroom import MeasuredCapacity, load_capacities, save_capacities
from tui.ui.screens.dashboard import plot_data
from tui.workload.live import LiveFile, LiveRuns, Shown, progress_of

SLOW = Scenario(first_token_delay_s=0.05, per_token_delay_s=0.02)  # 20 tokens: about half a second each


async def test_a_bench_shows_in_the_dashboard_as_it_goes(tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(orjson.dumps({"prompt": f"q {i}", "output_tokens": 20}).decode() + "\n"
                                for i in range(24)))
    with SSEServer(default=SLOW) as engine:
        app = make_app([EngineTarget("sse", engine.url)], tmp_path)
        codes: list[int] = []
        bench = threading.Thread(target=lambda: codes.append(main([
            "bench", f"vllm-custom:{workload}", "--engine", f"b={engine.url}", "--rate", "3", "--arrival",
            "constant", "--slo", "ttft:500"])))
        async with app.run_test(size=(180, 60)) as pilot:
            bench.start()
            await wait_for(pilot, lambda: "bench  running:" in screen_text(app), what="the running bench")
            await wait_for(pilot, lambda: "ttft:500: 100.0% met so far" in screen_text(app), what="its SLO")
            state = app.store.engines["sse"]
            await wait_for(pilot, lambda: state.bench.progress.ttft_p50_s is not None, what="live TTFT")
            now = time.monotonic()
            drawn = plot_data("TTFT", "s", "ttft_p50_s", lambda r: (None, None), app.store.engines, now,
                              600.0, [])
            assert drawn.lines["SLO ttft 500 ms"][1] == [0.5, 0.5]  # the SLO's limit across the chart
            assert drawn.lines["sse bench"][1]  # the run's own TTFT beside the engine's
            await asyncio.to_thread(bench.join, 60)
            await wait_for(pilot, lambda: "done: 24/24 sent" in screen_text(app), what="the finished run")
    assert codes == [0]


def test_a_run_whose_process_is_gone_reads_failed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = LiveFile("bench", tmp_path)
    progress = progress_of(None, "bench", "w.jsonl", None, "running", 10, time.monotonic())
    live.write({"b": Shown("http://127.0.0.1:9", dataclasses.replace(progress, pid=gone.pid))})
    seen = asyncio.run(LiveRuns([EngineTarget("e", "http://127.0.0.1:9/")], tmp_path).read())
    assert [s.name for s in seen] == ["e"]  # matched by URL, whatever the run called it
    assert seen[0].progress.state == "failed" and f"PID {gone.pid}" in seen[0].progress.error
    other = asyncio.run(LiveRuns([EngineTarget("e", "http://127.0.0.1:8")], tmp_path).read())
    assert other == []  # a run on an engine this dashboard does not watch is not shown


def test_a_folder_that_has_not_changed_is_not_read_again_unless_a_run_is_going(tmp_path, monkeypatch):
    folder = tmp_path / "live"
    runs = LiveRuns([EngineTarget("e", "http://127.0.0.1:9")], folder)
    scans = []
    scan = runs._scan
    monkeypatch.setattr(runs, "_scan", lambda: scans.append(1) or scan())
    assert asyncio.run(runs.read()) == [] and scans == []  # no folder: nothing listed
    live = LiveFile("bench", folder)
    now = time.monotonic()
    done = progress_of(None, "bench", "w.jsonl", None, "done", 10, now)
    write = live.write

    def after_a_tick(shown):
        # the file system stamps mtimes from a clock that moves in ticks (up to 10 ms): a write in the tick
        # of the one before leaves the folder's mtime as it was, which the runs' 0.5 s cadence never does
        until(lambda: time.time_ns() > folder.stat().st_mtime_ns + 20_000_000, "a file system clock tick")
        write(shown)

    live.write = after_a_tick
    live.write({"b": Shown("http://127.0.0.1:9", done)})
    assert [s.progress.state for s in asyncio.run(runs.read())] == ["done"]
    assert asyncio.run(runs.read()) == [] and len(scans) == 1  # the same folder: not listed again
    live.write({"b": Shown("http://127.0.0.1:9", progress_of(None, "bench", "w.jsonl", None, "running", 10,
                                                           now))})
    for _ in range(2):  # a run going is read every time (its live TTFT is plotted, its process may die)
        assert [s.progress.state for s in asyncio.run(runs.read())] == ["running"]
    assert len(scans) == 3
    live.write({"b": Shown("http://127.0.0.1:9", done)})
    assert [s.progress.state for s in asyncio.run(runs.read())] == ["done"]
    assert asyncio.run(runs.read()) == [] and len(scans) == 4


async def test_a_measured_capacity_shows_the_traffics_headroom_and_slo(tmp_path):
    with SSEServer(default=Scenario(per_token_delay_s=0.001)) as engine:
        # a loose SLO: what is checked is that the traffic is judged and shown, not the loop's TTFT under load
        save_capacities([MeasuredCapacity(engine.url, "sse", 10.0, "ttft:5000", 0.95, "poisson", "w.jsonl",
                                          time.time())])
        assert load_capacities()[engine.url].capacity_rps == 10.0
        app = make_app([EngineTarget("sse", engine.url)], tmp_path)
        app.config.proxy = proxy_options("sse", tmp_path)
        app.__init__(app.config)
        async with app.run_test(size=(180, 60)) as pilot:
            await wait_for(pilot, lambda: app.run_sources.proxy and app.run_sources.proxy._runners,
                           what="the proxy listening")
            via = app.run_sources.proxy.routes[0].proxy_url
            async with httpx.AsyncClient(timeout=30) as client:
                for stream in (True, True, True, False):  # a request without a stream has no TTFT to judge
                    await client.post(via + "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream})
            judged = "ttft:5000: 100.0% met of 3 requests (last 5 min)"
            await wait_for(pilot, lambda: judged in screen_text(app), what="the traffic's SLO")
            text = screen_text(app)
            assert "headroom" in text and "req/s capacity" in text and "% used)" in text
