"""The dashboard on a real llama-server: what /metrics says is what the panels show."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from waiting import until_async

from tests.fake_pynvml import FakeNvml, h200
from tests.screen import screen_text
from tui.base.process import free_port
from tui.model.targets import EngineTarget
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.help import HelpScreen


def make_app(targets: list[EngineTarget], tmp_path: Path, nvml: FakeNvml | None = None) -> EnginetopApp:
    nvml = nvml or FakeNvml([h200()])
    return EnginetopApp(AppConfig(
        targets=targets, poll_interval_s=0.5, gpu_interval_s=0.5, host_interval_s=0.5,
        redraw_interval_s=0.25, screenshot_dir=tmp_path / "shots",
        gpu_sampler=lambda: GpuSampler(nvml),
    ))


async def wait_for(pilot, predicate, timeout: float = 20.0, what: str = "condition"):
    return await until_async(predicate, what, timeout, every=0.1, pause=pilot.pause)


async def chat(url: str, max_tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=60) as client:
        reply = await client.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
            "max_tokens": max_tokens, "ignore_eos": True,
        })
        reply.raise_for_status()
        return reply.json()


async def test_panel_tracks_real_generation_counter(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        state = app.store.engines["llama"]
        # the session's engine is shared: an earlier test's request must be done and counted first
        await wait_for(pilot, lambda: state.sample and state.sample.reading
                       and state.sample.reading.running == 0, what="the engine idle")
        idle = state.sample
        await wait_for(pilot, lambda: state.sample.t > idle.t, what="a poll after it")
        before = state.sample.reading.generation_tokens_total
        reply = await chat(llama_server.url, 24)
        produced = reply["usage"]["completion_tokens"]
        assert produced == 24
        await wait_for(
            pilot, lambda: state.sample.reading and  # a late /metrics reads no reading
            state.sample.reading.generation_tokens_total == before + produced,
            what="generation counter to move by the completion tokens")
        await wait_for(pilot, lambda: state.stats.gen_tps, what="a generation rate")
        await wait_for(pilot, lambda: re.search(r"gen tok/s\s*\d+\.\d", screen_text(app)),
                       what="the engine column drawn")
        text = screen_text(app)
        assert "● up" in text
        assert state.sample.model and state.sample.model.rsplit("/", 1)[-1] in text
        # llama.cpp has no TTFT histogram and no KV gauge: the column leaves them out (never 0, never rows of
        # n/a); its KV is the slots' estimate, said so; every figure is a key away (enter)
        assert "TTFT" not in text.split("probes")[0] and "n/a" not in text.split("probes")[0]
        assert "of the slots' context (estimate)" in text
        assert "NVIDIA H200" in text


async def test_dead_engine_does_not_stop_the_live_one(llama_server, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    app = make_app([EngineTarget("dead", dead), EngineTarget("llama", llama_server.url)], tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        live = app.store.engines["llama"]
        await wait_for(pilot, lambda: live.sample and live.sample.reading, what="live engine reading")
        down = app.store.engines["dead"].sample
        assert down is not None and down.health == "down"
        assert "refused" in (down.health_reason or "")
        t = live.sample.t
        await wait_for(pilot, lambda: live.sample.t > t + 0.4, what="more polls")
        assert "refused" in screen_text(app)


async def test_keys_pause_screenshot_help_quit(llama_server, tmp_path):
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: app.store.engines["llama"].sample, what="first poll")
        await pilot.press("p")
        assert app.paused and "PAUSED" in app.sub_title
        state = app.store.engines["llama"]
        series = state.series["gen_tps"]
        polled, kept = state.sample.t, list(series.points)
        shown = screen_text(app)
        # paused, polling and recording go on: new points after the ones kept; the screen stays as it was
        await wait_for(pilot, lambda: state.sample.t > polled + 1.0 and len(series.points) > len(kept),
                       what="polls and new points while paused")
        whole = max(len(kept) - 1, 0)  # the last point kept may still take a poll of its time bucket
        assert list(series.points)[:whole] == kept[:whole], "history lost on pause"
        assert screen_text(app) == shown, "the display moved while paused"
        await pilot.press("p")
        assert not app.paused
        await pilot.press("s")
        shots = await wait_for(pilot, lambda: list((tmp_path / "shots").glob("*.svg")), what="a screenshot")
        assert len(shots) == 1 and "<svg" in shots[0].read_text()
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        text = screen_text(app)
        for key in ("q", "p", "s", "?"):  # a row of the help's table each: the key, then what it does
            assert re.search(rf"{re.escape(key)} +│", text), text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help screen closed")
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, timeout=5, what="q to quit")
        assert app.return_code == 0, "q did not quit"


async def test_throttle_reason_is_shown_and_marked_on_plots(llama_server, tmp_path):
    nvml = FakeNvml([h200()])
    app = make_app([EngineTarget("llama", llama_server.url)], tmp_path, nvml=nvml)
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: app.store.gpu and app.store.gpu.gpus, what="a GPU report")
        assert "THROTTLED" not in screen_text(app)
        nvml.set_clock_event_mask(0, 0x004)  # SW power cap
        await wait_for(pilot, lambda: app.store.gpu.gpus[0].throttled, what="throttle seen")
        await wait_for(pilot, lambda: "THROTTLED: power cap" in screen_text(app), what="the throttle drawn")
        text = screen_text(app)
        assert "THROTTLED: power cap" in text
        now = time.monotonic()
        assert app.store.throttle_spans(now - 60), "throttled period recorded for the plots"
        assert "GPU throttled" in text  # the plots' legend names the red marking


async def test_a_redraw_while_the_screen_is_torn_down_draws_nothing(tmp_path):
    """Quitting removes the screen's widgets before the redraw timer stops: a redraw then must not end the
    app with NoMatches (seen in a full run when a test left the app right after a condition held)."""
    from tui.ui.screens.dashboard import Dashboard

    app = make_app([], tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.query_one(Dashboard).remove_children()
        app.redraw()
        await pilot.pause()
        assert app.is_running
