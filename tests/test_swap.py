"""llama-swap, through a loopback stand-in that answers as its source does (tests/swap_server.py; llama-swap
itself is in no package registry), with real llama-server upstreams: recognised from /running, a row per
model with its state, the requests in flight from its event stream, the figures of a ready model through
/upstream/{model}/, and nothing started by looking; switching through its API with the same verified steps;
a llama-swap that restarts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.waiting import until
from tui.base.paths import runs_dir
from tui.base.process import free_port, pid_alive, port_listeners
from tui.engines.install_llamacpp import demo_model_path, llama_server_binary
from tui.lifecycle.profile_files import parse_profile
from tui.lifecycle.switch import EngineManager
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_source import EngineSource

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]


class StandIn:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        upstream = [str(llama_server_binary()), "--host", "127.0.0.1", "--port", "${PORT}", "--metrics",
                    "--ctx-size", "1024", "--parallel", "2", "--threads", "1"]
        self.models = {name: [*upstream, "-m", str(demo_model_path()), "--alias", name]
                       for name in ("gemma-a", "gemma-b")}
        self.models["broken"] = [*upstream, "-m", "/nonexistent/model.gguf"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.swap_server", "--port", str(self.port), "--models",
             json.dumps(self.models), "--profiles", json.dumps({"fast": {"chat": "gemma-a"}}),
             "--log-dir", str(runs_dir())], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        until(self.up, "the llama-swap stand-in answering", timeout=30)

    def up(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)

    def running(self) -> dict[str, str]:
        return {r["model"]: r["state"] for r in httpx.get(self.url + "/running", timeout=5).json()["running"]}


@pytest.fixture
def swap():
    stand_in = StandIn()
    stand_in.start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


async def test_llama_swap_is_seen_model_by_model_and_looking_starts_nothing(swap):
    source = EngineSource(EngineTarget("swap", swap.url), Transports(), interval_s=0.1, timeout_s=2.0)
    seen = [s for _ in range(30) for s in await source.read()]
    last = seen[-1]
    assert last.health == "up" and last.model == "llama-swap: 3 models, 0 ready"
    assert all(s.router == "llama-swap" for s in seen[1:])  # told apart by kind, not by the summary's words
    assert [(m.id, m.status, m.in_flight) for m in last.models] == [
        ("broken", "stopped", 0), ("gemma-a", "stopped", 0), ("gemma-b", "stopped", 0)]
    snapshot = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--engine", f"swap={swap.url}",
                               "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    models = orjson.loads(snapshot.stdout)["engines"]["swap"]["models"]
    assert [m["status"] for m in models] == ["stopped"] * 3
    assert swap.running() == {}  # looking started nothing

    async with httpx.AsyncClient(timeout=120) as client:  # a user's request starts gemma-b
        request = asyncio.create_task(client.post(swap.url + "/v1/chat/completions", json={
            "model": "gemma-b", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 150, "ignore_eos": True}))
        async def decoding() -> bool:
            [sample] = await source.read()
            b = sample.models[2]
            return b.status == "ready" and b.in_flight == 1 and b.slots is not None and \
                any(s.processing for s in b.slots.slots)
        for _ in range(600):
            if await decoding():
                break
            await asyncio.sleep(0.1)
        [sample] = await source.read()
        a, b = sample.models[1], sample.models[2]
        assert sample.model == "llama-swap: 3 models, 1 ready"
        assert (b.status, b.in_flight) == ("ready", 1) and b.oldest_ms is not None and b.oldest_ms > 0
        assert b.reading is not None and b.reading.dialect == "llamacpp"
        assert a.status == "stopped" and a.reading is None
        assert (await request).status_code == 200
    assert swap.running() == {"gemma-b": "ready"}  # gemma-a was never started by the polls


def profile(tmp_path: Path, url: str, model: str, extra: str = ""):
    path = tmp_path / f"swap-{model}.toml"
    port = url.rsplit(":", 1)[1]
    path.write_text(f'name = "swap-{model}"\nengine = "llama.cpp"\nport = {port}\nrouter_model = "{model}"\n'
                    "start_timeout_s = 90\ndrain_timeout_s = 30\n" + extra)
    loaded, issues = parse_profile(path.read_text(), path)
    assert loaded is not None, issues
    return loaded


def test_switching_through_llama_swap_stops_waits_starts_and_probes(swap, tmp_path):
    manager = EngineManager(record_state=False)
    first = manager.switch(profile(tmp_path, swap.url, "gemma-a"))
    assert first.ok, first.message
    steps = {s.name: (s.status, s.message) for s in first.steps}
    assert "llama-swap at" in steps["resolve"][1] and "has gemma-a (stopped)" in steps["resolve"][1]
    assert steps["start"] == ("ok", f"llama-swap at {swap.url} is loading gemma-a")
    assert steps["ready"][0] == "ok"
    assert "gemma-a loaded and answers a 1-token completion" in steps["ready"][1]
    upstream = swap_processes(swap.url, "gemma-a")

    no_such = manager.switch(profile(tmp_path, swap.url, "gemma-b", 'swap_profile = "nope"\n'))
    assert not no_such.ok and no_such.failed_step == "resolve"
    assert "llama-swap has no profile 'nope' (it has: fast)" in no_such.message
    assert swap.running() == {"gemma-a": "ready"}  # refused before anything was stopped

    second = manager.switch(profile(tmp_path, swap.url, "gemma-b", 'swap_profile = "fast"\n'))
    assert second.ok, second.message
    assert httpx.get(swap.url + "/api/profiles", timeout=5).json()["active"] == "fast"
    steps = {s.name: (s.status, s.message) for s in second.steps}
    assert "and profile fast" in steps["resolve"][1]
    assert steps["stop"] == ("ok", f"llama-swap at {swap.url} accepted the unload of gemma-a")
    assert steps["drain"][1].startswith(f"gemma-a unloaded, its process {upstream} gone")
    assert not pid_alive(upstream)
    assert swap.running() == {"gemma-b": "ready"}

    unknown = manager.switch(profile(tmp_path, swap.url, "nope"))
    assert not unknown.ok and unknown.failed_step == "resolve"
    assert "llama-swap at" in unknown.message and "has no model 'nope' (it has: broken, gemma-a, gemma-b)" \
        in unknown.message
    broken = manager.switch(profile(tmp_path, swap.url, "broken"))
    assert not broken.ok and broken.failed_step == "ready"
    assert "llama-swap could not start broken: HTTP 502 (unable to start process: upstream command exited " \
        "prematurely with code 1)" in broken.message
    assert swap.running() == {}


def swap_processes(url: str, model: str) -> int:
    """The upstream llama-server: what listens on the port of /running's proxy URL."""
    running = httpx.get(url + "/running", timeout=5).json()["running"]
    proxy = next(r["proxy"] for r in running if r["model"] == model)
    [proc] = port_listeners(int(proxy.rsplit(":", 1)[1]))
    return proc.pid


async def test_a_llama_swap_that_restarts_reads_down_then_its_models_again(swap):
    source = EngineSource(EngineTarget("swap", swap.url), Transports(), interval_s=0.2, timeout_s=2.0)
    [before] = await source.read()
    assert before.models is not None
    swap.stop()
    [gone] = await source.read()
    assert gone.health == "down" and "connection refused" in gone.health_reason and gone.models is None
    swap.start()
    [back] = await source.read()
    assert back.health == "up" and back.model == "llama-swap: 3 models, 0 ready"
