"""The keys every screen of every app answers as htop and nvitop do: `q` quits, or closes the screen over the
dashboard, unless the focus is in a text field; `/` opens the filter where there is one; `escape` leaves a
field; the footer of every screen names the key that quits or closes it. A Pilot walks each screen."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets import Footer, Input

from tests.fake_pynvml import FakeNvml, h200
from tests.test_snapshots import engines_recording, fleet_recording  # noqa: F401 (fixtures)
from tests.waiting import until_async
from tui.compare.ab import ABConfig, Arm
from tui.compare.abrun import ABRun
from tui.model.targets import EngineTarget
from tui.probe.sweep import SweepConfig
from tui.record.reader import Recording
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.replay import ReplayApp
from tui.ui.screens.ab import ABScreen
from tui.ui.screens.engine_detail import EngineDetailScreen
from tui.ui.screens.fleet import EngineScreen, FleetView, GpusScreen
from tui.ui.screens.goto import GotoScreen
from tui.ui.screens.help import HelpScreen
from tui.ui.screens.logs import LogScreen
from tui.ui.screens.sweep import SweepScreen
from tui.ui.screens.switch import ConfirmSwitch, SwitchProgress
from widgets.engine_panel import EnginePanel

DATA = Path(__file__).parent / "data"
DEAD = EngineTarget("dead", "http://127.0.0.1:9")  # nothing listens: the dashboard says so and goes on


def footer_says(app: App, *keys: str) -> None:
    """The screen has a footer, and among the keys it shows is one that quits or closes the screen."""
    assert app.screen.query(Footer), f"{type(app.screen).__name__} has no footer"
    shown = {b.binding.key for b in app.screen.active_bindings.values() if b.binding.show}
    shown = {k for key in shown for k in key.split(",")}
    assert shown & set(keys), (type(app.screen).__name__, sorted(shown))


async def closes_on_q(pilot, screen) -> None:
    app = pilot.app
    if app.screen is not screen:
        app.push_screen(screen)
        await pilot.pause()
    assert app.screen is screen
    footer_says(app, "q", "escape")
    await pilot.press("q")
    await until_async(lambda: app.screen is not screen, f"q to close {type(screen).__name__}", 5,
                      pause=pilot.pause)
    assert app.is_running


async def test_every_dashboard_screen_closes_on_q_and_the_dashboard_quits_on_it(tmp_path: Path) -> None:
    app = EnginetopApp(AppConfig(targets=[DEAD], poll_interval_s=0.5, redraw_interval_s=0.25,
                                 screenshot_dir=tmp_path, gpu_sampler=lambda: GpuSampler(FakeNvml([h200()]))))
    result = json.loads((DATA / "ab_result.json").read_text())

    class Saved:
        attached = False

    run = ABRun([Arm(a["name"], Saved()) for a in result["arms"]], ABConfig(instances=1, blocks=1),
                Path("ab-result"))
    run.result = result
    run._done.set()
    async with app.run_test(size=(160, 50)) as pilot:
        footer_says(app, "q")
        await closes_on_q(pilot, HelpScreen([("q", "Quit")]))
        await closes_on_q(pilot, LogScreen("log of nothing", None))
        await closes_on_q(pilot, ABScreen(run))
        await closes_on_q(pilot, SweepScreen([DEAD], app.probes, SweepConfig(levels=(1,), duration_s=0.2)))
        # enter on an engine's column: its every figure, refreshed; q closes it
        app.query_one(EnginePanel).focus()
        await pilot.press("enter")
        await until_async(lambda: isinstance(app.screen, EngineDetailScreen), "enter to open the detail", 5,
                          pause=pilot.pause)
        assert "dead: every figure" in str(app.screen.query_one(VerticalScroll).border_title)
        await closes_on_q(pilot, app.screen)
        # + and - poll faster and slower, within bounds; r starts the session's figures again
        source = app.slots[0].source
        await pilot.press("plus")
        assert source.interval_s == 0.25
        assert "polling every 0.25s" in app.sub_title  # the header follows the interval it polls at
        await pilot.press("plus")
        assert source.interval_s == 0.25  # the lower bound
        for _ in range(8):
            await pilot.press("minus")
        assert source.interval_s == 10.0  # the upper bound
        assert "polling every 10s" in app.sub_title
        footer_says(app, "plus,equals_sign", "minus", "r")
        app.store.engines["dead"].probes.append((1.0, None))
        await pilot.press("r")
        assert not app.store.engines["dead"].probes
        answers: list[bool | None] = []
        app.push_screen(ConfirmSwitch("switch dead → other?"), answers.append)
        await pilot.pause()
        footer_says(app, "q")
        await pilot.press("q")
        await pilot.pause()
        assert answers == [False]  # q answers no: nothing is switched
        cancel = threading.Event()
        progress = SwitchProgress("switching", cancel)
        app.push_screen(progress)
        await pilot.pause()
        footer_says(app, "q")
        await pilot.press("q")  # a switch in progress: q cancels it, as escape does, and the steps stay shown
        await pilot.pause()
        assert cancel.is_set() and app.screen is progress
        progress.finish("cancelled during step 'start'", False)
        await closes_on_q(pilot, progress)
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


async def test_the_fleet_table_quits_on_q_and_filters_after_slash(fleet_recording: Path) -> None:  # noqa: F811
    app = ReplayApp(Recording(fleet_recording), AppConfig(horizon_s=300.0))
    async with app.run_test(size=(200, 50)) as pilot:
        view = app.screen.query_one(FleetView)
        typed = view.query_one(Input)
        await until_async(lambda: view.table.row_count > 0, "the table", 10, pause=pilot.pause)
        assert app.focused is view.table and typed.value == ""
        footer_says(app, "q")
        await pilot.press("slash", "q", "u", "e", "e", "n")  # in the filter q is a letter
        await pilot.pause()
        assert app.focused is typed and typed.value == "queen" and app.is_running
        await pilot.press("escape")  # leaves the filter, which stays
        assert app.focused is view.table and typed.value == "queen"
        await pilot.press("escape")  # in the table: clears it
        assert typed.value == ""
        await pilot.press("enter")  # an engine opened from the table: q quits from there too
        await until_async(lambda: isinstance(app.screen, EngineScreen), "the engine", 5, pause=pilot.pause)
        footer_says(app, "q")
        await pilot.press("escape", "ctrl+g")
        await until_async(lambda: isinstance(app.screen, GpusScreen), "the GPUs", 5, pause=pilot.pause)
        footer_says(app, "q")
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


async def test_the_replay_quits_on_q_but_not_while_going_to_a_time(engines_recording: Path) -> None:  # noqa: F811
    app = ReplayApp(Recording(engines_recording), AppConfig(horizon_s=300.0))
    async with app.run_test(size=(160, 50)) as pilot:
        footer_says(app, "q")
        await pilot.press("g")
        await pilot.pause()
        assert isinstance(app.screen, GotoScreen)
        footer_says(app, "escape")
        await pilot.press("q")  # a text field: q is typed
        await pilot.pause()
        assert app.screen.query_one(Input).value == "q" and app.is_running
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, GotoScreen)
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running
