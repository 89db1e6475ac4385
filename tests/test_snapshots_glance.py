"""The dashboard read at a glance, at the sizes people run a top in (80×24, 120×40, 200×55), for one, two and
eight engines: one engine uses the width, two to four are columns, more are a line each; at 80×24 the plots
give way to the figures. Drawn from recordings made here, so the picture is the same on every machine
(`.venv/bin/pytest tests/test_snapshots_glance.py --snapshot-update`, then look at the SVGs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_record_file import engine_sample, gpu_report, host_sample
from test_snapshots import T0, VLLM_CONFIG, _fixed_clock, _llama, _replay_at, _utc  # noqa: F401

from tui.record.schema import SUFFIX
from tui.record.writer import Recorder

SIZES = [(80, 24), (120, 40), (200, 55)]


def _recording(directory: Path, engines: int) -> Path:
    """`engines` engines, llama-servers and vLLMs in turn, under a steady load for 200 s, with the GPU and
    the host."""
    path = directory / f"glance-{engines}{SUFFIX}"
    names = {f"engine-{k}": f"http://127.0.0.1:{8000 + k}" for k in range(engines)}
    rec = Recorder(path, engines=names, meta={"host": "snapshot-host"})
    for i in range(200):
        for k, (name, url) in enumerate(names.items()):
            sample = _llama(i) if k % 2 == 0 else \
                dataclasses.replace(engine_sample(i, T0), config=VLLM_CONFIG)
            rec(dataclasses.replace(sample, name=name, url=url))
        rec(gpu_report(i, T0))
        if i % 2:
            rec(host_sample(i, T0))
    rec.close()
    return _fixed_clock(path)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    directory = tmp_path_factory.mktemp("glance")
    return {n: _recording(directory, n) for n in (1, 2, 8)}


@pytest.mark.parametrize("engines", [1, 2, 8])
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_dashboard_at_a_glance(snap_compare, recordings: dict[int, Path], engines: int,
                                   size: tuple[int, int]) -> None:
    app, run_before = _replay_at(recordings[engines], 190)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


async def test_slash_filters_a_dashboard_of_many_engines(recordings: dict[int, Path]) -> None:
    """Eight engines are a line each; `/` filters them as the fleet table does (every word must match the
    name, model, state or a finding), `q` typed into the filter is a letter, escape leaves the filter and
    then clears it."""
    from textual.widgets import Input

    from tui.ui.screens.dashboard import Dashboard
    from widgets.engine_panel import EnginePanel

    app, run_before = _replay_at(recordings[8], 190)
    async with app.run_test(size=(120, 40)) as pilot:
        await run_before(pilot)
        board = app.query_one(Dashboard)
        assert board.rows

        def shown() -> list[str]:
            return [p.engine_name for p in app.query(EnginePanel) if p.display]

        assert len(shown()) == 8
        assert not isinstance(app.focused, Input), app.focused
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"engine", "minus", "3")
        await pilot.pause()
        assert shown() == ["engine-3"]
        await pilot.press("q")  # a letter in the filter, not quit
        await pilot.pause()
        assert app.is_running and shown() == [] and app.query_one("#no-match").display
        await pilot.press("backspace", "escape")  # leave the filter: it stays
        await pilot.pause()
        assert shown() == ["engine-3"] and not isinstance(app.focused, Input)
        await pilot.press("escape")  # outside it: cleared
        await pilot.pause()
        assert len(shown()) == 8 and not app.query_one("#no-match").display
        # a model's name matches too (the vLLMs' "gemma", not the llama-servers' "gemma-3-270m"); a filter
        # that matches nothing is left all the same, and q then quits
        await pilot.press("slash", *"gemma", "space", "u", "p")
        await pilot.pause()
        assert len(shown()) == 8
        await pilot.press("backspace", "backspace", "backspace", "minus", "3")
        await pilot.pause()
        assert shown() == ["engine-0", "engine-2", "engine-4", "engine-6"]
        await pilot.press("z", "escape")
        await pilot.pause()
        assert shown() == [] and not isinstance(app.focused, Input)
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running
