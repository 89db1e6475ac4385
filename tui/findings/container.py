"""Findings from an engine's container: its CPU quota holding it back, its memory near the cgroup's limit, and
the kernel's OOM killer ending a process in it. From a cgroup's counters over a window (CgroupUse, made by
tui.sources.cgroup.use_between) and its newest reading.
"""

from __future__ import annotations

from tui.engines.known import by_name
from tui.model.config import EngineConfig
from tui.model.containers import CgroupReading, CgroupUse, Container
from tui.model.findings import Figure, Finding, FindingSeverity

# Throttled: at least this share of the quota's enforcement periods ran out of quota, over at least this many
# periods (1 s at the default 100 ms period: fewer say too little)
THROTTLED_SHARE = 0.20
MIN_PERIODS = 10
NEAR_LIMIT = 0.90  # memory at this share of the cgroup's limit
GIB = 2**30


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def _files(version: int | None, v1: str, v2: str) -> str:
    """The files a figure was read from, by the cgroup's version."""
    return {1: f"cgroup v1 {v1}", 2: f"cgroup v2 {v2}"}.get(version or 0, "the cgroup's files")


def _finding(engine: str, id: str, severity: FindingSeverity, title: str, suggestion: str,
             evidence: list[str], **figures: Figure) -> Finding:
    return Finding(id, engine, severity, title, suggestion, tuple(evidence), tuple(figures.items()))


def _lower(config: EngineConfig | None) -> str:
    """What lowers the engine's memory, in its own options (tui.engines)."""
    known = by_name(config.engine) if config is not None else None
    return known.memory_options if known is not None else "a smaller context or KV cache"


def _whose(container: Container | None) -> str:
    return f"container {container.label()}" if container is not None else "its container"


def cpu_throttled(engine: str, use: CgroupUse | None, reading: CgroupReading | None,
                  container: Container | None = None) -> Finding | None:
    """The quota ran out in THROTTLED_SHARE of the periods or more: the engine's threads wait for the next
    period, as a GPU waits when it is throttled."""
    if use is None or use.periods is None or use.periods < MIN_PERIODS or use.throttled_periods is None \
            or use.throttled_share is None or use.throttled_share < THROTTLED_SHARE:
        return None
    version = reading.version if reading is not None else None
    quota = f"{use.quota_cores:g}-core quota" if use.quota_cores is not None else "quota (its size not read)"
    used = f", using {use.cores_used:.2f} cores" if use.cores_used is not None else ""
    evidence = [f"{use.throttled_periods:,} of {use.periods:,} enforcement periods throttled in the last "
                f"{use.seconds:.0f} s ({_files(version, 'cpu.stat nr_throttled, nr_periods', 'cpu.stat')})"]
    if use.throttled_s is not None:
        evidence.append(f"held back {use.throttled_s:.1f} s in all, summed over the CPUs it ran on "
                        f"({use.throttled_s / use.seconds:.2f} s per second)" if use.seconds > 0 else
                        f"held back {use.throttled_s:.1f} s in all")
    if use.quota_cores is not None:
        evidence.append(f"quota {use.quota_cores:g} cores "
                        f"({_files(version, 'cpu.cfs_quota_us / cpu.cfs_period_us', 'cpu.max')})")
    if use.cores_used is not None:
        evidence.append(f"CPU used {use.cores_used:.2f} cores "
                        f"({_files(version, 'cpuacct.usage', 'cpu.stat usage_usec')})")
    more = f"a --cpus above {use.quota_cores:g}" if use.quota_cores is not None else "a larger --cpus"
    return _finding(
        engine, "container-cpu-throttled", "warning",
        f"{engine} is throttled by its container's CPU quota: {_whose(container)} ran out of its {quota} in "
        f"{use.throttled_periods:,} of {use.periods:,} periods ({use.throttled_share:.0%}){used}",
        f"give the container more CPU ({more} when it starts), or run the engine with no more threads than "
        "the quota has cores (more only wait for the next period)", evidence,
        throttled_periods=use.throttled_periods, periods=use.periods, throttled_share=use.throttled_share,
        throttled_s=use.throttled_s, quota_cores=use.quota_cores, cores_used=use.cores_used,
        window_s=use.seconds)


