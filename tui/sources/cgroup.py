"""What a process's cgroup imposes and counts: its container's memory limit and CPU quota, the memory it uses,
the kernel's OOM kills in it, and how often the quota held it back (on a CPU engine that is its throttling,
as a GPU's clocks are a GPU's). Read from the host's cgroup filesystem, v1 or v2, in the kernel's layout
(Documentation/admin-guide/cgroup-v1/memory.rst and cpuacct.rst, scheduler/sched-bwc.rst, cgroup-v2.rst).

Blocking (a caller runs it in a thread); it never raises for bad data: a file not there or not a number is a
None field, and a reading's `error` says why nothing could be read.
"""

from __future__ import annotations

import os
from pathlib import Path

from tui.base.paths import sysfs_root
from tui.model.containers import CgroupReading, CgroupUse
from tui.sources import sysfs_files

# v1 says "no limit" with the largest page-aligned signed long (9223372036854771712 on 4 KiB pages): anything
# this large is no limit any machine has
V1_UNLIMITED = 2**62
_DELETED = " (deleted)"  # v2 marks a cgroup removed while the process still names it


class _Files:
    """Reads a cgroup's files; what exists but cannot be read is kept, in words, for the reading's error."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def text(self, path: Path) -> str | None:
        try:
            return sysfs_files.read_text(path)
        except FileNotFoundError:
            return None  # an older kernel's, or a controller not enabled here: that field is not known
        except OSError as e:
            self.problems.append(f"cannot read {path}: {e.strerror or e}")
            return None

    def number(self, path: Path) -> int | None:
        return _int(self.text(path))

    def keyed(self, path: Path) -> dict[str, int]:
        """A flat keyed file (cpu.stat, memory.events, memory.oom_control): "key value" lines."""
        out: dict[str, int] = {}
        for line in (self.text(path) or "").splitlines():
            key, _, value = line.strip().partition(" ")
            if (n := _int(value)) is not None:
                out[key] = n
        return out


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, tuple[str, str]]]:
    """/proc/PID/cgroup: the v2 path ("0::/path") and, for each v1 controller, (its path, the name its
    hierarchy is mounted under: "cpu,cpuacct" for a combined one). Named hierarchies (name=systemd) carry no
    controller and are left out; a line not in the kernel's form is skipped."""
    v2: str | None = None
    v1: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, listed, path = parts
        path = path.removesuffix(_DELETED)
        if hierarchy == "0" and not listed:
            v2 = path
            continue
        names = [c for c in listed.split(",") if c and not c.startswith("name=")]
        for name in names:
            v1[name] = (path, ",".join(names))
    return v2, v1


def _v1_dir(base: Path, v1: dict[str, tuple[str, str]], controller: str) -> tuple[str, Path] | None:
    """Where a v1 controller's files for this cgroup are: its own mount, else its combined one."""
    if controller not in v1:
        return None
    path, combined = v1[controller]
    for mount in dict.fromkeys((controller, combined)):
        if (base / mount).is_dir():
            return path, base / mount / path.lstrip("/")
    return None


def _v2_dir(base: Path, path: str | None) -> Path | None:
    """The unified hierarchy's directory: at the cgroup root (v2 only), or under unified/ (hybrid)."""
    if path is None:
        return None
    for top in (base, base / "unified"):
        if (top / "cgroup.controllers").is_file():
            return top / path.lstrip("/")
    return None


def _cores(quota: int | None, period: int | None) -> float | None:
    return quota / period if quota is not None and period and quota > 0 and period > 0 else None


def _working_set(usage: int | None, inactive_file: int | None) -> int | None:
    """What the cgroup's processes hold, less the page cache the kernel takes back before it would kill one
    (inactive file pages), as `docker stats` and the kubelet count it: an engine that maps its model file
    is not near its limit for the file's pages alone."""
    if usage is None:
        return None
    return max(0, usage - inactive_file) if inactive_file is not None else usage


