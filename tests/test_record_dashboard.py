"""The dashboard records what its store takes, names the file in the subtitle, and keeps running with a
visible warning when the disk fills up."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fake_pynvml import FakeNvml, h200
from tests.test_dashboard import wait_for
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.record.writer import Recorder
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig


def make_app(recorder: Recorder) -> EnginetopApp:
    nvml = FakeNvml([h200()])
    nvml.set_clock_event_mask(0, 0x4)  # a power cap: the alert path and the throttle flag are exercised
    return EnginetopApp(AppConfig(gpu_interval_s=0.05, host_interval_s=0.05, redraw_interval_s=0.1,
                                  gpu_sampler=lambda: GpuSampler(nvml), recorder=recorder))


async def test_dashboard_records_its_samples_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / f"d{SUFFIX}"
    recorder = Recorder(path)
    app = make_app(recorder)
    async with app.run_test(size=(150, 45)) as pilot:
        await wait_for(pilot, lambda: f"recording to {path}" in app.sub_title, what="the file named")
        app.notify("something the user was warned about", severity="warning")
        await wait_for(pilot, lambda: recorder.rows >= 20, timeout=10, what="20 rows recorded")
    recorder.close()
    rows = list(Recording(path).rows())
    kinds = {r.kind for r in rows}
    assert {"gpu", "host", "event"} <= kinds
    assert any(r.kind == "gpu" and r.item.gpus[0].throttled for r in rows)
    alerts = [r.item for r in rows if r.kind == "event" and r.item.kind == "alert"]
    assert any("warned" in a.data["message"] for a in alerts)


async def test_disk_full_stops_recording_with_a_visible_warning_and_the_dashboard_goes_on(
        tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)], check=True)
    try:
        recorder = Recorder(mnt / f"d{SUFFIX}")
        app = make_app(recorder)
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: (  # type: ignore[method-assign]
            said.append(message), notify(message, **kw))
        async with app.run_test(size=(150, 45)) as pilot:
            await wait_for(pilot, lambda: recorder.error is not None, timeout=60, what="the disk full")
            assert recorder.error and "disk full" in recorder.error
            await wait_for(pilot, lambda: "RECORDING STOPPED: disk full" in app.sub_title, what="a redraw")
            assert any("disk full" in m for m in said)
            shown = app.store.gpu.t if app.store.gpu else None
            await wait_for(pilot, lambda: app.store.gpu is not None and app.store.gpu.t != shown,
                           what="still polling")
            assert app.is_running
        recorder.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


async def test_dashboard_sweep_and_ab_are_recorded_and_shown_again(llama_server, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """The real llama-server on two columns: `c` sweeps them, `a` runs an A/B between them. The recording
    holds every sweep level and the A/B verdicts; the report lists them; the replay says the A/B's end as
    the dashboard said it (sweep levels are shown by the report only: a replay has no sweep screen)."""
    from html import escape as html_escape

    from tests.test_dashboard import make_app as dashboard_app
    from tests.test_replay_notices import capture
    from tui.cli.main import main
    from tui.compare.ab import ABConfig
    from tui.model.events import Event
    from tui.model.targets import EngineTarget
    from tui.probe.sweep import SweepConfig
    from tui.probe.workloads import WorkloadParams
    from tui.ui.replay import ReplayApp
    from tui.ui.screens.sweep import SweepScreen

    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path / "cache"))  # where the A/B saves its files
    path = tmp_path / f"dash{SUFFIX}"
    recorder = Recorder(path)
    app = dashboard_app([EngineTarget("A", llama_server.url), EngineTarget("B", llama_server.url)], tmp_path)
    app.recorder = recorder
    app.store.listeners.append(recorder)
    app.config.sweep = SweepConfig(levels=(1, 2), requests_per_stream=1, duration_s=None,
                                   params=WorkloadParams(max_tokens=16))
    app.config.ab = ABConfig(instances=2, blocks=2, requests_per_block=1, max_tokens=12, warmup_requests=0,
                             mode="coresident", bootstrap_samples=200)
    told = capture(app)
    async with app.run_test(size=(200, 60)) as pilot:
        states = app.store.engines.values()
        await wait_for(pilot, lambda: all(s.sample and s.sample.health == "up" for s in states), timeout=30,
                       what="both columns up")
        await pilot.press("c")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen,
                                what="the sweep screen")
        await wait_for(pilot, lambda: screen.status["A"] == "done" and screen.status["B"] == "done",
                       timeout=180, what="the sweep of both columns")
        swept = {name: [lv.to_json() for lv in levels] for name, levels in screen.levels.items()}
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SweepScreen), what="the sweep screen closed")
        await pilot.press("a")
        run = await wait_for(pilot, lambda: app.ab_run, what="the A/B run started")
        await wait_for(pilot, lambda: run.done, timeout=240, what="the A/B run")
        await wait_for(pilot, lambda: any(m == run.summary() for _, m, _ in told), timeout=10,
                       what="the dashboard saying the A/B is done")
    recorder.close()  # writes what is queued
    assert run.error is None, run.error
    comparisons = run.result["analysis"]["comparisons"]
    assert comparisons

    rec = Recording(path)
    events = [r.item for r in rec.rows(kinds=("event",))]
    levels = [e for e in events if e.kind == "sweep-level"]
    assert {(e.source, e.data["level"]) for e in levels} == {("A", 1), ("A", 2), ("B", 1), ("B", 2)}
    for e in levels:  # each level as the sweep screen showed it
        assert e.data == next(lv for lv in swept[e.source] if lv["level"] == e.data["level"])
        assert e.data["ok"] == e.data["requests"] and e.data["aggregate_tps"] > 0
    (ab,) = [e for e in events if isinstance(e, Event) and e.kind == "ab"]
    assert ab.data["summary"] == run.summary() and ab.data["error"] is None
    assert [v["verdict"] for v in ab.data["verdicts"]] == [c["verdict"] for c in comparisons]

    out = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    html = out.read_text()
    assert "4 level(s) measured" in html
    for c in comparisons:
        assert html_escape(c["verdict"]) in html

    replay = ReplayApp(Recording(path), start=ab.t - 3.0)
    said = capture(replay)
    async with replay.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: any(m == run.summary() for _, m, _ in said), timeout=20,
                       what="the replay saying the A/B's end")
    assert [n for n in said if n[0] == "A/B"] == [("A/B", run.summary(), "information")]
