"""Snapshot tests (pytest-textual-snapshot): the dashboard, the fleet table, a replay, the A/B screen and the
help screen, drawn at fixed sizes from recorded data, compared with the SVGs in tests/__snapshots__/.

Everything drawn comes from a recording or a saved result, so the picture is the same on every machine; a
change to what the screens show makes these fail until the new pictures are looked at and accepted
(`.venv/bin/pytest tests/test_snapshots.py --snapshot-update`, then `git diff tests/__snapshots__`).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_record_file import engine_sample, gpu_report, host_sample, probe

from tui.compare.ab import ABConfig, Arm
from tui.compare.abrun import ABRun
from tui.model.config import EngineConfig
from tui.model.findings import TrafficFacts
from tui.model.samples import EngineReading, EngineSample, GpuReport
from tui.model.traffic import TrafficSample, TrafficStats
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.record.writer import Recorder
from tui.ui.config import AppConfig
from tui.ui.replay import ReplayApp
from tui.ui.screens.ab import ABScreen

DATA = Path(__file__).parent / "data"
T0 = 1000.0
WALL0 = 1.7e9


# What the engines were set to, as read from them: llama-server with -np 4 -c 4096 (four slots of 1,024),
# a vLLM with its prefix cache switched off
LLAMA_CONFIG = EngineConfig(
    engine="llama.cpp", read_wall=WALL0, version="b0-unknown", model="gemma-3-270m", context_tokens=1024,
    kv_pool_tokens=4096, slots=4, kv_unified=False, prefix_caching=True, kv_cache_dtype="f16",
    spec_type="off", sources=("/props", "/slots", "argv (PID 41)"))
VLLM_CONFIG = EngineConfig(
    engine="vLLM", read_wall=WALL0, version="0.32.0", model="gemma", context_tokens=2048,
    kv_pool_tokens=524288, prefix_caching=False, kv_cache_dtype="auto", block_size=128, spec_type="off",
    sources=("cache_config_info", "/v1/models", "/version"),
    lacks=("argv: the engine runs on another machine",))


def _traffic(i: int) -> TrafficSample:
    """The proxy in front of vLLM: agent turns that share their conversation, none of it served from cache."""
    facts = TrafficFacts(requests=20, shared_known=20, prompt_tokens=11_100, shared_tokens=5_632,
                         cached_tokens=0, prefill_s=11.8, prefill_source="engine timings",
                         longest_tokens=1_400)
    return TrafficSample("vllm", "http://127.0.0.1:8001", T0 + i, WALL0 + i,
                         TrafficStats(window_s=60.0, requests=20, requests_per_s=0.33, facts=facts))


def _llama(i: int) -> EngineSample:
    """llama-server under a steady load: 4 slots, ~60 tok/s, prompt cache hits from the second request on."""
    return EngineSample(
        name="llama", url="http://127.0.0.1:8080", t=T0 + i, wall=WALL0 + i, health="up",
        model="gemma-3-270m", reading=EngineReading(
            dialect="llamacpp", running=float(1 + i % 4), waiting=0.0,
            prompt_tokens_computed_total=40.0 * i, prompt_tokens_cached_total=160.0 * i,
            prompt_tokens_processed_total=200.0 * i, generation_tokens_total=60.0 * i,
            prefix_cache_queries_total=200.0 * i, prefix_cache_hits_total=160.0 * i,
            generation_seconds_total=1.0 * i, requests_finished_total=float(i // 2)), config=LLAMA_CONFIG)


@pytest.fixture(scope="module")
def engines_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two engines, a GPU that throttles every 10 s, the host, probes, a switch and a crash: 5 minutes."""
    path = tmp_path_factory.mktemp("snap") / f"engines{SUFFIX}"
    rec = Recorder(path, engines={"llama": "http://127.0.0.1:8080", "vllm": "http://127.0.0.1:8000"},
                   meta={"host": "snapshot-host"})
    for i in range(300):
        rec(_llama(i))
        rec(dataclasses.replace(engine_sample(i, T0), config=VLLM_CONFIG))
        rec(_traffic(i))
        rec(gpu_report(i, T0))
        if i % 2:
            rec(host_sample(i, T0))
        if i % 30 == 7:
            rec(probe(i, T0))
    rec.event("engine-state", "llama", {"state": "ready", "message": "up"}, t=T0 + 5)
    rec.close()
    return _fixed_clock(path)


