"""Signals reach only processes enginetop provably started (item 9): real processes, real signals.

A PID, and so a process group number, is reused once its process is gone. PID reuse cannot be forced, so
the reused group is built honestly: an unrelated process in its own session (PGID = its PID) stands where
a crashed engine's group was, and the engine's record carries that number with the start time of a
process that really ran and exited. enginetop must leave the stranger untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from waiting import until

from tui.base import process
from tui.base.process import free_port, free_ports, launch, pid_alive, stop_group
from tui.lifecycle.engine import EngineInstance, launch_instance, stop_instance
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import EngineManager

SLEEPER = "import time\nwhile True: time.sleep(1)"


def profile(tmp_path: Path, argv: tuple[str, ...] = ()) -> Profile:
    return Profile(name="engine", engine="other", port=free_port(), path=tmp_path / "engine.toml",
                   argv=argv or (sys.executable, "-c", SLEEPER), stop_timeout_s=5)


def wait_for(check, timeout: float = 10.0) -> None:
    until(check, "the process to get there", timeout, every=0.02)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process in its own session: its group number is its PID."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
    wait_for(lambda: pid_alive(proc.pid))
    assert os.getpgid(proc.pid) == proc.pid
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def dead_process_start_time() -> float:
    """The start time of a real process that has exited since (a few clock ticks after the stranger's)."""
    time.sleep(0.05)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait(timeout=10)
    return started


def test_a_reused_group_number_is_never_signalled(tmp_path: Path, stranger: subprocess.Popen[bytes]) -> None:
    """The record says PID/PGID N started at T; N now belongs to a stranger started later. Neither the
    stop (TERM, then KILL) nor a manager's stop may touch it, and it is not counted as the engine."""
    started = dead_process_start_time()
    crashed = EngineInstance(
        resolved=resolve(profile(tmp_path)),
        pid=stranger.pid,
        pgid=stranger.pid,
        create_time=started,
        pids_seen={stranger.pid: started},  # even its PID in the tree record is the reused number
        adopted=True,
    )
    assert not crashed.alive() and crashed.tree_pids() == set()
    message = stop_instance(crashed, timeout=1)
    assert message.startswith("was not running")
    manager = EngineManager(gpu=None, log_dir=tmp_path, record_state=False)
    manager.adopt(crashed)
    assert manager.stop().ok
    time.sleep(0.3)  # a signal, had one been sent, has landed by now
    assert stranger.poll() is None and pid_alive(stranger.pid)


def test_leader_gone_its_children_are_stopped_by_pid_never_by_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader exits, its child lives on in the group. The group number is then no proof of anything:
    no killpg, the child (seen earlier, same start time) is signalled by PID, and it is gone."""
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"  # same group, outlives us
        "time.sleep(0.5)\n"
    )
    instance = launch_instance(resolve(profile(tmp_path, (sys.executable, "-c", script))), log_dir=tmp_path)
    wait_for(lambda: len(instance.tree_pids()) == 2)
    [child] = instance.tree_pids() - {instance.pid}
    wait_for(lambda: not instance.alive())  # the leader exited and was reaped
    assert pid_alive(child) and os.getpgid(child) == instance.pgid

    group_signals: list[tuple[int, int]] = []
    real_killpg = os.killpg
    monkeypatch.setattr(process.os, "killpg", lambda pgid, sig: group_signals.append((pgid, sig)) or
                        real_killpg(pgid, sig))
    message = stop_instance(instance, timeout=5)
    assert group_signals == []
    assert "stopped by SIGTERM" in message and not pid_alive(child)


def test_a_live_engine_tree_is_stopped_whole(tmp_path: Path) -> None:
    """The normal path: the leader is ours, so its group gets the signal at once; a child that left the
    group (setsid) is signalled by PID. Everything is gone afterwards, checked with the OS."""
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], start_new_session=True)\n"
        "while True: time.sleep(1)\n"
    )
    instance = launch_instance(resolve(profile(tmp_path, (sys.executable, "-c", script))), log_dir=tmp_path)
    # a child started with start_new_session leaves the group when it runs setsid, a moment after its fork
    wait_for(lambda: len(found := instance.tree_pids()) == 3 and len({os.getpgid(p) for p in found}) == 2)
    pids = instance.tree_pids()
    assert len({os.getpgid(pid) for pid in pids}) == 2  # one child left the group
    message = stop_instance(instance, timeout=5)
    assert "stopped by SIGTERM" in message and "3 process(es) verified gone" in message
    assert not any(pid_alive(pid) for pid in pids)
    assert instance.exit_code() == -15


def test_pid_of_a_seen_child_reused_by_a_stranger_is_left_alone(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    """The engine is ours and running; its record also lists a child PID whose number now belongs to the
    stranger (start time differs): the engine stops, the stranger lives."""
    instance = launch_instance(resolve(profile(tmp_path)), log_dir=tmp_path)
    wait_for(lambda: instance.alive() and instance.pid in instance.tree_pids())
    instance.pids_seen[stranger.pid] = dead_process_start_time()
    stop_instance(instance, timeout=5)
    assert not instance.alive()
    time.sleep(0.3)
    assert stranger.poll() is None and pid_alive(stranger.pid)



# On SIGTERM: a thread goes on cleaning up while the main thread exits, as llama-server's shutdown does.
# /proc then shows the group leader as a zombie although the process still runs.
MAIN_THREAD_EXITS_FIRST = r'''
import ctypes, signal, threading, time
def on_term(*_):
    threading.Thread(target=time.sleep, args=(1.5,)).start()
    ctypes.CDLL(None).pthread_exit(None)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
'''


def test_stop_waits_until_our_child_has_really_exited(tmp_path: Path) -> None:
    launched = launch([sys.executable, "-c", MAIN_THREAD_EXITS_FIRST], tmp_path / "child.log")
    deadline = time.monotonic() + 10
    while "ready" not in (tmp_path / "child.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    assert stop_group(launched) == "terminated"
    assert not launched.alive()  # reaped: not merely a zombie-looking leader with a thread still running
    assert time.monotonic() - started >= 1.0


def test_ports_picked_together_are_all_different():
    """Picked one at a time, the kernel may hand out the same free port twice (two A/B arms once got the
    same one and the second could not start): picked together, never."""
    for _ in range(20):
        ports = free_ports(8)
        assert len(set(ports)) == 8 and all(1024 <= p <= 65535 for p in ports)
