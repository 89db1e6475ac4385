"""Lifecycle against the real llama-server and demo model: up/down from the command line, a switch
A -> B -> A, a crash behind enginetop's back, and a port held by a stranger. Every start is a real one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tui.lifecycle import state
from tui.lifecycle.process import free_port, pid_alive, port_open
from tui.lifecycle.profiles import Profile, load_profiles
from tui.lifecycle.switch import STEPS, EngineManager, StepEvent

REPO = Path(__file__).resolve().parents[1]

DEMO = """\
name = "{name}"
engine = "llama.cpp"
argv = ["${{ENGINETOP_LLAMA_SERVER}}", "--model", "${{ENGINETOP_DEMO_MODEL}}", "--host", "127.0.0.1",
        "--port", "${{PORT}}", "--metrics", "--ctx-size", "2048", "--threads", "{threads}"]
port = {port}
start_timeout_s = 120
stop_timeout_s = 10
drain_timeout_s = 30
"""


def write_demo(directory: Path, name: str, port: int, threads: int = 1) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(DEMO.format(name=name, port=port, threads=threads), encoding="utf-8")
    return path


def demo(tmp_path: Path, name: str, port: int, threads: int = 1) -> Profile:
    write_demo(tmp_path, name, port, threads)
    return load_profiles([tmp_path]).get(name)


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{time.monotonic_ns() % 1_000_000}"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[EngineManager]:
    mgr = EngineManager(gpu=None, log_dir=tmp_path)
    yield mgr
    mgr.stop()


def test_up_reaches_ready_and_down_verifies_it_is_gone(tmp_path: Path) -> None:
    """`up` returns while the engine keeps running; `down` (another process) finds it via the state file."""
    name = unique("cli-demo")
    port = free_port()
    write_demo(tmp_path / "enginetop" / "profiles", name, port)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tui.lifecycle.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    up = cli("up", name)
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    try:
        assert info["port"] == port and info["url"] == f"http://127.0.0.1:{port}"
        assert 0 < info["cold_start_s"] < 120
        assert [s["name"] for s in info["steps"]] == list(STEPS)
        assert "ready" in up.stderr and "cold start" in up.stderr  # live step lines
        # Independent checks, after the command has exited.
        assert pid_alive(info["pid"]) and os.getpgid(info["pid"]) == info["pid"]
        assert httpx.get(f"{info['url']}/health", timeout=5).status_code == 200
        record = state.read_state(name)
        assert record is not None and record["pid"] == info["pid"] and record["cold_start_s"] is not None
        log = Path(info["log_path"]).read_text()
        assert "# argv: " in log and "--threads 1" in log

        again = cli("up", name)  # the port is taken by our own engine: refused, named
        assert again.returncode == 1
        assert "step 'port' failed" in again.stderr
        assert (
            f"PID {info['pid']}" in again.stderr
            and f"started by enginetop for profile {name}" in again.stderr
        )
    finally:
        down = cli("down", name)
    assert down.returncode == 0, down.stderr
    assert not pid_alive(info["pid"]) and not port_open("127.0.0.1", port)
    assert state.read_state(name) is None
    assert json.loads(down.stdout)["steps"][0]["message"].endswith(f"port {port} closed")
    gone = cli("down", name)
    assert gone.returncode == 1 and "step 'stop' failed: no running engine recorded" in gone.stderr


def test_switch_a_to_b_to_a_runs_and_reports_every_step(tmp_path: Path, manager: EngineManager) -> None:
    port = free_port()  # both on one port: the switch must really free it
    a = demo(tmp_path, unique("demo-a"), port, threads=1)
    b = demo(tmp_path, unique("demo-b"), port, threads=2)
    events: list[StepEvent] = []
    pids = []
    for profile in (a, b, a):
        before = manager.current
        result = manager.switch(profile, on_step=events.append)
        assert result.ok, result.message
        expected = [(n, "skipped" if n == "stop" and before is None else "ok") for n in STEPS]
        assert [(s.name, s.status) for s in result.steps] == expected
        inst = result.instance
        pids.append(inst.pid)
        assert inst.alive() and inst.cold_start_s and inst.cold_start_s > 0
        assert f"--threads {1 if profile is a else 2}" in " ".join(psutil.Process(inst.pid).cmdline())
        if before is not None:
            assert not pid_alive(before.pid)  # the old one is verifiably gone
            assert before.pids_seen and not before.survivors()
        status = manager.poll_status()
        assert status.state == "ready" and status.profile == profile.name and status.pid == inst.pid
        timings = {s.name: round(s.elapsed_s, 2) for s in result.steps}
        print(f"switch -> {profile.name}: {timings} cold_start={inst.cold_start_s:.2f}s")
    assert len(set(pids)) == 3
    # The live stream showed progress inside steps, not just the final verdicts.
    assert any(e.name == "ready" and e.status == "running" for e in events)
    assert any(e.name == "stop" and e.status == "running" and "SIGTERM" in e.message for e in events)


def test_kill_9_behind_our_back_is_reported_as_crashed(tmp_path: Path, manager: EngineManager) -> None:
    profile = demo(tmp_path, unique("demo-crash"), free_port())
    result = manager.start(profile)
    assert result.ok, result.message
    pid = result.instance.pid
    assert manager.poll_status().state == "ready"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (status := manager.poll_status()).state != "crashed" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.state == "crashed" and status.pid == pid
    assert status.exit_code == -9 and "killed by SIGKILL" in status.message
    assert status.log_tail and status.log_tail == tuple(result.instance.log_tail())
    assert any("llama" in line or "srv" in line for line in status.log_tail)  # the server's own lines
    assert "\n".join(status.log_tail[-3:]) in status.message
    assert state.read_state(profile.name) is None
    assert manager.poll_status() == status  # stays crashed until the next start


def test_port_held_by_another_process_is_refused_naming_it(tmp_path: Path, manager: EngineManager) -> None:
    port = free_port()
    stranger = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        profile = demo(tmp_path, unique("demo-blocked"), port)
        result = manager.start(profile)
        assert not result.ok and result.failed_step == "port"
        assert f"PID {stranger.pid} (" in result.message and "http.server" in result.message
        assert "not started by enginetop" in result.message
        assert [s.name for s in result.steps] == ["resolve", "stop", "drain", "port"]
        assert not list(tmp_path.glob(f"{profile.name}-*.log"))  # nothing was launched
        assert stranger.poll() is None
    finally:
        stranger.terminate()
        stranger.wait(timeout=10)


def test_unset_model_variable_fails_before_anything_starts(tmp_path: Path, manager: EngineManager) -> None:
    path = tmp_path / "needs-model.toml"
    path.write_text(
        'name = "needs-model"\nengine = "llama.cpp"\n'
        'argv = ["${ENGINETOP_LLAMA_SERVER}", "--model", "${SURELY_UNSET_GGUF}", "--port", "${PORT}"]\n'
        f"port = {free_port()}\n",
        encoding="utf-8",
    )
    os.environ.pop("SURELY_UNSET_GGUF", None)
    result = manager.start(load_profiles([tmp_path]).get("needs-model"))
    assert not result.ok and result.failed_step == "resolve" and len(result.steps) == 1
    assert f"{path}:3" in result.message and "${SURELY_UNSET_GGUF} is not set" in result.message
    assert not list(tmp_path.glob("needs-model-*.log"))


def test_engine_that_dies_while_starting_fails_the_ready_step_with_its_log(
    tmp_path: Path, manager: EngineManager
) -> None:
    path = tmp_path / "bad-flag.toml"
    path.write_text(
        'name = "bad-flag"\nengine = "llama.cpp"\n'
        'argv = ["${ENGINETOP_LLAMA_SERVER}", "--model", "${ENGINETOP_DEMO_MODEL}", "--port", "${PORT}",'
        ' "--no-such-flag"]\n'
        f"port = {free_port()}\n",
        encoding="utf-8",
    )
    result = manager.start(load_profiles([tmp_path]).get("bad-flag"))
    assert not result.ok and result.failed_step in ("start", "ready")
    assert "exited" in result.message and "exit code 1" in result.message
    assert "no-such-flag" in result.message  # llama-server's own complaint, from the log tail
    status = manager.poll_status()
    assert status.state == "crashed" and status.exit_code == 1


def test_api_key_file_is_used_as_bearer_and_never_shown(tmp_path: Path, manager: EngineManager) -> None:
    """llama-server gets --api-key-file, readiness needs the Bearer header (401 without it), and the key
    appears in no step message, log line or process command line."""
    secret = "sk-enginetop-test-" + str(time.monotonic_ns())
    key_file = tmp_path / "llama.key"
    key_file.write_text(f"# key\n{secret}\n", encoding="utf-8")
    write_demo(tmp_path, "keyed", free_port())
    path = tmp_path / "keyed.toml"
    path.write_text(path.read_text() + f'api_key_file = "{key_file}"\n', encoding="utf-8")
    events: list[StepEvent] = []
    result = manager.start(load_profiles([tmp_path]).get("keyed"), on_step=events.append)
    assert result.ok, result.message
    url = result.instance.url
    body = {"prompt": "Hi", "max_tokens": 1}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 401
    bearer = {"Authorization": f"Bearer {secret}"}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30, headers=bearer).status_code == 200
    cmdline = " ".join(psutil.Process(result.instance.pid).cmdline())
    assert f"--api-key-file {key_file}" in cmdline and secret not in cmdline
    assert secret not in result.instance.log_path.read_text()
    assert not any(secret in e.message for e in events) and secret not in json.dumps(result.to_json())
    assert secret not in repr(result.instance)


def test_cancel_while_waiting_for_ready_stops_the_half_started_engine(
    tmp_path: Path, manager: EngineManager
) -> None:
    profile = demo(tmp_path, unique("demo-cancel"), free_port())
    cancel = threading.Event()
    started: list[int] = []

    def on_step(event: StepEvent) -> None:
        if event.name == "start" and event.status == "ok":
            started.append(int(event.message.split()[1]))  # "PID 123 running, log ..."
            cancel.set()

    result = manager.start(profile, on_step=on_step, cancel=cancel)
    assert not result.ok and result.failed_step == "ready"
    assert result.steps[-1].status == "cancelled" and "cancelled during step 'ready'" in result.message
    assert started and not pid_alive(started[0]) and not port_open("127.0.0.1", profile.port)
    assert manager.poll_status().state == "idle"
