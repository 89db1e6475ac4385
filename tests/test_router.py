"""A real llama-server in router mode (--models-dir with the demo Gemma under two names, and a broken file):
seen as one engine with a row per model, the loaded one's figures read, the failed load with its exit code,
and the unloaded one never loaded by looking: not by minutes' worth of polls, nor by snapshots, nor by a
recording, nor by the exporter's probes, nor by the dashboard."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import psutil
import pytest
from fake_pynvml import FakeNvml, h200

from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.waiting import until
from tui.base.paths import runs_dir
from tui.base.process import free_port, launch, pid_alive, stop_group
from tui.engines.install_llamacpp import demo_model_path, llama_server_binary
from tui.lifecycle.engine import launch_instance
from tui.lifecycle.profile_files import load_profiles, parse_profile, repo_profiles_dir, user_profiles_dir
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.router import model_processes
from tui.lifecycle.switch import EngineManager
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.record.reader import Recording
from tui.record.schema import SUFFIX
from tui.sources.engine_source import EngineSource
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.switch import ConfirmSwitch, SwitchProgress

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]


def start_router(models: Path, port: int):
    argv = [str(llama_server_binary()), "--models-dir", str(models), "--host", "127.0.0.1",
            "--port", str(port), "--metrics", "--ctx-size", "2048"]
    launched = launch(argv, runs_dir() / f"test-router-{port}.log")
    until(lambda: up(f"http://127.0.0.1:{port}"), "the router answering", timeout=60)
    return launched


def up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def router(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("gemma-a", "gemma-b"):
        os.symlink(demo_model_path(), models / f"{name}.gguf")
    (models / "broken.gguf").write_bytes(b"GGUF" + bytes(64))  # a model whose load fails
    port = free_port()
    launched = start_router(models, port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(launched)


def failed(url: str) -> bool:
    return any(m["status"].get("failed") for m in httpx.get(url + "/models", timeout=5).json()["data"])


def statuses(url: str) -> dict[str, str]:
    """Straight from the router (GET /models loads nothing)."""
    return {m["id"]: m["status"]["value"] for m in httpx.get(url + "/models", timeout=5).json()["data"]}


async def test_a_router_is_one_engine_with_a_row_per_model_and_looking_loads_nothing(router, tmp_path):
    # a connection per request: the router closes an idle kept-alive one, and a request sent on it as it
    # closes is lost ("Server disconnected without sending a response", seen on a loaded machine)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        # the user loads gemma-a and sends it a request
        # (loaded first: a request racing the load it triggers was once dropped by the router, seen here)
        assert (await client.post(router + "/models/load", json={"model": "gemma-a"})).status_code == 200
        until(lambda: statuses(router)["gemma-a"] == "loaded", "gemma-a loaded", timeout=60)
        reply = await client.post(router + "/v1/chat/completions", json={
            "model": "gemma-a", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        assert reply.status_code == 200
        assert (await client.post(router + "/models/load", json={"model": "broken"})).status_code == 200
    until(lambda: failed(router), "the broken model's load to fail", timeout=30)
    assert statuses(router) == {"broken": "unloaded", "gemma-a": "loaded", "gemma-b": "unloaded"}
    target = EngineTarget("router", router)
    transports = Transports()
    # polled back to back, but given the 2 s a 1 Hz poll has: at 0.1 s the deadline would be 0.2 s, and one
    # late answer on a loaded machine (the last of 240, seen in CI) is not what this test looks at
    source = EngineSource(target, transports, interval_s=0.1, timeout_s=2.0)
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
    assert {s.router for s in seen} == {"llama-server"}
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


def router_profile(tmp_path: Path, name: str, url: str, model: str, argv: list[str] | None = None):
    port = int(url.rsplit(":", 1)[1])
    text = f'name = "{name}"\nengine = "llama.cpp"\nport = {port}\nrouter_model = "{model}"\n'
    if argv is not None:
        text += "argv = [" + ", ".join(orjson.dumps(a).decode() for a in argv) + "]\n"
    path = tmp_path / f"{name}.toml"
    path.write_text(text + "start_timeout_s = 60\ndrain_timeout_s = 30\n")
    profile, issues = parse_profile(path.read_text(), path)
    assert profile is not None and not [i for i in issues if i.severity == "error"], issues
    return profile


def steps(result) -> dict[str, tuple[str, str]]:
    return {s.name: (s.status, s.message) for s in result.steps}


def test_switching_models_of_a_router_unloads_waits_loads_and_probes_each_step_named(router, tmp_path):
    a = router_profile(tmp_path, "router-a", router, "gemma-a")
    b = router_profile(tmp_path, "router-b", router, "gemma-b")
    nvml = FakeNvml([h200()])  # no GPU here: NVML scripted, the router and its children real
    manager = EngineManager(gpu=GpuSampler(nvml).sample, record_state=False)
    first = manager.switch(a)
    assert first.ok, first.message
    assert [s.name for s in first.steps] == ["resolve", "stop", "drain", "port", "start", "ready"]
    assert "has gemma-a (unloaded)" in steps(first)["resolve"][1]
    assert steps(first)["start"] == ("ok", f"the router at {router} is loading gemma-a")
    assert "gemma-a loaded and answers a 1-token completion" in steps(first)["ready"][1]
    assert statuses(router)["gemma-a"] == "loaded"
    [child] = model_processes(a, "gemma-a")
    assert psutil.Process(child).is_running()

    # gemma-a's process holds 3 GiB of GPU 0; the driver lets go of it 1.5 s after the process is gone
    nvml.gpus[0].compute_procs = [(child, 3 * 1024**3)]
    def driver() -> None:
        until(lambda: not pid_alive(child), "gemma-a's process gone", timeout=60)
        time.sleep(1.5)
        nvml.gpus[0].compute_procs = []
    released = threading.Thread(target=driver)
    released.start()
    second = manager.switch(b)
    released.join()
    assert second.ok, second.message
    assert steps(second)["stop"] == ("ok", f"the router at {router} accepted the unload of gemma-a")
    drain = next(s for s in second.steps if s.name == "drain")
    assert drain.message.startswith(f"gemma-a unloaded, its process {child} gone; GPU 0 VRAM used")
    assert drain.elapsed_s >= 1.5  # it waited for the GPU, not only for the process
    assert steps(second)["port"][0] == "skipped" and steps(second)["start"][0] == "ok"
    assert all(s.elapsed_s >= 0 for s in second.steps) and sum(s.elapsed_s for s in second.steps) > 0
    assert not pid_alive(child)
    assert {k: v for k, v in statuses(router).items() if k != "broken"} == {
        "gemma-a": "unloaded", "gemma-b": "loaded"}

    unknown = manager.switch(router_profile(tmp_path, "router-x", router, "nope"))  # refused, nothing stopped
    assert not unknown.ok and unknown.failed_step == "resolve"
    assert "has no model 'nope' (it has: broken, gemma-a, gemma-b)" in unknown.message
    assert statuses(router)["gemma-b"] == "loaded" and manager.current.profile.name == "router-b"

    broken = manager.switch(router_profile(tmp_path, "router-broken", router, "broken"))
    assert not broken.ok and broken.failed_step == "ready"
    assert "the router could not load broken: its process exited with code 1" in broken.message
    assert statuses(router)["gemma-b"] == "unloaded" and manager.current is None

    again = EngineManager(record_state=False)  # gemma-a loaded by a user's request before the switch
    httpx.post(router + "/models/load", json={"model": "gemma-a"}, timeout=10)
    until(lambda: statuses(router)["gemma-a"] == "loaded", "gemma-a loaded", timeout=60)
    adopted = again.switch(a)
    assert adopted.ok and "gemma-a was already loaded" in steps(adopted)["start"][1]


def test_up_switch_down_of_router_profiles_keep_one_router_and_stop_it_with_its_children(tmp_path):
    """The command line: `up` starts the router with gemma-a, `switch` changes the model and keeps the router
    (its record moves to the new profile), `down` stops the router and its child."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("gemma-a", "gemma-b"):
        os.symlink(demo_model_path(), models / f"{name}.gguf")
    url = f"http://127.0.0.1:{free_port()}"
    argv = [str(llama_server_binary()), "--models-dir", str(models), "--host", "127.0.0.1",
            "--port", "${PORT}", "--ctx-size", "1024", "--models-max", "1"]
    user_profiles_dir().mkdir(parents=True, exist_ok=True)
    for name, model in (("mine-a", "gemma-a"), ("mine-b", "gemma-b")):
        router_profile(user_profiles_dir(), name, url, model, argv)

    def cli(*args: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "tui", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return orjson.loads(done.stdout)

    up = cli("up", "mine-a")
    router_pid = up["pid"]
    try:
        switched = cli("switch", "mine-a", "mine-b")
        assert switched["pid"] == router_pid and switched["to"] == "mine-b"
        names = [(s["name"], s["status"]) for s in switched["steps"]]
        assert names == [("resolve", "ok"), ("stop", "ok"), ("drain", "ok"), ("port", "skipped"),
                         ("start", "ok"), ("ready", "ok")]
        assert statuses(url) == {"gemma-a": "unloaded", "gemma-b": "loaded"}
        [child] = model_processes(router_profile(tmp_path, "probe", url, "gemma-b"), "gemma-b")
        # another column asks for gemma-a: the router (--models-max 1) has to evict gemma-b, and says so
        other = EngineManager(record_state=False).switch(router_profile(tmp_path, "other", url, "gemma-a"))
        assert other.ok, other.message
        evicts = "it holds 1 of its limit of 1 models (gemma-b), so it unloads the least recently used one"
        assert steps(other)["start"] == ("ok", f"the router at {url} is loading gemma-a; {evicts}")
        until(lambda: statuses(url) == {"gemma-a": "loaded", "gemma-b": "unloaded"}, "gemma-b evicted")
    finally:
        down = cli("down", "mine-b")
    assert down["ok"], down
    assert not pid_alive(router_pid) and not pid_alive(child)


async def test_the_dashboard_switches_the_demo_router_with_the_switch_keys_and_shows_its_slots(tmp_path):
    port = free_port()  # both demo router profiles on one port: one router, two models
    out = tmp_path / "profiles"
    out.mkdir()
    for name in ("demo-router-gemma-a", "demo-router-gemma-b"):
        text = (repo_profiles_dir() / f"{name}.toml").read_text()
        (out / f"{name}.toml").write_text(re.sub(r"(?m)^port = \d+", f"port = {port}", text))
    profiles = load_profiles([out])
    a, b = profiles.get("demo-router-gemma-a"), profiles.get("demo-router-gemma-b")
    app = EnginetopApp(AppConfig(profiles=[a], switchable=[a, b], poll_interval_s=0.5, redraw_interval_s=0.25,
                                 probe_max_tokens=400, screenshot_dir=tmp_path / "shots"))
    try:
        async with app.run_test(size=(200, 70)) as pilot:
            slot = app.slots[0]
            await wait_for(pilot, lambda: slot.status and slot.status.state == "ready", timeout=120,
                           what="the router up with gemma-a loaded")
            await wait_for(pilot, lambda: "last used" in screen_text(app) or "not used" in screen_text(app),
                           what="gemma-a's row")
            await pilot.press("f")  # the probe names the profile's model, so it lands on gemma-a
            await wait_for(pilot, lambda: "decoding" in screen_text(app), timeout=60,
                           what="a slot of gemma-a decoding the probe")
            text = screen_text(app)
            assert "2 models, 1 loaded" in text and "processing" in text
            await wait_for(pilot, lambda: "last used" in screen_text(app), what="gemma-a used")
            await wait_for(pilot, lambda: app.store.engines[a.name].probes, timeout=60, what="the probe")
            [(_, probe)] = app.store.engines[a.name].probes
            assert probe.ok, probe.error

            await pilot.press("2")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmSwitch), what="the confirmation")
            assert "The router keeps running. This unloads gemma-a" in app.screen.question
            await pilot.press("y")
            progress = await wait_for(pilot, lambda: isinstance(app.screen, SwitchProgress) and app.screen,
                                      what="the switch's progress")
            await wait_for(pilot, lambda: progress.done is not None, timeout=120, what="switch done")
            statuses_seen = {name: e.status for name, e in progress.events.items()}
            assert statuses_seen == {"resolve": "ok", "stop": "ok", "drain": "ok", "port": "skipped",
                                     "start": "ok", "ready": "ok"}, progress.events
            assert "gemma-a unloaded, its process" in progress.events["drain"].message
            await pilot.press("escape")
            await wait_for(pilot, lambda: slot.status.profile == b.name, what="B current")
            url = f"http://127.0.0.1:{port}"
            assert statuses(url) == {"gemma-a": "unloaded", "gemma-b": "loaded"}
    finally:
        app.stop_managed()
    assert not up(f"http://127.0.0.1:{port}")  # the router enginetop started is stopped on quit


