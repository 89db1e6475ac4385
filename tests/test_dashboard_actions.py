"""Dashboard keys that act: probe (f), sweep (c), switch profiles (1-9), logs (l), crash display."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.fake_pynvml import FakeNvml, h200
from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.test_demo_both import profiles_on_free_ports, switch_with_keys
from tui.compare.ab import ABConfig
from tui.model.targets import EngineTarget
from tui.probe.sweep import SweepConfig
from tui.probe.workloads import WorkloadParams
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.ab import ABScreen
from tui.ui.screens.logs import LogScreen
from tui.ui.screens.sweep import SweepScreen
from widgets.plots import TimePlot


async def test_key_f_probes_and_marks_the_plots(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        state = app.store.engines["llama"]
        await wait_for(pilot, lambda: state.sample and state.sample.health == "up", what="engine up")
        await pilot.press("f")
        await wait_for(pilot, lambda: len(state.probes) == 1, timeout=60, what="a probe result")
        _, result = state.probes[0]
        assert result.ok and result.token_source == "server"
        assert result.completion_tokens == app.config.probe_max_tokens
        # the panel grows by its table's rows on the next layout: until then only the median line shows
        row = f"{result.completion_tokens}/{result.chunks}"
        await wait_for(pilot, lambda: "median of last 1: decode" in (t := screen_text(app)) and row in t,
                       what="the probe drawn")
        text = screen_text(app)
        assert "llama probe" in text  # the probe marker's legend on the tok/s plot
        # each marker sits at the instant its figure measured, not when the request ended
        for plot_id, at, value in (("#plot-gen", result.decode_at, result.decode_tps),
                                   ("#plot-ttft", result.ttft_at, result.ttft_s)):
            data, now = app.query_one(plot_id, TimePlot).shown
            xs, ys = data.markers["llama"]
            assert ys == [value] and abs(now + xs[0] - at) < 1e-6, (plot_id, now + xs[0], at)
        assert result.decode_at < result.ended_at - 0.1  # 64 tokens at ~60 tok/s: half a second apart


async def test_key_c_sweeps_every_engine(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    app.config.sweep = SweepConfig(levels=(1, 2), requests_per_stream=1, duration_s=None,
                                   params=WorkloadParams(max_tokens=16))
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: app.store.engines["llama"].sample, what="first poll")
        await pilot.press("c")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen,
                                what="the sweep screen")
        await wait_for(pilot, lambda: screen.status["llama"] == "done", timeout=120, what="sweep done")
        levels = screen.levels["llama"]
        assert [lv.level for lv in levels] == [1, 2]
        assert all(lv.ok == lv.requests and lv.aggregate_tps for lv in levels)
        text = screen_text(app)
        assert "aggregate tok/s by concurrency" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SweepScreen), what="the sweep screen closed")


@pytest.mark.engine  # starts the demo profiles
async def test_switch_with_keys_then_crash_behind_our_back(tmp_path):
    profiles = profiles_on_free_ports(tmp_path, "demo-cpu-threads1", "demo-cpu-threads2")
    a, b = profiles.get("demo-cpu-threads1"), profiles.get("demo-cpu-threads2")
    nvml = FakeNvml([h200()])
    app = EnginetopApp(AppConfig(
        profiles=[a], switchable=[a, b], poll_interval_s=0.5, redraw_interval_s=0.25,
        screenshot_dir=tmp_path / "shots", gpu_sampler=lambda: GpuSampler(nvml)))
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            slot = app.slots[0]
            await wait_for(pilot, lambda: slot.status and slot.status.state == "ready", timeout=120,
                           what="demo A ready")
            assert slot.status.profile == a.name and slot.status.cold_start_s > 0
            await wait_for(pilot, lambda: app.store.engines[a.name].sample.health == "up", what="A polled up")

            await switch_with_keys(pilot, app, "2", a.name, slot.status.pid)
            text = screen_text(app)
            assert "ready" in text and "elapsed" in text
            await pilot.press("escape")
            await wait_for(pilot, lambda: slot.status.state == "ready" and slot.status.profile == b.name,
                           what="B ready")
            await wait_for(pilot, lambda: app.store.engines[b.name].sample.health == "up", what="B polled up")

            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, LogScreen), what="the log screen")
            log_path = slot.manager.current.log_path
            assert app.screen.path == log_path and log_path.name.startswith(b.name)
            text = screen_text(app)
            assert f"profile {b.name}" in text  # the header enginetop wrote when it launched B
            # a line well inside the shown tail (60 lines): the engine keeps logging while we look
            lines = [line.strip() for line in log_path.read_text().splitlines() if line.strip()]
            shown = lines[-min(20, len(lines))]
            assert shown[:60] in text, (shown, text[-2000:])
            await pilot.press("escape")

            os.kill(slot.status.pid, signal.SIGKILL)
            await wait_for(pilot, lambda: slot.status.state == "crashed", timeout=30, what="crash noticed")
            assert slot.status.exit_code == -9
            await wait_for(pilot, lambda: "CRASHED" in screen_text(app), what="the crash drawn")
            text = screen_text(app)
            assert "CRASHED" in text and "SIGKILL" in text
    finally:
        app.stop_managed()


async def test_key_a_interleaves_ab_over_watched_engines(llama_server, tmp_path, monkeypatch):
    """One watched engine and one the dashboard started from a profile: nothing is restarted, the words
    say rounds, and the report names the managed engine's kind, profile and argv as launched."""
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path / "cache"))
    managed = profiles_on_free_ports(tmp_path, "demo-cpu-threads1").get("demo-cpu-threads1")
    app = EnginetopApp(AppConfig(
        targets=[EngineTarget("A", llama_server.url)], profiles=[managed], poll_interval_s=0.5,
        redraw_interval_s=0.25, screenshot_dir=tmp_path / "shots",
        gpu_sampler=lambda: GpuSampler(FakeNvml([h200()])),
        ab=ABConfig(instances=2, blocks=1, requests_per_block=1, max_tokens=12, warmup_requests=0,
                    mode="coresident", bootstrap_samples=200)))
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            slot = app.slots[1]
            await wait_for(pilot, lambda: slot.status and slot.status.state == "ready", timeout=120,
                           what="the managed engine ready")
            pid = slot.manager.current.pid
            await pilot.press("a")
            screen = await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and app.screen,
                                    what="the A/B screen")
            assert screen.run is app.ab_run
            await wait_for(pilot, lambda: screen.run.done, timeout=180, what="A/B result")
            result = screen.run.result
            assert result is not None, screen.run.error
            blocks = result["blocks"]
            assert [b["arm"] for b in blocks] == ["A", managed.name, managed.name, "A"]  # order flips
            await wait_for(pilot, lambda: f"{managed.name} / A decode:" in screen_text(app),
                           what="the verdicts drawn")
            text = screen_text(app)
            assert "95% CI" in text
            assert re.search(r"A\s+[\d.]+\s+[\d.]+", text)
            assert "instance" not in text and "rounds" in text
            assert slot.manager.current.pid == pid  # measured as it ran, never restarted
        arms = {a["name"]: a for a in result["arms"]}
        b = arms[managed.name]
        assert b["engine"] == "llama.cpp" and b["profile_path"] == str(managed.path)
        assert b["argv"][b["argv"].index("--threads") + 1] == "1" and str(managed.port) in b["argv"]
        assert b["origin"] == f"started by the dashboard from profile {managed.name} (PID {pid}), not " \
            "restarted for the A/B"
        assert arms["A"]["origin"].startswith("watched by the dashboard") and arms["A"]["engine"] is None
        saved = list((tmp_path / "cache" / "runs").glob("ab-*.html"))
        assert len(saved) == 1
        html = saved[0].read_text()
        assert "<svg" in html
        assert "<dt>Engine</dt><dd>llama.cpp</dd>" in html and f"<dd>{managed.path}</dd>" in html
        method = html[html.index("<h2>Method</h2>"):html.index("</ol>", html.index("<h2>Method</h2>"))]
        assert "fresh engine start" not in method and "instance" not in method
        assert f"<b>{managed.name}</b>: never restarted (started by the dashboard from profile" in method
        assert "2 rounds in time" in method
        assert "GPU state was read from the dashboard&#x27;s GPU panel" in method
    finally:
        app.stop_managed()


async def test_roofline_beside_measured_decode(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    app.config.bandwidth_bps = 20e9  # no GPU here: the bandwidth is given, as with --bandwidth 20GB/s
    async with app.run_test(size=(200, 60)) as pilot:
        state = app.store.engines["llama"]
        await wait_for(pilot, lambda: state.sample and state.sample.model, what="model id")
        size = Path(state.sample.model).stat().st_size
        await pilot.press("f")
        await wait_for(pilot, lambda: state.probes, timeout=60, what="a probe")
        await wait_for(pilot, lambda: "ceiling" in screen_text(app), what="the roofline drawn")
        roof = app._roofline(state)
        assert roof is not None and abs(roof.ceiling_tps - 20e9 / size) < 1e-6
        assert roof.pct_of_ceiling is not None and roof.pct_of_ceiling > 0
        assert f"ceiling {20e9 / size:.0f} tok/s" in screen_text(app)
