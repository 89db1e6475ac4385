"""A real llama-server in router mode (--models-dir with the demo Gemma under two names, and a broken file):
seen as one engine with a row per model, the loaded one's figures read, the failed load with its exit code,
and the unloaded one never loaded by looking: not by minutes' worth of polls, nor by snapshots, nor by a
recording, nor by the exporter's probes, nor by the dashboard."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.waiting import until
from tui.base.paths import runs_dir
from tui.base.process import free_port, launch, stop_group
from tui.engines.llamacpp import demo_model_path, llama_server_binary
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.sources.engine_source import EngineSource

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def router(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("gemma-a", "gemma-b"):
        os.symlink(demo_model_path(), models / f"{name}.gguf")
    (models / "broken.gguf").write_bytes(b"GGUF" + bytes(64))  # a model whose load fails
    port = free_port()
    argv = [str(llama_server_binary()), "--models-dir", str(models), "--host", "127.0.0.1",
            "--port", str(port), "--metrics", "--ctx-size", "2048"]
    launched = launch(argv, runs_dir() / f"test-router-{port}.log")
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        until(up, "the router answering", timeout=60)
        yield url
    finally:
        stop_group(launched)


def failed(url: str) -> bool:
    return any(m["status"].get("failed") for m in httpx.get(url + "/models", timeout=5).json()["data"])


def statuses(url: str) -> dict[str, str]:
    """Straight from the router (GET /models loads nothing)."""
    return {m["id"]: m["status"]["value"] for m in httpx.get(url + "/models", timeout=5).json()["data"]}


async def test_a_router_is_one_engine_with_a_row_per_model_and_looking_loads_nothing(router, tmp_path):
    async with httpx.AsyncClient(timeout=120) as client:  # the user's request loads gemma-a
        reply = await client.post(router + "/v1/chat/completions", json={
            "model": "gemma-a", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        assert reply.status_code == 200
        assert (await client.post(router + "/models/load", json={"model": "broken"})).status_code == 200
    until(lambda: failed(router), "the broken model's load to fail", timeout=30)
    assert statuses(router) == {"broken": "unloaded", "gemma-a": "loaded", "gemma-b": "unloaded"}
    target = EngineTarget("router", router)
    transports = Transports()
    source = EngineSource(target, transports, interval_s=0.1)
    try:
        seen = [s for _ in range(240) for s in await source.read()]  # four minutes of 1 Hz polls, in seconds
    finally:
        await transports.aclose()
    last = seen[-1]
    assert last.health == "up" and last.model == "router: 3 models, 1 loaded"
    broken, a, b = last.models
    assert (a.id, a.status, b.id, b.status) == ("gemma-a", "loaded", "gemma-b", "unloaded")
    assert (broken.status, broken.failed, broken.exit_code) == ("unloaded", True, 1)
    assert a.reading is not None and a.reading.generation_tokens_total >= 8 and b.reading is None
    assert a.slots is not None and len(a.slots.slots) == 4 and b.slots is None
    assert all(s.models is not None for s in seen)  # every poll after the first went straight to /models
    snapshot = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--engine", f"router={router}",
                               "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    models = orjson.loads(snapshot.stdout)["engines"]["router"]["models"]
    assert [(m["id"], m["status"]) for m in models] == [("broken", "unloaded"), ("gemma-a", "loaded"),
                                                         ("gemma-b", "unloaded")]
    assert models[0]["failed"] and models[1]["slots"]["slots"] and "reading" not in models[2]
    recording = tmp_path / f"router{SUFFIX}"
    record = subprocess.run([sys.executable, "-m", "tui", "record", "--engine", f"router={router}", "-o",
                             str(recording), "--duration", "3"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert record.returncode == 0, record.stderr[-2000:]
    rows = [r for r in Recording(recording).rows() if r.kind == "engine"]
    assert rows and rows[-1].item.models[2].status == "unloaded"  # recorded, and replayed from the file
    port = free_port()  # the exporter probes the router as it is: its probes name no model, and load none
    exporter = subprocess.Popen([sys.executable, "-m", "tui", "exporter", "--engine", f"router={router}",
                                 "--probe-every", "1", "--jitter", "0", "--rounds", "2", "--listen",
                                 f"127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        def probed() -> bool:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return False
            return 'enginetop_probe_up{engine="router"}' in text
        until(probed, "the exporter's probes of the router", timeout=60)
    finally:
        exporter.terminate()
        exporter.wait(10)
    app = make_app([target], tmp_path)
    async with app.run_test(size=(180, 60)) as pilot:
        await wait_for(pilot, lambda: "gen tok/s" in screen_text(app) and "gemma-b" in screen_text(app),
                       what="the router's model rows")
        text = screen_text(app)
        assert "3 models, 1 loaded" in text and "unloaded" in text and "failed to load (exit code 1)" in text
        await asyncio.sleep(2)
    # nothing woke gemma-b, nor tried broken again
    assert statuses(router) == {"broken": "unloaded", "gemma-a": "loaded", "gemma-b": "unloaded"}
