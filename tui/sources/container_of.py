"""Which container a host process runs in, from the host's /proc alone: its runtime and id from the path
/proc/PID/cgroup names, and its PIDs in each nested PID namespace from /proc/PID/status (`NSpid:`).

No runtime API is asked (no socket, nothing that could block): one small file is read per process. The
cgroup paths the runtimes make, v1 (one line per controller) or v2 (`0::/path`), with systemd or cgroupfs
managing them:

    podman      /machine.slice/libpod-<id>.scope, /libpod_parent/libpod-<id> (its conmon is libpod-conmon-…)
    docker      /system.slice/docker-<id>.scope, /docker/<id>
    containerd  …/cri-containerd-<id>.scope (Kubernetes with the systemd driver)
    cri-o       …/crio-<id>.scope (its conmon is crio-conmon-…)
    kubernetes  /kubepods/<qos>/pod<uid>/<id> (the cgroupfs driver: the path does not name the runtime)

A container in a container has both in its path: the innermost (last) one is the process's own.
"""

from __future__ import annotations

import os
import re

_ID = r"([0-9a-f]{64})"
# (runtime, pattern) per path component; the first pattern that matches a component names it
_COMPONENT = (
    ("podman", re.compile(rf"libpod-{_ID}(?:\.scope)?")),
    ("docker", re.compile(rf"docker-{_ID}\.scope")),
    ("containerd", re.compile(rf"cri-containerd-{_ID}\.scope")),
    ("cri-o", re.compile(rf"crio-{_ID}\.scope")),
)
_BARE_ID = re.compile(_ID)


def container_of_cgroup(text: str) -> tuple[str, str] | None:
    """(runtime, full id) of the innermost container a /proc/PID/cgroup text names, or None (a process on
    the host, or a path no runtime pattern fits)."""
    for line in text.splitlines():
        found = _container_of_path(line.split(":", 2)[-1])
        if found is not None:  # every controller's path names the same container: the first line is it
            return found
    return None


def _container_of_path(path: str) -> tuple[str, str] | None:
    found: tuple[str, str] | None = None
    parts = [p for p in path.strip().split("/") if p]
    for i, part in enumerate(parts):
        for runtime, pattern in _COMPONENT:
            m = pattern.fullmatch(part)
            if m:
                found = (runtime, m.group(1))
                break
        else:
            if _BARE_ID.fullmatch(part) and i > 0:
                parent = parts[i - 1]
                if parent == "docker":
                    found = ("docker", part)
                elif any(p == "kubepods" or p.startswith("kubepods") for p in parts[:i]):
                    found = ("kubernetes", part)
    return found


def container_of(pid: int, proc_root: str = "/proc") -> tuple[str, str] | None:
    """(runtime, full id) of the container process `pid` (as the host numbers it) runs in, or None: on the
    host, gone, or its cgroup file unreadable. `proc_root` is /proc, or a tree shaped like it (tests)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return container_of_cgroup(text)


def nspid(pid: int, proc_root: str = "/proc") -> tuple[int, ...]:
    """Process `pid`'s PID in each PID namespace it is in, the host's first, then each nested one inward
    (the `NSpid:` line of /proc/PID/status); () when it is gone or the kernel (before 4.1) has no such
    line."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(v) for v in line.split()[1:])
    except (OSError, ValueError):
        return ()
    return ()
