"""The dashboard records what its store takes, names the file in the subtitle, and keeps running with a
visible warning when the disk fills up."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.fake_pynvml import FakeNvml, h200
from tui.app import AppConfig, EnginetopApp
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.record.writer import Recorder
from tui.sources.gpu import GpuSampler


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
        await pilot.pause(0.2)
        assert f"recording to {path}" in app.sub_title
        app.notify("something the user was warned about", severity="warning")
        deadline = time.monotonic() + 10
        while recorder.rows < 20 and time.monotonic() < deadline:
            await pilot.pause(0.2)
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
            deadline = time.monotonic() + 60
            while recorder.error is None and time.monotonic() < deadline:
                await pilot.pause(0.2)
            assert recorder.error and "disk full" in recorder.error
            await pilot.pause(0.5)  # a redraw
            assert "RECORDING STOPPED: disk full" in app.sub_title
            assert any("disk full" in m for m in said)
            shown = app.store.gpu.t if app.store.gpu else None
            await pilot.pause(0.5)
            assert app.is_running and app.store.gpu is not None and app.store.gpu.t != shown  # still polling
        recorder.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
