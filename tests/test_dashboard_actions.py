"""Dashboard keys that act: probe (f), sweep (c), switch profiles (1-9), logs (l), crash display."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from tests.fake_pynvml import FakeNvml, h200
from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.test_demo_both import profiles_on_free_ports
from tui.app import AppConfig, EnginetopApp
from tui.compare.ab import ABConfig
from tui.probe.sweep import SweepConfig
from tui.screens.ab import ABScreen
from tui.screens.logs import LogScreen
from tui.screens.sweep import SweepScreen
from tui.screens.switch import ConfirmSwitch, SwitchProgress
from tui.sources.engine import EngineTarget
from tui.sources.gpu import GpuSampler


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
        await pilot.pause(0.5)
        text = screen_text(app)
        assert "median of last 1: decode" in text
        assert "llama probe" in text  # the probe marker's legend on the tok/s plot
        row = f"{result.completion_tokens}/{result.chunks}"
        assert row in text, text[text.find("probes"):][:800]


async def test_key_c_sweeps_every_engine(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    app.config.sweep = SweepConfig(levels=(1, 2), requests_per_stream=1, duration_s=None)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: app.store.engines["llama"].sample, what="first poll")
        await pilot.press("c")
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await wait_for(pilot, lambda: screen.status["llama"] == "done", timeout=120, what="sweep done")
        levels = screen.levels["llama"]
        assert [lv.level for lv in levels] == [1, 2]
        assert all(lv.ok == lv.requests and lv.aggregate_tps for lv in levels)
        text = screen_text(app)
        assert "aggregate tok/s by concurrency" in text
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, SweepScreen)


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

            await pilot.press("2")
            await pilot.pause(0.2)
            assert isinstance(app.screen, ConfirmSwitch)
            assert f"This stops {a.name} (PID {slot.status.pid})" in app.screen.question
            await pilot.press("y")
            await pilot.pause(0.2)
            progress = app.screen
            assert isinstance(progress, SwitchProgress)
            await wait_for(pilot, lambda: progress.done is not None, timeout=120, what="switch done")
            steps = ("resolve", "stop", "drain", "port", "start", "ready")
            assert [progress.events[s].status for s in steps] == ["ok"] * 6
            text = screen_text(app)
            assert "ready" in text and "elapsed" in text
            await pilot.press("escape")
            await wait_for(pilot, lambda: slot.status.state == "ready" and slot.status.profile == b.name,
                           what="B ready")
            await wait_for(pilot, lambda: app.store.engines[b.name].sample.health == "up", what="B polled up")

            await pilot.press("l")
            await pilot.pause(0.3)
            assert isinstance(app.screen, LogScreen)
            assert "llama" in screen_text(app) or "server" in screen_text(app)
            await pilot.press("escape")

            os.kill(slot.status.pid, signal.SIGKILL)
            await wait_for(pilot, lambda: slot.status.state == "crashed", timeout=30, what="crash noticed")
            assert slot.status.exit_code == -9
            await pilot.pause(0.5)
            text = screen_text(app)
            assert "CRASHED" in text and "SIGKILL" in text
    finally:
        app.stop_managed()


async def test_key_a_interleaves_ab_over_watched_engines(llama_server, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path / "cache"))
    targets = [EngineTarget("A", llama_server.url), EngineTarget("B", llama_server.url)]
    app = make_app(targets, tmp_path)
    app.config.ab = ABConfig(instances=2, blocks=1, requests_per_block=1, max_tokens=12, warmup_requests=0,
                             mode="coresident", bootstrap_samples=200)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.press("a")
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, ABScreen)
        await wait_for(pilot, lambda: screen.result is not None, timeout=180, what="A/B result")
        blocks = screen.result["blocks"]
        assert [b["arm"] for b in blocks] == ["A", "B", "B", "A"]  # interleaved, order flipped each round
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "B / A decode:" in text and "95% CI" in text
        assert re.search(r"A\s+[\d.]+\s+[\d.]+", text)
        saved = list((tmp_path / "cache" / "runs").glob("ab-*.html"))
        assert len(saved) == 1 and "<svg" in saved[0].read_text()


async def test_roofline_beside_measured_decode(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    app.config.bandwidth_bps = 20e9  # no GPU here: the bandwidth is given, as with --bandwidth 20GB/s
    async with app.run_test(size=(200, 60)) as pilot:
        state = app.store.engines["llama"]
        await wait_for(pilot, lambda: state.sample and state.sample.model, what="model id")
        size = Path(state.sample.model).stat().st_size
        await pilot.press("f")
        await wait_for(pilot, lambda: state.probes, timeout=60, what="a probe")
        await pilot.pause(0.6)
        roof = app._roofline(state)
        assert roof is not None and abs(roof.ceiling_tps - 20e9 / size) < 1e-6
        assert roof.pct_of_ceiling is not None and roof.pct_of_ceiling > 0
        assert f"ceiling {20e9 / size:.0f} tok/s" in screen_text(app)
