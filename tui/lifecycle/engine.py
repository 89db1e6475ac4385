"""One engine instance: launch it, decide when it is ready, stop it, and tell whether it still runs.

Every verdict comes from an independent check, never from the engine's own words: the OS says whether
the process lives, a TCP connect says whether the port listens, HTTP status codes say whether /health
and a real 1-token completion succeed.
"""

from __future__ import annotations

import shlex
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import psutil

from tui.base.paths import runs_dir, safe_name
from tui.base.process import (
    Launched,
    OwnedGroup,
    describe_process,
    launch,
    pid_alive,
    port_listeners,
    port_open,
    reap,
    same_process,
    tail_lines,
)
from tui.engines.argv import mask_argv
from tui.lifecycle.memory import StartWatch
from tui.lifecycle.profile_resolve import ResolvedProfile
from tui.lifecycle.profiles import Profile, engine_options
from tui.model.findings import StartMemory
from tui.model.status import EngineStatus
from tui.net.policy import auth_headers, client_kwargs, error_text

LOG_TAIL_LINES = 20


class StepError(RuntimeError):
    """A lifecycle step failed; the message names the step and says why, in words a user can act on."""

    def __init__(self, step: str, message: str, timed_out: bool = False) -> None:
        self.step = step
        self.timed_out = timed_out
        super().__init__(message)


class Cancelled(StepError):
    def __init__(self, step: str) -> None:
        super().__init__(step, f"cancelled during step '{step}'")


def timeout_message(step: str, seconds: float, detail: str) -> str:
    return f"step '{step}' timed out after {seconds:.0f} s: {detail}"


def exit_words(code: int | None) -> str:
    if code is None:
        return "exit code unknown (not a child of this process)"
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code}"
    return f"exit code {code}"