def gemma_a_router(tmp_path: Path):
    """A router with one model, gemma-a (the demo model): its models dir, port and process."""
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(demo_model_path(), models / "gemma-a.gguf")
    port = free_port()
    return models, port, start_router(models, port)


async def test_a_router_that_restarts_reads_down_then_its_models_again(tmp_path, llama_server):
    models, port, launched = gemma_a_router(tmp_path)
    url = f"http://127.0.0.1:{port}"
    source = EngineSource(EngineTarget("router", url), Transports(), interval_s=0.2, timeout_s=2.0)
    try:
        [before] = await source.read()
        assert before.model == "router: 1 model, 0 loaded"
        manager = EngineManager(record_state=False)  # the column watched a model of this router
        manager.adopt(launch_instance(resolve(router_profile(tmp_path, "r-a", url, "gemma-a"))))
        stop_group(launched)
        [gone] = await source.read()
        assert gone.health == "down" and "connection refused" in gone.health_reason and gone.models is None
        other = tmp_path / "other.toml"  # a switch away from the dead router is not blocked by it
        other.write_text(f'name = "other"\nengine = "llama.cpp"\nport = {llama_server.port}\n')
        away = manager.switch(parse_profile(other.read_text(), other)[0])
        assert away.ok, away.message
        assert steps(away)["stop"] == ("skipped", f"nothing answers at {url} any more: gemma-a is not loaded")
        launched = start_router(models, port)
        [back] = await source.read()
        assert back.health == "up" and back.model == "router: 1 model, 0 loaded"
    finally:
        stop_group(launched)