def _v1_memory(f: _Files, d: Path) -> dict[str, int | None]:
    limit = f.number(d / "memory.limit_in_bytes")
    oom = f.keyed(d / "memory.oom_control")  # oom_kill since Linux 4.13
    stat = f.keyed(d / "memory.stat")
    return {"memory_bytes": _working_set(f.number(d / "memory.usage_in_bytes"),
                                         stat.get("total_inactive_file", stat.get("inactive_file"))),
            "memory_limit_bytes": limit if limit is not None and 0 <= limit < V1_UNLIMITED else None,
            "oom_kills": oom.get("oom_kill")}


def _v2_memory(f: _Files, d: Path) -> dict[str, int | None]:
    return {"memory_bytes": _working_set(f.number(d / "memory.current"),
                                         f.keyed(d / "memory.stat").get("inactive_file")),
            "memory_limit_bytes": f.number(d / "memory.max"),  # "max" is no number: no limit
            "oom_kills": f.keyed(d / "memory.events").get("oom_kill")}


def _v1_cpu(f: _Files, d: Path) -> dict[str, float | int | None]:
    stat = f.keyed(d / "cpu.stat")
    ns = stat.get("throttled_time")
    return {"cpu_quota_cores": _cores(f.number(d / "cpu.cfs_quota_us"), f.number(d / "cpu.cfs_period_us")),
            "cpu_periods": stat.get("nr_periods"), "cpu_throttled_periods": stat.get("nr_throttled"),
            "cpu_throttled_s": ns / 1e9 if ns is not None else None}


def _v2_cpu(f: _Files, d: Path) -> dict[str, float | int | None]:
    stat = f.keyed(d / "cpu.stat")
    quota, _, period = (f.text(d / "cpu.max") or "").strip().partition(" ")
    us = stat.get("throttled_usec")
    return {"cpu_quota_cores": _cores(_int(quota), _int(period)),
            "cpu_periods": stat.get("nr_periods"), "cpu_throttled_periods": stat.get("nr_throttled"),
            "cpu_throttled_s": us / 1e6 if us is not None else None}


def _usage_s(f: _Files, v1_acct: Path | None, v2: Path | None) -> float | None:
    if v1_acct is not None and (ns := f.number(v1_acct / "cpuacct.usage")) is not None:
        return ns / 1e9
    # a hybrid system without cpuacct still counts the time in the unified hierarchy's cpu.stat
    us = f.keyed(v2 / "cpu.stat").get("usage_usec") if v2 is not None else None
    return us / 1e6 if us is not None else None


def _own(found: tuple[str, Path] | None) -> Path | None:
    """The directory to read, where the cgroup is not the root: the root imposes nothing, and its counters are
    the whole machine's, not the process's."""
    return found[1] if found is not None and found[0] != "/" else None


def _why_nothing(f: _Files, base: Path, used: list[tuple[str, Path]]) -> str:
    if f.problems:
        return "; ".join(f.problems)
    missing = [d for _, d in used if not d.is_dir()]
    if missing:
        return (f"its cgroup's directory {missing[0]} is not there (the container ended, or enginetop runs "
                "in another cgroup namespace)")
    if not used:
        return f"no cgroup filesystem with its memory or cpu controller is mounted at {base}"
    return f"its cgroup's files under {used[0][1]} hold no figure enginetop reads"


