"""A replay says again what the live dashboard said (alerts, failed switches, crashes) as the cursor plays
past it, once each; what a seek rebuilds the store from is not said again."""

from __future__ import annotations

from pathlib import Path

from tests.fake_pynvml import FakeNvml, h200
from tests.test_dashboard import wait_for
from tests.test_record_file import engine_sample
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.record.writer import Recorder
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.replay import ReplayApp

REPLAY_WORDS = "this is a replay"


def capture(app) -> list[tuple[str, str, str]]:
    """Every notification the app shows, as (title, message, severity)."""
    said: list[tuple[str, str, str]] = []
    notify = app.notify

    def spy(message: str, *, title: str = "", severity: str = "information", **kw) -> None:
        said.append((title, message, severity))
        notify(message, title=title, severity=severity, **kw)

    app.notify = spy
    return said


async def test_replay_says_what_the_live_dashboard_said_once_each(tmp_path: Path) -> None:
    """The live dashboard warns (keys with nothing to act on, an error): replayed from start to end, the
    replay says the same things, in the same words, once each."""
    path = tmp_path / f"live{SUFFIX}"
    recorder = Recorder(path)
    nvml = FakeNvml([h200()])
    app = EnginetopApp(AppConfig(gpu_interval_s=0.1, host_interval_s=0.1, redraw_interval_s=0.1,
                                 gpu_sampler=lambda: GpuSampler(nvml), recorder=recorder))
    live = capture(app)
    async with app.run_test(size=(150, 45)) as pilot:
        # each notice a few recorded rows after the one before: the replay plays up to and past each
        def rows_on(n: int):
            mark = recorder.rows + n
            return lambda: recorder.rows >= mark

        await wait_for(pilot, rows_on(10), what="some rows recorded")
        await pilot.press("a")  # A/B with no engines: a warning
        await wait_for(pilot, lambda: len(live) >= 1, what="the A/B warning")
        await wait_for(pilot, rows_on(10), what="rows after it")
        await pilot.press("l")  # no engine started here, so no log: a warning
        await wait_for(pilot, lambda: len(live) >= 2, what="the log warning")
        await wait_for(pilot, rows_on(10), what="rows after it")
        app.notify("the GPU fell off the bus", title="NVML", severity="error")
        await wait_for(pilot, rows_on(10), what="rows after the last notice")
    recorder.close()
    live = [n for n in live if n[2] in ("warning", "error")]  # information is not an alert: not recorded
    assert len(live) == 3, live

    rec = Recording(path)
    replay = ReplayApp(rec, AppConfig(horizon_s=30))
    said = capture(replay)
    async with replay.run_test(size=(150, 45)) as pilot:
        await pilot.press("plus", "plus")  # 5x: the few seconds play in about one
        await wait_for(pilot, lambda: replay.replay.at_end and len(said) >= len(live), timeout=20,
                       what="the end of the recording, and its notices")
        await pilot.pause(0.6)  # a redraw after the last read: nothing more is said
        assert said == live
        # back before the alerts (paused there), then play past them again: said again, once each
        replay.replay.paused = True
        replay.replay.seek(rec.start)
        replay._moved()
        await pilot.pause(0.3)
        assert said == live, "a seek back said what it rebuilt the store from"
        await pilot.press("space")
        await wait_for(pilot, lambda: replay.replay.at_end and len(said) >= 2 * len(live), timeout=20,
                       what="the end again, and its notices")
        await pilot.pause(0.6)
        assert said == live + live


async def test_failed_switch_and_crash_are_said_once_and_not_after_a_seek(tmp_path: Path) -> None:
    """A failed switch recorded by the dashboard (its result and its alert: one notice) and by `enginetop
    record` (its result only), and a crash: each said once as the cursor steps past it; a jump past them
    says nothing; stepping over them again says them again."""
    path = tmp_path / f"events{SUFFIX}"
    t0 = 1000.0
    recorder = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    for i in range(60):
        recorder(engine_sample(i, t0))
    failed = {"to": "vllm-fp8", "ok": False, "failed_step": "wait-ready", "message": "not ready after 600 s"}
    recorder.event("switch", "vllm", {"to": "vllm-fp8", "name": "wait-ready", "status": "failed"},
                   t=t0 + 10.2)
    recorder.event("switch-result", "vllm", failed, t=t0 + 10.5)
    recorder.event("alert", None, {"title": "vllm-fp8: wait-ready failed", "message": "not ready after 600 s",
                                   "severity": "error"}, t=t0 + 10.5001)
    recorder.event("engine-state", "vllm", {"state": "failed", "message": "wait-ready failed: not ready"},
                   t=t0 + 10.6)
    recorder.event("switch-result", "vllm", {**failed, "to": "vllm-bf16", "message": "port 8000 in use"},
                   t=t0 + 20.5)  # as `enginetop record --profile` records it: no alert
    recorder.event("engine-state", "vllm", {"state": "ready", "message": "up"}, t=t0 + 25.5)
    recorder.event("engine-state", "vllm", {"state": "crashed", "message": "exited with code -9",
                                            "exit_code": -9}, t=t0 + 30.5)
    recorder.close()
    want = [("vllm-fp8: wait-ready failed", "not ready after 600 s", "error"),
            ("vllm-bf16: wait-ready failed", "port 8000 in use", "error"),
            ("vllm crashed", "exited with code -9", "error")]

    rec = Recording(path)
    replay = ReplayApp(rec, AppConfig(horizon_s=30), start=t0 + 5)
    said = capture(replay)
    async with replay.run_test(size=(150, 45)) as pilot:
        await pilot.press("space")  # pause: only the keys move the cursor
        for _ in range(30):
            await pilot.press("right")
        await wait_for(pilot, lambda: replay.replay.now == t0 + 35 and len(said) >= len(want),
                       what="the cursor past the events")
        assert said == want
        assert replay.slots[0].status.state == "crashed"
        await pilot.press("left_square_bracket")  # back to the start: nothing said
        await pilot.press("g")
        await pilot.press(*"-5s", "enter")  # past them all, from before them: nothing said
        await wait_for(pilot, lambda: replay.replay.now == rec.end - 5, what="the cursor at the end - 5 s")
        assert said == want
        replay.replay.seek(t0 + 9)
        replay._moved()
        for _ in range(25):
            await pilot.press("right")
        await wait_for(pilot, lambda: len(said) >= 2 * len(want), what="the events said again")
        assert said == want + want
    assert not [n for n in said if REPLAY_WORDS in n[1]]


async def test_replay_offers_only_the_keys_that_work_on_a_recording(tmp_path: Path) -> None:
    """A replay's footer shows the replay keys and none of the live keys that act on an engine (probe, sweep,
    A/B, switch, log); pressing one of those does nothing and says nothing."""
    path = tmp_path / f"rec{SUFFIX}"
    recorder = Recorder(path)
    recorder.event("note", None, {"what": "a recording with nothing else in it"})
    recorder.close()
    replay = ReplayApp(Recording(path), AppConfig(horizon_s=30))
    said = capture(replay)
    async with replay.run_test(size=(150, 45)) as pilot:
        await pilot.pause()
        offered = set(replay.screen.active_bindings)
        assert {"space", "g", "q", "s"} <= offered
        assert not {"f", "c", "a", "l", "1", "9"} & offered
        for key in ("f", "c", "a", "l", "1"):
            await pilot.press(key)
        await pilot.pause()
        assert said == []
        footer = replay.export_screenshot()
        assert "Probe" not in footer and "Play/pause" in footer
