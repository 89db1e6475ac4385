"""The seeds' comparison, live: real llama.cpp and real vLLM on the same Gemma 3 270M, side by side.

This is the README's demo, driven by Pilot: both engines started through their profiles (each on a free
port), probed and swept; then the vLLM column is switched to a llama-server with the safe switch's keys. It
runs before the vLLM tests (file order) so that two vLLMs never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import psutil
import pytest

from tests.fake_pynvml import FakeNvml, h200
from tests.screen import screen_text
from tests.test_dashboard import chat, wait_for
from tui.base.process import free_port
from tui.lifecycle.profile_files import load_profiles, repo_profiles_dir
from tui.probe.sweep import SweepConfig
from tui.probe.workloads import WorkloadParams
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.sweep import SweepScreen
from tui.ui.screens.switch import ConfirmSwitch, SwitchProgress

pytestmark = pytest.mark.engine  # every test here starts a real engine


def profiles_on_free_ports(tmp_path: Path, *names: str):
    out = tmp_path / "profiles"
    out.mkdir(exist_ok=True)
    for name in names:
        text = (repo_profiles_dir() / f"{name}.toml").read_text()
        (out / f"{name}.toml").write_text(re.sub(r"(?m)^port = \d+", f"port = {free_port()}", text))
    return load_profiles([out])


SWITCH_STEPS = ("resolve", "stop", "drain", "port", "start", "ready")


async def switch_with_keys(pilot, app: EnginetopApp, key: str, stops: str, pid: int) -> SwitchProgress:
    """Press a profile's number, check what the confirmation says it stops, say yes, and wait for every step
    of the safe switch to pass; the progress screen is left open."""
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmSwitch), what="the confirmation")
    assert f"This stops {stops} (PID {pid})" in app.screen.question
    await pilot.press("y")
    progress = await wait_for(pilot, lambda: isinstance(app.screen, SwitchProgress) and app.screen,
                              what="the switch's progress")
    await wait_for(pilot, lambda: progress.done is not None, timeout=120, what="switch done")
    assert [progress.events[s].status for s in SWITCH_STEPS] == ["ok"] * 6, progress.events
    return progress


async def test_llama_and_vllm_side_by_side_on_gemma(tmp_path):
    profiles = profiles_on_free_ports(tmp_path, "demo-cpu-threads2", "demo-vllm-gemma", "demo-cpu-threads1")
    llama, vllm = profiles.get("demo-cpu-threads2"), profiles.get("demo-vllm-gemma")
    other_llama = profiles.get("demo-cpu-threads1")
    nvml = FakeNvml([h200()])
    app = EnginetopApp(AppConfig(
        profiles=[llama, vllm], switchable=[llama, vllm, other_llama], probe_every_managed_s=4.0,
        probe_max_tokens=32,
        sweep=SweepConfig(levels=(1, 2), requests_per_stream=1, duration_s=None,
                          params=WorkloadParams(max_tokens=16)),
        poll_interval_s=1.0, redraw_interval_s=0.5, screenshot_dir=tmp_path / "shots",
        gpu_sampler=lambda: GpuSampler(nvml)))
    try:
        async with app.run_test(size=(220, 64)) as pilot:
            ready = lambda: all(s.status and s.status.state == "ready" for s in app.slots)  # noqa: E731
            await wait_for(pilot, ready, timeout=280, what="both engines ready")
            engines = [app.store.engines[llama.name], app.store.engines[vllm.name]]
            await wait_for(pilot, lambda: all(len(e.probes) >= 1 for e in engines), timeout=120,
                           what="a probe on each engine")
            await wait_for(pilot, lambda: all(e.stats.gen_tps for e in engines), timeout=60,
                           what="generation rates on both")
            for engine, dialect in zip(engines, ("llamacpp", "vllm"), strict=True):
                sample = engine.sample
                assert sample.health == "up" and sample.reading.dialect == dialect
                assert sample.model and sample.reading.generation_tokens_total > 0
                _, probe = engine.probes[-1]
                assert probe.ok and probe.token_source == "server" and probe.completion_tokens == 32
                assert 1 < probe.decode_tps < 1000  # plausible for a 270M model on 2 cores
            vllm_stats = engines[1].stats
            assert vllm_stats.ttft_p50_s is not None and 0 < vllm_stats.ttft_p50_s < 30  # from histograms
            assert engines[0].stats.ttft_p50_s is None  # llama.cpp has no histogram: n/a, not 0
            # the columns as of the stats just read: the last 0.5 s redraw may predate the poll that set them
            # (a fresh clone once read vLLM's TTFT as not yet there, the poll that gave its first in hand)
            app.redraw()
            await pilot.pause()
            text = screen_text(app)
            # each column at a glance: llama.cpp's from its slots' estimate, vLLM's with its TTFT and KV pool
            assert "of the slots' context (estimate)" in text and re.search(r"TTFT p50/p90\s+\d+ ms", text)

            # running rises with concurrent requests, as the dashboard polls it, and falls back when the
            # clients hang up: vLLM aborts a request whose client is gone
            vllm_state = engines[1]
            # long enough (~20 s here) that 1 s polls see it on a loaded machine, where vLLM's /metrics
            # can take a poll's whole timeout to answer; it is not waited for
            burst = asyncio.gather(*(chat(vllm.url, 128) for _ in range(6)))

            def running() -> int | None:  # None for a poll that got no reading (a late /metrics)
                reading = vllm_state.sample.reading
                return reading.running if reading is not None else None

            await wait_for(pilot, lambda: (running() or 0) >= 2, timeout=60,
                           what="vLLM running >= 2 on the dashboard")
            assert not burst.done()
            burst.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await burst
            await wait_for(pilot, lambda: running() == 0, timeout=30,
                           what="running back to 0")

            await pilot.press("c")
            sweep = await wait_for(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen,
                                   what="the sweep screen")
            await wait_for(pilot, lambda: all(v == "done" for v in sweep.status.values()), timeout=240,
                           what="sweep on both engines")
            for name in (llama.name, vllm.name):
                levels = sweep.levels[name]
                assert [lv.level for lv in levels] == [1, 2]
                assert all(lv.ok == lv.requests and lv.aggregate_tps for lv in levels), name
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, SweepScreen), what="the sweep closed")

            # the safe switch away from vLLM, with the keys: its whole process tree (API server, engine
            # core, worker) verified gone before the llama-server starts (llama to vLLM: the start above)
            vllm_slot = app.slots[1]
            vllm_pid = vllm_slot.status.pid
            app.query_one("#engine-1").focus()
            progress = await switch_with_keys(pilot, app, "3", vllm.name, vllm_pid)
            stopped = progress.events["stop"].message
            assert "verified gone" in stopped and vllm.name in stopped, stopped
            await pilot.press("escape")
            await wait_for(pilot, lambda: vllm_slot.status.state == "ready"
                           and vllm_slot.status.profile == other_llama.name, what="the llama-server ready")
            assert vllm_slot.status.cold_start_s > 0
            alive = psutil.pid_exists(vllm_pid) and psutil.Process(vllm_pid).status() != psutil.STATUS_ZOMBIE
            assert not alive, "vLLM's API server outlived the switch"
            assert app.slots[0].status.profile == llama.name  # the other column untouched
    finally:
        app.stop_managed()
