"""Engines in real Podman containers, read as fully as a bare process: the real llama-server (a published
port, a 1 GiB memory limit, a one-core quota, -np 2 only on its command line: tests/conftest.py
llama_container) and the session's real vLLM, which runs in a container for every test that uses it.

Found with no flags, through Podman's Docker-compatible API and without it through /proc; named after the
container; configuration from the engine's own command line (the host's port is conmon's); memory from the
engine's own processes; the container's limits and throttling; its log from the runtime; its GPU processes
mapped through the engine's host PIDs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_pynvml import FakeNvml, h200

from tui.model.targets import EngineTarget
from tui.sources.containers import shared_catalog, socket_paths
from tui.sources.discover import discover
from tui.sources.engine_source import LocalPids
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler

pytestmark = pytest.mark.engine
GiB = 2**30


@pytest.fixture
def api(podman_api, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The runtime's socket in DOCKER_HOST, as a user with Podman's service (or Docker) has it; the shared
    catalog asked afresh."""
    monkeypatch.setenv("DOCKER_HOST", podman_api.docker_host)
    shared_catalog().forget()
    yield podman_api.docker_host
    shared_catalog().forget()


@pytest.fixture
def no_socket(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("DOCKER_HOST", "CONTAINER_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert socket_paths() == [], "a runtime socket exists on this machine: this test reads /proc alone"
    shared_catalog().forget()
    yield
    shared_catalog().forget()


def _snapshot(url: str, docker_host: str | None, interval: float = 1.0, name: str = "c") -> dict:
    env = {**os.environ, "ENGINETOP_SYSFS_ROOT": "/sys"}  # the host's cgroups (the suite's is an empty tree)
    env.pop("DOCKER_HOST", None)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    done = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--interval", str(interval),
                           "--engine", f"{name}={url}"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["engines"][name]


def test_found_with_no_flags_through_the_runtimes_api(llama_container, api) -> None:
    found = {e.port: e for e in discover().engines}
    engine = found[llama_container.port]
    c = engine.container
    assert c is not None and engine.name == llama_container.name == c.name
    assert (engine.program, engine.how) == ("llama-server", "command line")
    assert engine.pid == llama_container.host_pid
    assert c.via == f"the podman API ({api.removeprefix('unix://')})"
    assert (c.runtime, c.state, c.memory_limit_bytes, c.cpu_limit) == ("podman", "running", GiB, 1.0)
    assert c.ports == (("127.0.0.1", llama_container.port, 8080),)
    assert f"llama-server pid {engine.pid} in podman container {c.name} on :{llama_container.port}, from " \
           "its command line" in engine.words()


def test_found_through_proc_without_a_socket(llama_container, no_socket) -> None:
    """No runtime socket: conmon holds the port, its command line names the container, its child is the
    engine."""
    engine = {e.port: e for e in discover().engines}[llama_container.port]
    assert engine.container is not None and engine.container.via == "/proc"
    assert engine.name == llama_container.name and engine.pid == llama_container.host_pid
    assert engine.container.runtime == "podman" and len(engine.container.id) == 64


def _generate(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            client.post(f"{url}/v1/completions", json={"prompt": "Count in words:", "max_tokens": 64,
                                                       "ignore_eos": True, "temperature": 0})


def test_read_as_fully_as_a_bare_engine(llama_container, api) -> None:
    """Its configuration from the engine's own command line, its memory from its own processes, the
    container's limit and quota, and the quota throttling it while it generates (two streams on two threads
    against one core: most periods run out)."""
    stop = threading.Event()
    streams = [threading.Thread(target=_generate, args=(llama_container.url, stop)) for _ in range(2)]
    for s in streams:
        s.start()
    try:
        e = _snapshot(llama_container.url, api, interval=4)
    finally:
        stop.set()
        for s in streams:
            s.join(120)
    config = e["config"]
    assert config["pid"] == llama_container.host_pid, config
    assert "--parallel" in config["argv"] and config["slots"] == 2, config
    assert "2 slots × 2,048 split" in config["summary"], config["summary"]
    assert not any("argv" in why for why in config["lacks"]), config["lacks"]
    assert e["container"]["name"] == llama_container.name and e["container"]["runtime"] == "podman"
    cgroup, use = e["cgroup"], e["cgroup_use"]
    assert (cgroup["memory_limit_bytes"], cgroup["cpu_quota_cores"]) == (GiB, 1.0), cgroup
    # the engine's own processes: the model's pages it touched, far more than conmon's few MiB
    assert 100 * 2**20 < e["host_rss_bytes"] < GiB, e["host_rss_bytes"]
    assert use["throttled_share"] > 0.2 and use["cores_used"] <= 1.1, use
    assert e["placement"] == f"in container {llama_container.name} · podman · 1.0 GiB limit · 1 cores"
    assert "throttled" in e["limits"] and e["port_held_by"] is None
    assert "container-cpu-throttled" in {f["id"] for f in e["findings"]}, e["findings"]


def test_its_log_from_the_runtimes_api(llama_container, api) -> None:
    [c] = [c for c in shared_catalog().containers() if c.name == llama_container.name]
    lines = shared_catalog().logs(c, 200)
    assert any("listening on" in line for line in lines), lines[-20:]


def test_its_gpu_processes_are_the_engines(llama_container, api, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML lists host PIDs: the engine's, found through conmon into its container, are the engine's VRAM,
    never "a process enginetop does not watch"."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", "/sys")
    pids = LocalPids([EngineTarget("llama", llama_container.url)])()
    assert pids == {"llama": llama_container.host_pid}
    host = HostSampler().sample(pids)
    [tree] = host.engines
    assert tree.container is not None and tree.container.name == llama_container.name
    sampler = GpuSampler(FakeNvml([h200(compute_procs=[(llama_container.host_pid, 3 * GiB)])]))
    [proc] = sampler.sample({m.engine: set(m.pids) for m in host.engines}).gpus[0].processes
    assert (proc.engine, proc.used_bytes, proc.container) == ("llama", 3 * GiB, None)


def test_the_real_vllm_in_its_container_is_read_the_same_way(vllm_server, api) -> None:
    engine = {e.port: e for e in discover().engines}[vllm_server.port]
    assert (engine.name, engine.program, engine.pid) == (vllm_server.container, "vLLM", vllm_server.host_pid)
    e = _snapshot(vllm_server.url, api, interval=2.5, name="v")
    config = e["config"]
    assert config["pid"] == vllm_server.host_pid and "--max-model-len" in config["argv"], config
    assert config["context_tokens"] == 2048
    assert e["container"]["name"] == vllm_server.container
    assert e["cgroup"]["memory_limit_bytes"] == 6 * GiB
    # its API server and its engine core, both in the container: the model and the KV cache's GiB
    assert e["host_rss_bytes"] > GiB, e["host_rss_bytes"]
    assert e["placement"].startswith(f"in container {vllm_server.container} · podman · 6.0 GiB limit")


async def test_the_dashboards_column_and_its_log_key(llama_container, api, tmp_path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user watching the containerised engine sees it at 200×55: the container and its limits in the
    engine's column, and `l` shows the container's log from the runtime's API (enginetop did not start it)."""
    from tests.screen import screen_text
    from tests.test_dashboard import make_app, wait_for
    from tui.ui.screens.logs import LogScreen

    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", "/sys")
    app = make_app([EngineTarget(llama_container.name, llama_container.url)], tmp_path)
    async with app.run_test(size=(200, 55)) as pilot:
        state = app.store.engines[llama_container.name]
        await wait_for(pilot, lambda: state.container is not None and state.cgroup_use is not None,
                       timeout=30, what="the container read by the host sampler")
        where = f"in container {llama_container.name} · podman · 1.0 GiB limit · 1 cores"
        await wait_for(pilot, lambda: where in screen_text(app), what="the container line drawn")
        text = screen_text(app)
        assert "memory " in text and " of 1.0 GiB" in text and "CPU " in text
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen), what="the log screen")
        await wait_for(pilot, lambda: "listening on" in screen_text(app), timeout=15,
                       what="the container's log from the runtime's API")
        await pilot.press("escape")


def test_an_unpublished_container_is_asked_at_its_own_address(podman_env, no_socket) -> None:
    """No port published: found in /proc by its command line and its cgroup, and asked at its container's
    address on Podman's bridge, which this machine routes to; one with no network of its own cannot be
    reached, and discovery says why in one line."""
    import podman

    from tui.engines.install_llamacpp import demo_argv

    bridged, alone = "et-test-unpublished", "et-test-no-network"
    argv = demo_argv(8080, "--threads", "1", host="0.0.0.0")
    try:
        podman.start(podman_env, bridged, [], argv)
        podman.start(podman_env, alone, ["--network", "none"], argv)
        pids = {podman.host_pid(podman_env, n): n for n in (bridged, alone)}
        deadline = time.monotonic() + 60
        while True:
            found = discover()
            mine = [e for e in found.engines if e.pid in pids]
            said = [line for line in found.not_asked if alone in line]
            if mine and said:
                break
            assert time.monotonic() < deadline, (found.engines, found.not_asked)
            time.sleep(1)
        [engine] = mine
        assert engine.name == bridged and engine.port == 8080 and engine.program == "llama-server"
        assert engine.url.startswith("http://10.88.") and engine.container is not None
        assert engine.container.via == "/proc"
        assert httpx.get(f"{engine.url}/health", timeout=5).status_code in (200, 503)  # 503: still loading
        [line] = said
        pid = podman.host_pid(podman_env, alone)
        assert line == (f"not asked: llama-server pid {pid} in podman container {alone} listens on :8080 "
                        "inside its container, published on no port of this machine enginetop could tie to "
                        "it, and it has no address of its own: publish it (-p HOST:CONTAINER), give the "
                        "runtime's API socket (DOCKER_HOST), or run enginetop in its network")
    finally:
        podman.remove(podman_env, bridged)
        podman.remove(podman_env, alone)


def test_an_ollama_in_a_container_is_found_and_named_ollama(podman_env, api) -> None:
    """The Ollama stand-in (tests/standins/ollama) in a real Podman container with its port published: found
    through the runtime (conmon's port → `ollama serve` in the container), named after its container, read as
    Ollama with its loaded model."""
    import sys

    import podman

    from tui.base.process import free_port

    name, port = "et-test-ollama", free_port()
    standin = str(Path(__file__).parent / "standins" / "ollama")
    try:
        podman.start(podman_env, name, ["-p", f"127.0.0.1:{port}:11434", "--env", "OLLAMA_HOST=0.0.0.0:11434",
                                        "--workdir", str(Path(__file__).parent.parent)],
                     [sys.executable, standin, "serve", "--preload", "--parameter", "num_thread=1"])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/api/ps", timeout=2).json().get("models"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, "the Ollama stand-in in its container did not load its model"
            time.sleep(0.5)
        engine = {e.port: e for e in discover().engines}[port]
        assert (engine.program, engine.name) == ("Ollama", name), engine
        assert engine.container is not None and engine.container.runtime == "podman"
        e = _snapshot(url, api, name="o")
        assert e["model"] == "Ollama: 1 model, 1 loaded" and e["container"]["name"] == name, e
        assert e["config"]["engine"] == "Ollama" and e["config"]["slots"] == 1
    finally:
        podman.remove(podman_env, name)
