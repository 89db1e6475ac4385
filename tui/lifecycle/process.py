"""Process primitives for engines enginetop launches: argv only (no shell), own process group, log file.

Every check here is independent of the launched program's own output: a process is alive if the OS
says so, a port is open if a connect succeeds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    argv: list[str]
    log_path: Path
    started_at: float  # time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> list[str]:
        return tail_lines(self.log_path, lines)


def tail_lines(path: Path, lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


def launch(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> Launched:
    """Start argv in a new session (so its whole tree can be signalled), output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    return Launched(proc=proc, argv=list(argv), log_path=log_path, started_at=time.monotonic())


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group. A zombie holds no memory, port or GPU context, and
    an orphaned one may never be reaped when PID 1 is not a real init, so it does not count."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """The PID runs and is not a zombie; with create_time, it is still the same process (no PID reuse)."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(pid: int) -> int | None:
    """Collect our own exited child so it does not linger as a zombie; its exit status, or None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def stop_pgid(pgid: int, term_timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> str:
    """SIGTERM the process group, SIGKILL what is left after term_timeout, wait for it to be gone.

    Returns "terminated", "killed" or "gone" (nothing was running). Whether it really is gone is for the
    caller to check independently (group_alive, port_open)."""

    def poll() -> None:
        if proc is not None:
            proc.poll()
        else:
            reap(pgid)

    poll()
    if not group_alive(pgid):
        return "gone"
    how = "terminated"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + term_timeout
    while True:
        poll()
        if not group_alive(pgid):
            break
        if time.monotonic() >= deadline:
            how = "killed"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            break
        time.sleep(0.05)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        poll()
        if not group_alive(pgid):
            break
        time.sleep(0.1)
    return how


def stop_group(launched: Launched, term_timeout: float = 15.0) -> str:
    """SIGTERM the process group, SIGKILL after term_timeout. Returns "terminated", "killed" or "gone"."""
    return stop_pgid(launched.pid, term_timeout, launched.proc)


def port_listeners(port: int) -> list[psutil.Process | None]:
    """Processes with a socket listening on `port` (any address). None stands for a listener whose owner
    this user may not see."""
    owners: list[psutil.Process | None] = []
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.Error:
        return owners
    seen: set[int | None] = set()
    for conn in conns:
        listening = conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
        if listening and conn.pid not in seen:
            seen.add(conn.pid)
            try:
                owners.append(psutil.Process(conn.pid) if conn.pid else None)
            except psutil.Error:
                owners.append(None)
    return owners


def describe_process(proc: psutil.Process | None) -> str:
    """'PID 123 (python3 -m http.server 8080)' for a message; never raises."""
    if proc is None:
        return "a process this user may not inspect"
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        cmd = "command unknown"
    if len(cmd) > 160:
        cmd = cmd[:157] + "..."
    return f"PID {proc.pid} ({cmd})"
