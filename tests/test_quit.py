"""Quitting stops what enginetop started, quickly, and says so: `q` during a cold start, SIGTERM, SIGHUP.

The engines are real processes: a slow starter that never becomes ready (a cold start that would hold a
naive exit for its whole start timeout), and the real llama-server demo. The signal tests run the real
`enginetop` command in a pseudo-terminal and signal it as a service manager or a closing terminal would.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.fake_pynvml import FakeNvml, h200
from tests.test_dashboard import wait_for
from tui.base.process import free_port
from tui.engines.install_llamacpp import demo_model_path, llama_server_binary
from tui.lifecycle.profile_files import load_profiles
from tui.sources.gpu import GpuSampler
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig

ROOT = Path(__file__).resolve().parent.parent

# Listens at once (so readiness checks wait on /health, as they do while a model loads) and never answers.
SLOW_ENGINE = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
               "time.sleep(900)")

pytestmark = pytest.mark.engine  # every test here starts a real engine


def slow_profile(directory: Path, name: str = "slow-start") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-c", SLOW_ENGINE.format(port=port)]
    (directory / f"{name}.toml").write_text(
        f'name = "{name}"\nengine = "other"\nport = {port}\nargv = {json.dumps(argv)}\n'
        "start_timeout_s = 600\nstop_timeout_s = 10\n")
    return directory / f"{name}.toml"


def llama_profile(directory: Path, name: str = "quit-llama") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    argv = [str(llama_server_binary()), "--model", str(demo_model_path()), "--host", "127.0.0.1",
            "--port", "${PORT}", "--metrics", "--ctx-size", "2048", "--threads", "1"]
    (directory / f"{name}.toml").write_text(
        f'name = "{name}"\nengine = "llama.cpp"\nport = {free_port()}\nargv = {json.dumps(argv)}\n')


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_q_during_a_cold_start_stops_the_starting_engine_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ENGINETOP_STATE_DIR", str(state_dir_of(tmp_path)))
    slow_profile(tmp_path / "profiles")
    profile = load_profiles([tmp_path / "profiles"]).get("slow-start")
    nvml = FakeNvml([h200()])
    app = EnginetopApp(AppConfig(profiles=[profile], poll_interval_s=0.5, redraw_interval_s=0.25,
                                 screenshot_dir=tmp_path / "shots", gpu_sampler=lambda: GpuSampler(nvml)))
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_for(pilot, lambda: app.slots[0].status and app.slots[0].status.step == "ready",
                       timeout=30, what="the engine launched and waiting to be ready")
        pid = recorded_pid(tmp_path, "slow-start", timeout=5)  # the half-started engine: never ready
        assert not gone(pid)
        pressed = time.monotonic()
        await pilot.press("q")
        for _ in range(100):
            if app.return_code is not None:
                break
            await pilot.pause(0.05)
        assert app.return_code == 0, "q did not quit during the cold start"
    results = app.stop_managed()
    took = time.monotonic() - pressed
    assert took < 10, f"quitting took {took:.1f} s"
    assert gone(pid), "the half-started engine still runs"
    assert [r.ok for r in results] == [True] and results[0].from_profile in ("slow-start", None)


class Terminal:
    """enginetop in a pseudo-terminal, its output drained (a full pty would block it)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "tui", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=ROOT, start_new_session=True)
        os.close(slave)
        self.output = b""

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # the other side has closed
                    return

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain(0.2)
            if self.proc.poll() is not None:
                self.drain(0.5)
                return self.proc.returncode
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


def state_dir_of(tmp_path: Path) -> Path:
    """Where the test's dashboards keep their engines' state files: in the test's own cache (conftest gave
    the test a state dir of its own elsewhere), where the test reads them."""
    return tmp_path / "cache" / "runs" / "state"


def env_for(tmp_path: Path) -> dict[str, str]:
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True, exist_ok=True)
    # the demo model is assembled once in the real cache: point at it instead of copying 250 MB
    (cache / "models" / demo_model_path().name).symlink_to(demo_model_path())
    return {**os.environ, "ENGINETOP_CACHE": str(cache), "ENGINETOP_STATE_DIR": str(state_dir_of(tmp_path)),
            "XDG_CONFIG_HOME": str(tmp_path / "config"), "TERM": "xterm-256color", "COLUMNS": "160",
            "LINES": "50"}


def recorded_pid(tmp_path: Path, name: str, timeout: float) -> int:
    path = state_dir_of(tmp_path) / f"{name}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())["pid"]
        time.sleep(0.1)
    raise AssertionError(f"no engine was launched for {name} within {timeout} s")


def test_sigterm_during_a_cold_start_stops_the_engine_and_says_so(tmp_path):
    env = env_for(tmp_path)
    slow_profile(tmp_path / "config" / "enginetop" / "profiles")
    term = Terminal(["--profile", "slow-start"], env)
    try:
        pid = recorded_pid(tmp_path, "slow-start", timeout=60)
        term.drain(1.0)
        assert term.proc.poll() is None and not gone(pid)
        sent = time.monotonic()
        term.proc.send_signal(signal.SIGTERM)
        code = term.wait(timeout=20)
        assert code == 0, term.output[-2000:]
        assert time.monotonic() - sent < 15
        assert gone(pid)
        text = term.output.decode("utf-8", "replace")
        assert "SIGTERM received: stopping the engines enginetop started" in text, text[-2000:]
        assert "slow-start" in text[text.find("SIGTERM received"):]
    finally:
        term.close()


def test_sighup_stops_a_running_llama_server(tmp_path):
    env = env_for(tmp_path)
    llama_profile(tmp_path / "config" / "enginetop" / "profiles")
    term = Terminal(["--profile", "quit-llama"], env)
    try:
        pid = recorded_pid(tmp_path, "quit-llama", timeout=60)
        deadline = time.monotonic() + 120
        state = state_dir_of(tmp_path) / "quit-llama.json"
        while json.loads(state.read_text()).get("cold_start_s") is None:  # written again once ready
            assert time.monotonic() < deadline, "llama-server not ready"
            term.drain(0.3)
        tree = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        term.proc.send_signal(signal.SIGHUP)
        assert term.wait(timeout=30) == 0, term.output[-2000:]
        assert all(gone(p) for p in tree)
        assert not state.exists()
        assert "SIGHUP received" in (tmp_path / "cache" / "runs" / "enginetop.log").read_text()
    finally:
        term.close()