async def test_a_loading_models_progress_comes_from_the_routers_event_stream(tmp_path):
    """While a model loads, the poller follows GET /models/sse (the only place the router says how far a load
    is) and the row carries it; once nothing loads, the stream is dropped. The demo model loads in about a
    second, so the load is repeated (at most three times) until the stream was seen in time."""
    _, port, launched = gemma_a_router(tmp_path)
    url = f"http://127.0.0.1:{port}"
    source = EngineSource(EngineTarget("router", url), Transports(), interval_s=0.05, timeout_s=2.0)
    seen: list[tuple[str, float | None]] = []
    try:
        await source.read()
        for _ in range(3):
            httpx.post(url + "/models/load", json={"model": "gemma-a"}, timeout=10)
            for _ in range(200):
                [sample] = await source.read()
                seen.append((sample.models[0].status, sample.models[0].progress))
                if sample.models[0].status == "loaded":
                    break
                await asyncio.sleep(0.05)
            if any(p is not None for _, p in seen):
                break
            httpx.post(url + "/models/unload", json={"model": "gemma-a"}, timeout=10)
            until(lambda: statuses(url)["gemma-a"] == "unloaded", "gemma-a unloaded", timeout=30)
        assert any(status == "loading" and p is not None and 0 <= p <= 1 for status, p in seen), seen
        assert not source.following  # loaded: the stream was dropped
    finally:
        await source.aclose()
        stop_group(launched)