def memory_near_limit(engine: str, reading: CgroupReading | None, rss_bytes: int | None = None,
                      container: Container | None = None,
                      config: EngineConfig | None = None) -> Finding | None:
    """The cgroup's memory at NEAR_LIMIT of its limit or more: past the limit the kernel reclaims, then its
    OOM killer ends a process in it."""
    if reading is None or reading.memory_bytes is None or not reading.memory_limit_bytes:
        return None
    used, limit = reading.memory_bytes, reading.memory_limit_bytes
    if used < NEAR_LIMIT * limit:
        return None
    files = _files(reading.version, "memory.usage_in_bytes, memory.limit_in_bytes",
                   "memory.current, memory.max")
    evidence = [f"{_size(used)} used of a {_size(limit)} limit ({files})"]
    if rss_bytes is not None:
        # v1's usage and v2's memory.current count page cache too: the engine's own share says how near it is
        rest = "; the rest is the container's other processes and page cache (which the kernel reclaims " \
            "before it kills)" if rss_bytes < used else ""
        evidence.append(f"the engine's processes hold {_size(rss_bytes)} resident (RSS){rest}")
    return _finding(
        engine, "container-memory-near-limit", "warning",
        f"{engine} is near its container's memory limit: {_whose(container)} uses {_size(used)} of "
        f"{_size(limit)} ({used / limit:.0%})",
        f"raise the container's memory limit (--memory, now {_size(limit)}) or lower what the engine takes "
        f"({_lower(config)})", evidence, memory_bytes=used, memory_limit_bytes=limit, rss_bytes=rss_bytes)


def oom_killed(engine: str, use: CgroupUse | None, reading: CgroupReading | None,
               container: Container | None = None, config: EngineConfig | None = None) -> Finding | None:
    """The cgroup's oom_kill counter rose in the window, or the runtime says the container's last exit was
    the OOM killer's."""
    kills = use.oom_kills if use is not None and use.oom_kills else 0
    runtime = container is not None and container.oom_killed is True
    if not kills and not runtime:
        return None
    limit = reading.memory_limit_bytes if reading is not None else None
    evidence = []
    if kills and use is not None:
        files = _files(reading.version if reading else None, "memory.oom_control", "memory.events")
        evidence.append(f"oom_kill rose by {kills} in the last {use.seconds:.0f} s ({files})")
    if runtime and container is not None:
        evidence.append(f"{container.runtime} says the container's last exit was the kernel's OOM killer "
                        "(State.OOMKilled)")
    what = f"{kills} process{'es' if kills != 1 else ''} in {_whose(container)}" if kills else \
        f"{_whose(container)}'s last run"
    at = f" at its {_size(limit)} memory limit" if limit is not None else ""
    return _finding(
        engine, "container-oom-killed", "error",
        f"{engine} was OOM-killed in its container: the kernel's OOM killer ended {what}{at}",
        f"raise the container's memory limit (--memory) or lower what the engine takes ({_lower(config)})",
        evidence,
        oom_kills=kills or None, runtime_oom_killed=runtime, memory_limit_bytes=limit)


def container_findings(engine: str, use: CgroupUse | None, reading: CgroupReading | None,
                       rss_bytes: int | None = None, container: Container | None = None,
                       config: EngineConfig | None = None) -> list[Finding]:
    """Every container finding that holds for `engine` now, most severe first.

    `use`: the cgroup's counters over the store's window (tui.sources.cgroup.use_between of the window's first
    and newest readings; None before there are two). `reading`: the newest CgroupReading (its limits, its
    memory now, its cgroup version for the evidence). `rss_bytes`: the engine's process tree's RSS, for the
    memory finding's evidence. `container`: the runtime's view, where known (its label names it; its
    `oom_killed` fires the OOM finding without a counter). `config`: names the engine's own memory options.
    What is None never fires a finding."""
    found = [oom_killed(engine, use, reading, container, config),
             memory_near_limit(engine, reading, rss_bytes, container, config),
             cpu_throttled(engine, use, reading, container)]
    return [f for f in found if f is not None]
