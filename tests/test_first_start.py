"""The first start: with nothing to watch the dashboard still runs and says how to go on; a profile that
cannot start says why in its column and stops there (never "starting" for ever), and the app offers what
works."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from screen import screen_text
from waiting import until_async

from tests.fake_pynvml import FakeNvml
from tui.lifecycle.profile_files import load_profiles
from tui.run.discovery import start_hints
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig


def make_app(tmp_path: Path, **config) -> EnginetopApp:
    return EnginetopApp(AppConfig(poll_interval_s=0.2, gpu_interval_s=0.5, host_interval_s=0.5,
                                  redraw_interval_s=0.2, screenshot_dir=tmp_path / "shots",
                                  gpu_sampler=lambda: GpuSampler(FakeNvml([])), **config))


CLONE = Path(__file__).resolve().parents[1]


@pytest.fixture
def in_clone(monkeypatch: pytest.MonkeyPatch) -> str:
    """A clone as people use it: in its folder, its venv not activated (`enginetop` is not on PATH; the
    clone's is .venv/bin/enginetop). The command a hint must name."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(CLONE)
    assert Path(sys.prefix) == CLONE / ".venv", "this suite runs in the clone's venv (make setup)"
    return ".venv/bin/enginetop"


def test_a_clone_names_its_own_enginetop_and_its_make_target(in_clone: str) -> None:
    watch, demo = start_hints()
    assert watch == f"watch an engine: `{in_clone} --engine NAME=http://HOST:PORT`"
    assert demo.startswith("start the demo: `make demo-llama`")
    assert start_hints("snapshot")[0] == f"watch an engine: `{in_clone} snapshot --engine NAME=http://HOST:PORT`"


async def test_with_no_engine_the_dashboard_says_how_to_point_it_at_one(tmp_path: Path,
                                                                       in_clone: str) -> None:
    notes = ["no engine found on this machine (asked: ...)", *start_hints()]
    app = make_app(tmp_path, notes=notes)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "no engine found on this machine" in text
        assert f"`{in_clone} --engine NAME=http://HOST:PORT`" in text
        assert "start the demo: `make demo-llama`" in text  # in a checkout; a wheel says `enginetop --demo`
        assert "no engines" in app.sub_title


def test_no_flags_and_no_discovery_say_how_to_go_on(monkeypatch: pytest.MonkeyPatch, in_clone: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import dashboard

    monkeypatch.setenv("ENGINETOP_DISCOVER_PORTS", "")
    targets, notes = dashboard._discovered(off=True)
    assert targets == [] and notes[0] == "no engine given, and --no-discover: nothing to watch"
    said = capsys.readouterr().err
    assert f"enginetop: watch an engine: `{in_clone} --engine NAME=http://HOST:PORT`" in said
    parser = argparse.ArgumentParser()
    dashboard.add_dashboard_args(parser)
    assert parser.parse_args([]).demo is None  # no flag: no demo
    assert parser.parse_args(["--demo"]).demo == "llama"


async def test_a_notification_shows_a_command_as_written(tmp_path: Path) -> None:
    """A toast is plain text: the extra in `pip install 'enginetop[demo]'` is not eaten as Rich markup."""
    app = make_app(tmp_path)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        app.notify("the demo model package is missing: run `pip install 'enginetop[demo]'`", timeout=30)
        await until_async(lambda: "enginetop[demo]" in screen_text(app), "the toast drawn", timeout=10,
                          every=0.1, pause=pilot.pause)


async def test_a_profile_that_cannot_start_says_why_and_stops_trying(tmp_path: Path) -> None:
    # Engines are off in this test (ENGINETOP_ENGINES=off): the demo profile fails before any engine exists,
    # as it does for a pip user who has not installed the demo.
    profile = load_profiles().get("demo-cpu-threads2")
    app = make_app(tmp_path, profiles=[profile])
    said: list[str] = []
    notify = app.notify

    def keep(message: str, **kwargs) -> None:
        said.append(message)
        notify(message, **kwargs)

    app.notify = keep  # type: ignore[method-assign]
    async with app.run_test(size=(200, 50)) as pilot:
        slot = app.slots[0]
        await until_async(lambda: slot.given_up is not None, "the start to fail", timeout=20, every=0.1,
                          pause=pilot.pause)
        state = app.store.engines[profile.name]
        assert state.sample is not None and state.sample.health == "down"
        assert state.sample.health_reason == "not running: demo-cpu-threads2 did not start (resolve failed)"
        given_up_at = state.sample.t
        await until_async(lambda: "resolve failed" in screen_text(app), "the column drawn", timeout=10,
                          every=0.1, pause=pilot.pause)
        for _ in range(8):  # ~4 poll intervals: the port is not polled, nothing says "starting"
            await pilot.pause(0.2)
        assert state.sample.t == given_up_at and state.sample.health == "down"
        text = screen_text(app)
        assert "not accepting connections" not in text and "starting" not in text
        # why, in the profile's column (wrapped within it; its probes panel stands beside it on the screen)
        assert "llama-server: engines are off" in text and "(ENGINETOP_ENGINES=off;" in text
        assert any("enginetop --engine NAME=http://HOST:PORT" in m or "running on this machine" in m
                   for m in said), said
        assert app.is_running  # the app goes on


def test_a_key_flag_for_no_engine_found_is_refused_not_dropped(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import dashboard
    from tui.run.targets import TargetError

    monkeypatch.setenv("ENGINETOP_TEST_KEY", "sk-never-shown")
    with pytest.raises(TargetError, match=r"API key given for llama: neither an --engine given nor an engine "
                                          r"found on this machine \(found: none\)") as refused:
        dashboard._discovered(True, None, ["llama=ENGINETOP_TEST_KEY"])
    assert "sk-never-shown" not in str(refused.value) + capsys.readouterr().err
