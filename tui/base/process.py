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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n different free ports: held open together while picked (one at a time, the kernel may hand out the
    same port twice, as it did to two arms of an A/B)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# Every waitpid and every signal in this process goes through this lock: no thread can reap a child (and so
# free its PID, and its group's number, for reuse) between another thread's identity check and its signal.
_SIGNAL_LOCK = threading.RLock()
# Linux counts start times in clock ticks (10 ms): two processes one tick apart must not be taken for one.
CREATE_TIME_TOLERANCE_S = 0.005


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    argv: list[str]
    log_path: Path
    started_at: float  # time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code once it has exited (reaping it), else None."""
        with _SIGNAL_LOCK:
            return self.proc.poll()

    def alive(self) -> bool:
        return self.poll() is None

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
        if create_time is not None and abs(proc.create_time() - create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def same_process(pid: int, create_time: float | None) -> bool:
    """`pid` is still the process that started at `create_time` (a zombie counts: it still holds its PID).
    Without a create time nothing can be proven, so the answer is no."""
    if create_time is None:
        return False
    try:
        return abs(psutil.Process(pid).create_time() - create_time) <= CREATE_TIME_TOLERANCE_S
    except psutil.Error:
        return False


def reap(pid: int) -> int | None:
    """Collect our own exited child so it does not linger as a zombie; its exit status, or None."""
    with _SIGNAL_LOCK:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
    return os.waitstatus_to_exitcode(status) if done else None


@dataclass
class OwnedGroup:
    """A process group enginetop started, and the only way enginetop signals it.

    A PGID is the leader's PID. While the leader is the process we started (our unreaped child, or its PID
    with its recorded start time), nobody else can hold that group number, so the whole group is signalled
    at once (killpg). Once the leader is gone the number may be reused by an unrelated process: then no
    group signal at all, only the PIDs in `known` whose start time still matches (children we saw).

    The check and the signal are as close as the OS allows: for our own child exactly (it keeps its PID
    until we reap it, and every reap here takes the same lock); for a process another enginetop command
    started, a PID freed and reused in the microseconds between the two is the one race left.
    """

    pgid: int
    leader_create_time: float | None = None
    proc: subprocess.Popen[bytes] | None = None  # when the leader is our child
    known: dict[int, float] = field(default_factory=dict)  # PID -> create time; shared with the instance

    def leader_ours(self) -> bool:
        with _SIGNAL_LOCK:
            if self.proc is not None:
                return self.proc.poll() is None  # not reaped: its PID, hence the group number, is still ours
            return same_process(self.pgid, self.leader_create_time)

    def members(self) -> list[int]:
        """Live PIDs that are provably ours: the group's members while its leader is ours, and every known
        PID whose start time still matches. Group members are remembered in `known`, so a child that
        outlives the leader is still found (and signalled) by PID."""
        pids: set[int] = set()
        with _SIGNAL_LOCK:
            for pid, started in list(self.known.items()):
                if (self.proc is None or pid != self.proc.pid) and same_process(pid, started):
                    reap(pid)  # a zombie child of ours (an engine `up` started in this process)
        # Listing every process is slow: not under the lock (a UI thread's poll waits on it). Ours before
        # and after means the group number was never free in between, so what was listed is ours.
        if self.leader_ours():
            found = group_members(self.pgid)
            if self.leader_ours():
                for member in found:
                    try:
                        self.known[member.pid] = member.create_time()
                    except psutil.Error:
                        continue
                    pids.add(member.pid)
        pids.update(pid for pid, started in list(self.known.items()) if pid_alive(pid, started))
        return sorted(pids)

    def signal(self, sig: int) -> list[int]:
        """Send `sig` to what is ours; returns the targets (the PGID first when the group got it)."""
        sent: list[int] = []
        with _SIGNAL_LOCK:
            grouped = self.leader_ours()
            if grouped:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, sig)
                    sent.append(self.pgid)
            for pid, started in list(self.known.items()):
                try:
                    proc = psutil.Process(pid)
                    if abs(proc.create_time() - started) > CREATE_TIME_TOLERANCE_S:
                        continue  # the PID now belongs to someone else
                    if grouped and os.getpgid(pid) == self.pgid:
                        continue  # the group signal reached it (a second SIGTERM means "force" to some)
                    proc.send_signal(sig)  # psutil re-checks the start time right before it signals
                    sent.append(pid)
                except (psutil.Error, ProcessLookupError):
                    continue
        return sent

    def stop(self, term_timeout: float = 15.0) -> str:
        """SIGTERM, SIGKILL what is left after term_timeout, wait for it to be gone.

        Returns "terminated", "killed" or "gone" (nothing of ours was running). Whether it really is gone
        is for the caller to check independently (pid_alive, port_open)."""
        if not self.members():
            return "gone"
        self.signal(signal.SIGTERM)
        if self._wait_gone(term_timeout):
            return "terminated"
        self.signal(signal.SIGKILL)
        self._wait_gone(5.0)
        return "killed"

    def _gone(self) -> bool:
        if self.proc is not None:
            with _SIGNAL_LOCK:
                # Our own child is gone once reaped: a leader whose main thread has returned reads as a
                # zombie in /proc while its other threads still run (llama-server cleaning up on SIGTERM).
                if self.proc.poll() is None:
                    return False
        return not self.members()

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._gone():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True


def stop_pgid(
    pgid: int,
    term_timeout: float = 15.0,
    proc: subprocess.Popen[bytes] | None = None,
    create_time: float | None = None,
    known: dict[int, float] | None = None,
) -> str:
    """Stop the group `pgid` if it is provably ours (see OwnedGroup): its leader is `proc`, our unreaped
    child, or the PID `pgid` started at `create_time`; else only the `known` PIDs that still match.
    Without any of these nothing is signalled and the answer is "gone"."""
    group = OwnedGroup(pgid, leader_create_time=create_time, proc=proc, known={} if known is None else known)
    return group.stop(term_timeout)


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
    """'PID 123 (python3)' for a message; never raises. The program's name only: its command line may hold
    secrets, and a message is shown, logged and kept in results."""
    if proc is None:
        return "a process this user may not inspect"
    try:
        name = proc.name()
    except psutil.Error:
        name = "name unknown"
    return f"PID {proc.pid} ({name})"