def read_cgroup(pid: int, proc_cgroup: str | None = None) -> CgroupReading | None:
    """What the cgroup of process `pid` imposes and counts, from v1 files where the v1 memory and cpu
    controllers are mounted, else v2. `proc_cgroup`: /proc/PID/cgroup's text where the caller has it. None
    when the process is gone. The cgroup's own limits only (a container's scope for crun's `container` child):
    a parent cgroup's limit is not looked for. Memory is the working set (_working_set)."""
    ours = proc_cgroup is None  # a caller's text may name a process that is not on this machine
    if proc_cgroup is None:
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                proc_cgroup = fh.read()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError as e:
            return CgroupReading(path="", error=f"cannot read /proc/{pid}/cgroup: {e.strerror or e}")
    v2_path, v1 = parse_proc_cgroup(proc_cgroup)
    if v2_path is None and not v1:
        return CgroupReading(path="", error=f"no cgroup named in /proc/{pid}/cgroup")
    base = sysfs_root() / "fs" / "cgroup"
    f = _Files()
    if v2_path is not None and v2_path.rstrip("/").endswith("/container"):
        # crun (and Podman's split cgroups) put a container's processes in a `container` child of its scope,
        # whose limits and counters are the scope's: the container's cgroup is the scope
        v2_path = v2_path.rstrip("/").removesuffix("/container") or "/"
    v2_dir = _v2_dir(base, v2_path)
    v2 = (v2_path, v2_dir) if v2_path is not None and v2_dir is not None else None
    mem, cpu = _v1_dir(base, v1, "memory") or v2, _v1_dir(base, v1, "cpu") or v2
    used = [found for found in dict.fromkeys((mem, cpu)) if found is not None]
    fields: dict[str, float | int | None] = {}
    if (d := _own(mem)) is not None:
        fields |= (_v2_memory if mem is v2 else _v1_memory)(f, d)
    if (d := _own(cpu)) is not None:
        fields |= (_v2_cpu if cpu is v2 else _v1_cpu)(f, d)
    fields["cpu_usage_s"] = _usage_s(f, _own(_v1_dir(base, v1, "cpuacct")), _own(v2))
    version = 1 if any(x is not None and x is not v2 for x in (mem, cpu)) else 2 if v2 is not None else None
    path = used[0][0] if used else v2_path or next(iter(v1.values()))[0]
    if any(v is not None for v in fields.values()):
        return CgroupReading(path=path, version=version, **fields)  # type: ignore[arg-type]
    # Nothing read. A process in the root cgroup has no limits, and that is no error.
    named = [v1[c][0] for c in ("memory", "cpu", "cpuacct") if c in v1] + [v2_path] * (v2_path is not None)
    if all(p == "/" for p in named) and not f.problems:
        return CgroupReading(path="/", version=version)
    if ours and not os.path.exists(f"/proc/{pid}"):
        return None
    return CgroupReading(path=path, version=version, error=_why_nothing(f, base, used))


def _delta(before: float | None, now: float | None) -> float | None:
    return now - before if before is not None and now is not None else None


def _per_s(amount: float | None, seconds: float) -> float | None:
    return amount / seconds if amount is not None and seconds > 0 else None


_COUNTERS = ("cpu_periods", "cpu_throttled_periods", "cpu_throttled_s", "cpu_usage_s", "oom_kills")


def use_between(before: CgroupReading, now: CgroupReading, seconds: float) -> CgroupUse:
    """What the cgroup did between two readings `seconds` apart: the share of enforcement periods the quota
    ran out in, the time held back per second, CPU cores used, OOM kills. A counter that went back, or another
    cgroup, voids the window (the rule of tui.sources.rates): a restarted container starts from zero."""
    quota = now.cpu_quota_cores
    deltas = {name: _delta(getattr(before, name), getattr(now, name)) for name in _COUNTERS}
    if before.path != now.path or any(d is not None and d < 0 for d in deltas.values()):
        return CgroupUse(seconds, quota_cores=quota, reset=True)
    periods, throttled = deltas["cpu_periods"], deltas["cpu_throttled_periods"]
    held, usage, ooms = deltas["cpu_throttled_s"], deltas["cpu_usage_s"], deltas["oom_kills"]
    return CgroupUse(
        seconds,
        periods=int(periods) if periods is not None else None,
        throttled_periods=int(throttled) if throttled is not None else None,
        throttled_share=throttled / periods if throttled is not None and periods else None,
        throttled_s=held, throttled_s_per_s=_per_s(held, seconds), cores_used=_per_s(usage, seconds),
        quota_cores=quota,
        oom_kills=int(ooms) if ooms is not None else None)
