"""Lifecycle against the real llama-server and demo model: up/down from the command line, a switch
A -> B -> A, a crash behind enginetop's back, and a port held by a stranger. Every start is a real one."""

from __future__ import annotations

import asyncio
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

from tui.base.paths import runs_dir
from tui.base.process import free_port, pid_alive, port_listeners, port_open
from tui.lifecycle import state
from tui.lifecycle.profile_files import load_profiles
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import STEPS, EngineManager
from tui.model.samples import EngineSample
from tui.model.status import StepEvent
from tui.model.targets import EngineTarget
from tui.sources.engine import poll_engine

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


async def poll_once(target: EngineTarget) -> EngineSample:
    async with httpx.AsyncHTTPTransport() as transport:
        return await poll_engine(transport, target)


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{time.monotonic_ns() % 1_000_000}"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[EngineManager]:
    mgr = EngineManager(gpu=None, log_dir=tmp_path)
    yield mgr
    mgr.stop()


@pytest.mark.engine  # resolves or starts the real llama-server
def test_up_reaches_ready_and_down_verifies_it_is_gone(tmp_path: Path) -> None:
    """`up` returns while the engine keeps running; `down` (another process) finds it via the state file."""
    name = unique("cli-demo")
    port = free_port()
    write_demo(tmp_path / "enginetop" / "profiles", name, port)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tui.cli.lifecycle", *args],
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
        # in this test's own state dir (conftest), never the user's
        assert state.state_path(name).parent == Path(os.environ["ENGINETOP_STATE_DIR"])
        assert state.state_path(name).exists() and not (runs_dir() / "state" / f"{name}.json").exists()
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


@pytest.mark.engine  # resolves or starts the real llama-server
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


@pytest.mark.engine  # resolves or starts the real llama-server
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


@pytest.mark.engine  # resolves or starts the real llama-server
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
        # named by its program, never its command line (which may hold secrets)
        assert f"PID {stranger.pid} (python" in result.message and "http.server" not in result.message
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


@pytest.mark.engine  # resolves or starts the real llama-server
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


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.engine  # resolves or starts the real llama-server
def test_api_key_file_is_used_as_bearer_and_never_shown(
    tmp_path: Path, manager: EngineManager, newline: str
) -> None:
    """llama-server gets the key enginetop sends (LLAMA_API_KEY in its environment, read from the profile's
    key file, stripped), readiness and a dashboard poll need the Bearer header (401 without it), and the
    key appears in no step message, log line or process command line. With a CRLF key file too: handed
    over as a file, llama-server would keep "key\\r" and refuse every request (401), enginetop's included."""
    secret = "sk-enginetop-test-" + str(time.monotonic_ns())
    key_file = tmp_path / "llama.key"
    key_file.write_bytes(f"# key{newline}{secret}{newline}".encode())
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
    assert "--api-key" not in cmdline and secret not in cmdline
    assert secret not in result.instance.log_path.read_text()
    # The dashboard's own poll, with the key resolve() gives it, is let in; without it, not.
    keyed = EngineTarget(name="keyed", url=url, api_key=resolve(result.instance.profile).api_key)
    polled = asyncio.run(poll_once(keyed))
    assert polled.health == "up" and polled.reading is not None and polled.metrics_error is None, polled
    refused = asyncio.run(poll_once(EngineTarget(name="keyed", url=url)))
    assert refused.reading is None and "unauthorized" in (refused.metrics_error or ""), refused
    assert not any(secret in e.message for e in events) and secret not in json.dumps(result.to_json())
    assert secret not in repr(result.instance)


@pytest.mark.engine  # resolves or starts the real llama-server
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


# ---------------------------------------------------------------- quitting during a cold start (item 11)

SILENT_ENGINE = """\
import signal, socket, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
held = []
while True:  # accepts every connection and never answers: a readiness check hangs on it
    held.append(server.accept()[0])
"""


def silent_profile(tmp_path: Path, term: str) -> Profile:
    script = tmp_path / "silent_engine.py"
    script.write_text(SILENT_ENGINE, encoding="utf-8")
    path = tmp_path / f"silent-{term}.toml"
    path.write_text(
        f'name = "silent-{term}"\nengine = "other"\n'
        f'argv = ["{sys.executable}", "{script}", "${{PORT}}", "{term}"]\n'
        f"port = {free_port()}\nstart_timeout_s = 20\nstop_timeout_s = 2\n",
        encoding="utf-8",
    )
    return load_profiles([tmp_path]).get(f"silent-{term}")


@pytest.mark.parametrize("term", ["obeys-term", "ignore-term"])
def test_stop_during_a_cold_start_returns_at_once_and_the_engine_is_gone(tmp_path: Path, term: str) -> None:
    """The engine listens but never answers, so the readiness check hangs in an HTTP request (the case a
    `q` during a cold start meets). stop() cancels the start and returns within seconds (SIGTERM, or
    SIGKILL after the profile's 2 s for an engine that ignores SIGTERM), not after start_timeout_s (20 s)."""
    profile = silent_profile(tmp_path, term)
    manager = EngineManager(gpu=None, log_dir=tmp_path, record_state=False)
    results = []
    starter = threading.Thread(target=lambda: results.append(manager.start(profile)))
    starter.start()
    deadline = time.monotonic() + 15
    while not port_open("127.0.0.1", profile.port) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the readiness check is now waiting for an answer that never comes
    [engine] = port_listeners(profile.port)
    engine_started = engine.create_time()
    began = time.monotonic()
    stopped = manager.stop()
    took = time.monotonic() - began
    starter.join(timeout=10)
    print(f"stop() during a cold start ({term}) took {took:.2f} s")
    assert stopped.ok and took < 2 + 5
    [started] = results
    assert not started.ok and started.failed_step == "ready" and started.steps[-1].status == "cancelled"
    assert not pid_alive(engine.pid, engine_started) and not port_open("127.0.0.1", profile.port)
    assert manager.current is None and manager.poll_status().state == "idle"


