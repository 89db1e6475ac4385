"""Where an engine's processes live on this machine: the container they run in, what its cgroup imposes, and
who holds the engine's port when that is not the engine (a container runtime's port publisher, a tunnel, a
forwarder, enginetop's proxy). Values only: tui.sources.containers, tui.sources.cgroup and
tui.sources.port_holder read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Container:
    """A container, as its runtime's API tells it (`via` names the socket), or as the host's /proc tells it
    (`via` "/proc": its id and runtime from the cgroup path, its name from conmon's command line where
    Podman runs it; no image, state or limits then)."""

    id: str
    runtime: str  # "podman", "docker", "containerd", "cri-o", ...
    name: str | None = None
    image: str | None = None
    state: str | None = None  # running, restarting, paused, exited
    restarts: int | None = None
    oom_killed: bool | None = None  # the runtime says its last exit was the kernel's OOM killer
    pid: int | None = None  # its first process, as the host numbers it
    # (host address, host port, container port) for each published TCP port
    ports: tuple[tuple[str, int, int], ...] = ()
    address: str | None = None  # its own IP address on the runtime's network, where it has one
    memory_limit_bytes: int | None = None  # as the runtime was told (the cgroup says what holds)
    cpu_limit: float | None = None  # cores, as the runtime was told
    command: tuple[str, ...] = ()  # what it runs (entrypoint and arguments), masked before it is kept
    via: str = "/proc"

    def short_id(self) -> str:
        return self.id[:12]

    def label(self) -> str:
        """Its name, else its short id."""
        return self.name or self.short_id()


@dataclass(frozen=True, slots=True)
class CgroupReading:
    """What a process's cgroup imposes and counts (v1 or v2), from the host's /sys/fs/cgroup. None: not set
    (no limit, no quota) or not readable; `error` says why nothing could be read."""

    path: str  # the cgroup's path, as /proc/PID/cgroup names it
    version: int | None = None  # 1 or 2
    # what the cgroup's processes hold now, less the page cache the kernel can take back (inactive files): the
    # working set, as `docker stats` and the kubelet count it
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None  # None: no limit
    oom_kills: int | None = None  # processes the kernel's OOM killer ended in it (counter)
    cpu_quota_cores: float | None = None  # quota / period; None: no quota
    cpu_periods: int | None = None  # enforcement periods that have passed (counter)
    cpu_throttled_periods: int | None = None  # periods in which it ran out of quota (counter)
    cpu_throttled_s: float | None = None  # time its processes were held back (counter)
    cpu_usage_s: float | None = None  # CPU time its processes used (counter)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CgroupUse:
    """A cgroup's counters between two readings `seconds` apart. None where a counter is missing in either
    reading; every counter is None when the window is void (`reset`: a counter went back, or the process is
    in another cgroup now: a restarted container has a new one)."""

    seconds: float
    periods: int | None = None  # CPU quota enforcement periods that passed
    throttled_periods: int | None = None  # of them, periods in which the quota ran out
    throttled_share: float | None = None  # throttled_periods / periods (None without a period)
    throttled_s: float | None = None  # time held back, summed over the CPUs it ran on
    throttled_s_per_s: float | None = None
    cores_used: float | None = None  # CPU seconds used per second
    quota_cores: float | None = None  # the quota now (None: no quota)
    oom_kills: int | None = None  # processes the OOM killer ended in it
    reset: bool = False


@dataclass(frozen=True, slots=True)
class PortHolder:
    """Who holds an engine's port on this machine and which process is the engine's own.

    `engine_pid` is the engine's root process: the listener itself when it is the engine, the engine's process
    in the container a runtime's publisher (conmon, docker-proxy, rootlessport, pasta) forwards to, or None.
    `forwarder` says what the listener is when it is not the engine ("published by podman for container
    llama"); `why_none` says why no engine process of this machine stands behind the port ("an ssh tunnel:
    the engine is elsewhere")."""

    port: int
    pid: int | None = None  # the listening process
    program: str | None = None  # its program name
    engine_pid: int | None = None
    forwarder: str | None = None
    why_none: str | None = None
    container: Container | None = None