@pytest.fixture(scope="module")
def fleet_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Prometheus' fleet: six engines on two nodes, one of them down, with their nodes' GPUs."""
    path = tmp_path_factory.mktemp("snap") / f"fleet{SUFFIX}"
    rec = Recorder(path, meta={"host": "snapshot-host", "fleet": "Prometheus http://prom:9090"})
    for i in range(60):
        for n in range(6):
            node = f"node-{n % 2}"
            sample = engine_sample(i * 5 + n, T0)
            down = n == 5
            rec(EngineSample(
                name=f"vllm-{n}", url=f"http://10.0.0.{n}:8000", t=T0 + i * 5, wall=WALL0 + i * 5,
                health="down" if down else "up", health_reason="connection refused" if down else None,
                model="Qwen3-8B", reading=None if down else sample.reading, job="vllm",
                instance=f"10.0.0.{n}:8000", host=node, labels=(("model_name", "Qwen3-8B"),)))
        [gpu] = gpu_report(i, T0).gpus
        rec(GpuReport(t=T0 + i * 5, driver_version=None, gpus=tuple(
            dataclasses.replace(gpu, t=T0 + i * 5, index=k, host=f"node-{k % 2}", uuid=f"GPU-{k}",
                                processes=())
            for k in range(4))))
    rec.close()
    return _fixed_clock(path)


def _fixed_clock(path: Path) -> Path:
    """The recording's wall clock set to WALL0 at T0 (a recorder takes it from the machine), shown in UTC."""
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'mono_to_wall'", (repr(WALL0 - T0),))
        db.execute("UPDATE rows SET wall = t + ?", (WALL0 - T0,))
    db.close()
    return path


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _replay_at(path: Path, seconds: float):
    app = ReplayApp(Recording(path), AppConfig(horizon_s=300))

    async def run_before(pilot) -> None:
        app.replay.paused = True
        app.replay.seek(app.replay.rec.start + seconds)
        app._moved()
        await pilot.pause()

    return app, run_before


def test_dashboard_of_two_engines(snap_compare, engines_recording: Path) -> None:
    app, run_before = _replay_at(engines_recording, 290)
    assert snap_compare(app, terminal_size=(200, 60), run_before=run_before)


def test_replay_at_a_small_terminal(snap_compare, engines_recording: Path) -> None:
    """The same recording at 120x40, earlier in it: the plots hold two minutes, the footer the replay keys."""
    app, run_before = _replay_at(engines_recording, 120)
    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_help_screen(snap_compare, engines_recording: Path) -> None:
    app, run_before = _replay_at(engines_recording, 60)
    assert snap_compare(app, press=["question_mark"], terminal_size=(120, 40), run_before=run_before)


def test_fleet_table(snap_compare, fleet_recording: Path) -> None:
    app, run_before = _replay_at(fleet_recording, 250)
    assert snap_compare(app, terminal_size=(220, 30), run_before=run_before)


def test_ab_screen_with_its_verdicts(snap_compare, engines_recording: Path) -> None:
    """A finished A/B run's screen over the dashboard, from a saved result (tests/data/ab_result.json)."""
    result = json.loads((DATA / "ab_result.json").read_text())

    class Saved:
        attached = False

    config = ABConfig(instances=2, blocks=2, requests_per_block=2, max_tokens=12, mode="coresident")
    run = ABRun([Arm(a["name"], Saved()) for a in result["arms"]], config, Path("ab-result"))
    run.messages = ["instance 1 of fast: started", "block 1: fast 3 requests", "done"]
    run.result, run.saved = result, [Path("ab-result.json"), Path("ab-result.html")]
    run._done.set()
    app, seek = _replay_at(engines_recording, 60)

    async def run_before(pilot) -> None:
        await seek(pilot)
        app.push_screen(ABScreen(run))
        await pilot.pause()

    assert snap_compare(app, terminal_size=(160, 50), run_before=run_before)