def test_shutdown_refuses_new_starts(tmp_path: Path) -> None:
    """After shutdown() (the dashboard is exiting) a start that arrives late launches nothing."""
    profile = silent_profile(tmp_path, "obeys-term")
    manager = EngineManager(gpu=None, log_dir=tmp_path, record_state=False)
    assert manager.shutdown().ok
    late = manager.start(profile)
    assert not late.ok and late.failed_step == "resolve" and "shutting down" in late.message
    assert not list(tmp_path.glob("silent-*.log")) and not port_open("127.0.0.1", profile.port)


@pytest.mark.engine  # resolves or starts the real llama-server
def test_stop_during_a_real_llama_cold_start_cancels_it(tmp_path: Path) -> None:
    """The real llama-server: stop() arrives right after the launch, while the model loads. The start is
    reported cancelled, stop() does not wait for readiness, and the process is gone (OS check)."""
    profile = demo(tmp_path, unique("demo-quit"), free_port())
    manager = EngineManager(gpu=None, log_dir=tmp_path, record_state=False)
    stops: list[tuple[float, object]] = []
    launched: list[int] = []

    def stop_now() -> None:
        began = time.monotonic()
        stopped = manager.stop()
        stops.append((time.monotonic() - began, stopped))

    def on_step(event: StepEvent) -> None:
        if event.name == "start" and event.status == "ok":
            launched.append(int(event.message.split()[1]))
            threading.Thread(target=stop_now).start()
            time.sleep(0.3)  # let stop() land while this start is still in flight

    result = manager.start(profile, on_step=on_step)
    deadline = time.monotonic() + 30
    while not stops and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not result.ok and result.steps[-1].status == "cancelled", result.message
    [(took, stopped)] = stops
    print(f"stop() during a llama-server cold start took {took:.2f} s")
    assert stopped.ok and took < 10
    assert launched and not pid_alive(launched[0]) and not port_open("127.0.0.1", profile.port)


# ---------------------------------------------------------------- --profile NAME after `up NAME` (item 17)


@pytest.mark.engine  # resolves or starts the real llama-server
def test_dashboard_adopts_the_engine_up_started_and_leaves_it_running(tmp_path: Path) -> None:
    """`up` starts the real llama-server and exits; the dashboard's manager adopts it (ready checked, not
    restarted, same PID, no second engine on the port), and its shutdown leaves it running for `down`."""
    name = unique("adopt-demo")
    port = free_port()
    write_demo(tmp_path / "enginetop" / "profiles", name, port)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tui.cli.lifecycle", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=180)

    profile = load_profiles([tmp_path / "enginetop" / "profiles"]).get(name)
    manager = EngineManager(gpu=None, log_dir=tmp_path)
    assert manager.adopt_recorded(profile) is None  # nothing recorded yet: start normally
    up = cli("up", name)
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout)
    try:
        events: list[StepEvent] = []
        adopted = manager.adopt_recorded(profile, on_step=events.append)
        assert adopted is not None and adopted.ok, adopted and adopted.message
        assert [(s.name, s.status) for s in adopted.steps] == [
            ("resolve", "ok"), ("stop", "skipped"), ("drain", "skipped"), ("port", "skipped"),
            ("start", "skipped"), ("ready", "ok"),
        ]
        inst = adopted.instance
        assert inst.pid == info["pid"] and inst.adopted
        assert inst.cold_start_s == pytest.approx(info["cold_start_s"], abs=1e-3)  # up's, not re-measured
        assert "quitting leaves it running" in adopted.message
        assert [p.pid for p in port_listeners(port) if p is not None] == [info["pid"]]  # no second engine
        status = manager.poll_status()
        assert status.state == "ready" and status.pid == info["pid"]
        left = manager.shutdown()
        assert left.ok and "left running" in left.message and f"enginetop down {name}" in left.message
        assert pid_alive(info["pid"]) and httpx.get(f"{info['url']}/health", timeout=5).status_code == 200
        assert state.read_state(name) is not None
    finally:
        down = cli("down", name)
    assert down.returncode == 0, down.stderr
    assert not pid_alive(info["pid"]) and not port_open("127.0.0.1", port)


@pytest.mark.engine  # resolves or starts the real llama-server
def test_users_own_api_key_file_gives_enginetop_the_same_key(tmp_path: Path, manager: EngineManager) -> None:
    """A llama.cpp argv that passes --api-key-file itself (no api_key_file in the profile): enginetop reads
    the file the way llama-server does and sends its first key, so readiness passes instead of 401."""
    secret = "sk-own-file-" + str(time.monotonic_ns())
    key_file = tmp_path / "own.key"
    key_file.write_text(f"# comment\n{secret}\nsk-second-key\n", encoding="utf-8")
    write_demo(tmp_path, "own-key", free_port())
    path = tmp_path / "own-key.toml"
    path.write_text(path.read_text().replace('"--metrics"', f'"--metrics", "--api-key-file", "{key_file}"'))
    result = manager.start(load_profiles([tmp_path]).get("own-key"))
    assert result.ok, result.message
    url = result.instance.url
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{url}/v1/models", headers=bearer, timeout=10).status_code == 200
    assert secret not in result.instance.log_path.read_text() and secret not in json.dumps(result.to_json())