@dataclass
class EngineInstance:
    """A running (or attached) engine. `launched` is set when this process started it (exit code known);
    an instance adopted from a state file has only pid/pgid/create_time, and `adopted` set: another
    enginetop command (`up`) started it and meant it to outlive us."""

    resolved: ResolvedProfile
    pid: int | None = None
    pgid: int | None = None
    create_time: float | None = None  # psutil's, to tell our PID from a reused one
    log_path: Path | None = None
    launched: Launched | None = None
    started_mono: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    cold_start_s: float | None = None
    pids_seen: dict[int, float] = field(default_factory=dict)  # PID -> create time, every one of its tree
    stopping: bool = False  # set before we signal it, so its exit is not reported as a crash
    adopted: bool = False
    watch: StartWatch | None = None  # its tree's memory while it starts (a process this one launched)
    _ended: StartMemory | None = field(default=None, repr=False)  # start_memory() once it has exited

    @property
    def profile(self) -> Profile:
        return self.resolved.profile

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def url(self) -> str:
        return self.profile.url

    @property
    def attached(self) -> bool:
        return self.pid is None

    def alive(self) -> bool:
        if self.pid is None:
            return False
        if self.launched is not None:
            return self.launched.alive()
        if same_process(self.pid, self.create_time):
            reap(self.pid)  # ours only when `up` ran in this process; never reap a stranger's child
        return pid_alive(self.pid, self.create_time)

    def exit_code(self) -> int | None:
        if self.launched is not None:
            return self.launched.poll()
        return None

    def group(self) -> OwnedGroup:
        """Its process group, for signalling: only what is provably still ours gets a signal."""
        return OwnedGroup(
            self.pgid or self.pid or 0,
            leader_create_time=self.create_time,
            proc=self.launched.proc if self.launched is not None else None,
            known=self.pids_seen,
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        return tail_lines(self.log_path, lines) if self.log_path else []

    def tree_pids(self) -> set[int]:
        """The live PIDs of its process tree and group now; remembered in pids_seen with their start
        times, so a PID reused later by an unrelated process is never taken for (or killed as) ours."""
        if self.pid is None:
            return set()
        pids = set(self.group().members())  # the group, only while its leader is provably ours
        if same_process(self.pid, self.create_time):
            try:
                procs = [psutil.Process(self.pid)]
                procs += procs[0].children(recursive=True)  # children that left the group (setsid)
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    self.pids_seen[proc.pid] = proc.create_time()
                except psutil.Error:
                    continue
                pids.add(proc.pid)
        return {pid for pid in pids if pid_alive(pid, self.pids_seen.get(pid))}

    def start_memory(self) -> StartMemory | None:
        """What its start cost the host, and how it ended if it has (None: not one this process launched)."""
        if self.watch is None:
            return None
        if self.alive():
            return self.watch.result(ready=True) if self.cold_start_s is not None else None
        if self._ended is None:  # once: attributing a kill reads the kernel log
            when = "while starting" if self.cold_start_s is None else "after it was ready"
            self._ended = self.watch.result(self.exit_code(), self.pid, when=when)
        return self._ended

    def survivors(self) -> list[int]:
        """PIDs seen in its tree that still run (the same processes, not reused PIDs)."""
        return sorted(pid for pid, started in self.pids_seen.items() if pid_alive(pid, started))


def new_log_path(profile: Profile, directory: Path | None = None) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return (directory or runs_dir()) / f"{safe_name(profile.name)}-{stamp}-{profile.port}.log"


def launch_instance(resolved: ResolvedProfile, log_dir: Path | None = None) -> EngineInstance:
    """Start the resolved argv (no shell, own process group, output to a fresh log file)."""
    profile = resolved.profile
    if resolved.argv is None:
        return EngineInstance(resolved=resolved)
    log_path = new_log_path(profile, log_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # resolve() refuses a key on the argv; redacted all the same, as a second line of defence. The env
    # (it may hold the key) is never logged.
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"# enginetop {datetime.now().isoformat(timespec='seconds')}: profile {profile.name}\n")
        masked = mask_argv(resolved.argv, engine_options(profile.engine), [resolved.api_key])
        log.write(f"# argv: {shlex.join(masked)}\n")
        if resolved.workdir:
            log.write(f"# cwd: {resolved.workdir}\n")
    try:
        launched = launch(list(resolved.argv), log_path, env=resolved.env, cwd=resolved.workdir)
    except OSError as exc:
        raise StepError("start", f"cannot run {resolved.argv[0]!r}: {exc.strerror or exc}") from exc
    try:
        create_time = psutil.Process(launched.pid).create_time()
    except psutil.Error:
        create_time = None
    instance = EngineInstance(
        resolved=resolved,
        pid=launched.pid,
        pgid=launched.pid,
        create_time=create_time,
        log_path=log_path,
        launched=launched,
        started_mono=launched.started_at,
    )
    instance.watch = StartWatch()
    instance.watch.sample(instance.tree_pids())
    return instance


# ---------------------------------------------------------------- readiness


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    stage: str  # the first check that is not yet met: process, port, health, completion; "ready"
    message: str


def _served_model(client: httpx.Client, url: str, headers: dict[str, str]) -> str | None:
    """The first model id from /v1/models; vLLM and SGLang want it in the request, llama.cpp ignores it."""
    try:
        reply = client.get(f"{url}/v1/models", headers=headers)
        data = reply.json().get("data") if reply.status_code == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            return data[0].get("id")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


def check_ready(instance: EngineInstance, client: httpx.Client) -> Readiness:
    """One pass over the readiness checks, each independent, stopping at the first unmet one."""
    profile = instance.profile
    if not instance.attached and not instance.alive():
        raise StepError("ready", crash_message(instance, "while starting"))
    if not port_open(profile.connect_host, profile.port, timeout=1.0):
        return Readiness(False, "port", f"port {profile.port} on {profile.connect_host} not listening yet")
    headers = auth_headers(instance.resolved.api_key)
    url = profile.url
    try:
        health = client.get(f"{url}{profile.health_path}", headers=headers)
    except httpx.HTTPError as exc:
        return Readiness(False, "health", f"{profile.health_path}: {type(exc).__name__}")
    if health.status_code != 200:
        return Readiness(
            False, "health", f"{profile.health_path} answered {health.status_code}{_short_reason(health)}"
        )
    body: dict[str, object] = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    # A router's /v1/models lists every model it has, and a completion naming one loads it: name ours.
    model = profile.router_model or _served_model(client, url, headers)
    if model:
        body["model"] = model
    try:
        reply = client.post(f"{url}/v1/completions", json=body, headers=headers)
    except httpx.HTTPError as exc:
        return Readiness(False, "completion", f"1-token completion: {type(exc).__name__}")
    if reply.status_code != 200:
        return Readiness(
            False, "completion", f"1-token completion answered {reply.status_code}{_short_reason(reply)}"
        )
    try:
        choices = reply.json().get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not isinstance(choices, list) or not choices:
        return Readiness(False, "completion", "1-token completion answered 200 without choices")
    return Readiness(True, "ready", "process alive, port listening, health 200, 1-token completion answered")


def _short_reason(reply: httpx.Response) -> str:
    message = error_text(reply.content, limit=80)
    return f" ({message})" if message else ""


def wait_ready(
    instance: EngineInstance,
    cancel: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
    timeout: float | None = None,
    interval: float = 0.25,
) -> float:
    """Poll check_ready until ready; returns and records the cold-start time (launch to ready)."""
    timeout = instance.profile.start_timeout_s if timeout is None else timeout
    deadline = time.monotonic() + timeout
    last = ""
    with httpx.Client(timeout=httpx.Timeout(30.0, connect=2.0), **client_kwargs(instance.url)) as client:
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled("ready")
            try:
                state = check_ready(instance, client)
            except StepError:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("ready") from None  # it died of the cancel's SIGTERM: not a crash
                raise
            if state.ready:
                instance.cold_start_s = time.monotonic() - instance.started_mono
                instance.tree_pids()
                return instance.cold_start_s
            if state.message != last and progress is not None:
                progress(state.message)
            last = state.message
            if time.monotonic() >= deadline:
                raise StepError("ready", timeout_message("ready", timeout, last), timed_out=True)
            pids = instance.tree_pids()  # children (vLLM's engine core) appear while it loads
            if instance.watch is not None:
                instance.watch.sample(pids)
            time.sleep(interval)


def crashed_status(instance: EngineInstance, when: str = "") -> EngineStatus:
    """What the UI's status line shows of an engine that exited by itself: why, with its log's tail."""
    return EngineStatus("crashed", profile=instance.name, pid=instance.pid, url=instance.url,
                        exit_code=instance.exit_code(), log_path=instance.log_path,
                        log_tail=tuple(instance.log_tail()), message=crash_message(instance, when),
                        start_memory=instance.start_memory())


def crash_message(instance: EngineInstance, when: str = "") -> str:
    tail = instance.log_tail()
    where = f" (log {instance.log_path})" if instance.log_path else ""
    text = f"engine {instance.name} (PID {instance.pid}) exited {when}".rstrip()
    text += f" with {exit_words(instance.exit_code())}{where}"
    memory = instance.start_memory()
    if memory is not None:
        text += f"; {memory_words(memory)}"
    if tail:
        text += "; last log lines:\n" + "\n".join(tail)
    return text


def memory_words(m: StartMemory) -> str:
    gib = 2**30
    swap = f" + {m.peak_swap_bytes / gib:.2f} GiB in swap" if m.peak_swap_bytes else ""
    text = (f"its process tree peaked at RSS {m.peak_rss_bytes / gib:.2f} GiB{swap} ({m.peak_after_s:.1f} s "
            f"after launch) of the machine's {m.ram_total_bytes / gib:.1f} GiB RAM")
    if m.ram_used_at_end_bytes is not None:
        text += f"; host memory when it ended: {m.ram_used_at_end_bytes / gib:.1f} GiB used"
        if m.swap_used_at_end_bytes:
            text += f", {m.swap_used_at_end_bytes / gib:.1f} GiB swap"
    if m.oom_evidence:
        text += f"; {m.oom_evidence}"
    return text


# ---------------------------------------------------------------- stopping


def stop_instance(instance: EngineInstance, timeout: float | None = None) -> str:
    """TERM the group, KILL after the timeout, then verify independently that every process we saw is gone
    and the port is closed. Returns what happened; raises StepError("stop") when something survived."""
    if instance.attached:
        return "attached to a server enginetop did not start: left running"
    timeout = instance.profile.stop_timeout_s if timeout is None else timeout
    instance.stopping = True
    instance.tree_pids()
    # The group while its leader is provably ours, then every PID seen in its tree whose start time still
    # matches (children that left the group, or outlived a crashed leader); never a reused PGID or PID.
    how = instance.group().stop(timeout)
    survivors: list[int] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        survivors = instance.survivors()
        listening = port_open(instance.profile.connect_host, instance.profile.port)
        if not survivors and not listening:
            break
        time.sleep(0.1)
    else:
        if survivors:
            names = ", ".join(describe_process(_proc(pid)) for pid in survivors)
            raise StepError("stop", f"still running after SIGKILL: {names}")
        raise StepError(
            "stop",
            f"every process of {instance.name} is gone but port {instance.profile.port} "
            f"is still listening: {port_holder_words(instance.profile.port)}",
        )
    words = {
        "terminated": "stopped by SIGTERM",
        "killed": f"did not stop within {timeout:.0f} s: SIGKILL",
        "gone": "was not running",
    }[how]
    return (
        f"{words}; {len(instance.pids_seen)} process(es) verified gone, port {instance.profile.port} closed"
    )


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def port_holder_words(port: int) -> str:
    holders = port_listeners(port)
    if not holders:
        return "held by a process this user cannot see"
    return ", ".join(describe_process(p) for p in holders)
