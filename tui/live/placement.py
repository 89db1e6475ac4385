"""Where an engine's processes run, in the words every view shows (the column, the detail, the host panel,
snapshot): the container it runs in, what that container's cgroup imposes and how hard it holds, and what
holds its port when no process of this machine is the engine's. Computed once here; widgets draw it."""

from __future__ import annotations

from tui.model.containers import CgroupReading, CgroupUse, Container

THROTTLED = 0.20  # a share of CPU periods throttled worth a colour (tui.findings.container fires at it too)


def _size(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"


def container_words(c: Container, cgroup: CgroupReading | None = None) -> str:
    """"in container llama · podman · image ghcr.io/ggml-org/llama.cpp:server · 2.0 GiB limit · 1.5 cores"."""
    parts = [f"in container {c.label()}", c.runtime]
    if c.image:
        parts.append(f"image {c.image}")
    limit = cgroup.memory_limit_bytes if cgroup is not None and cgroup.memory_limit_bytes else \
        c.memory_limit_bytes
    if limit:
        parts.append(f"{_size(limit)} limit")
    cores = cgroup.cpu_quota_cores if cgroup is not None and cgroup.cpu_quota_cores else c.cpu_limit
    if cores:
        parts.append(f"{cores:g} cores")
    if c.state and c.state != "running":
        parts.append(c.state)
    if c.restarts:
        parts.append(f"restarted {c.restarts}×")
    return " · ".join(parts)


def limit_words(cgroup: CgroupReading, use: CgroupUse | None) -> tuple[str, bool]:
    """"memory 101 MiB of 2.0 GiB (5%) · CPU 1.4 of 1.5 cores, throttled 34% of periods (2.1 s held
    back)", and whether it is being held back now (throttled, near its memory limit, OOM-killed)."""
    if cgroup.error:
        return f"cgroup not read: {cgroup.error}", False
    parts: list[str] = []
    pressed = False
    if cgroup.memory_bytes is not None:
        text = f"memory {_size(cgroup.memory_bytes)}"
        if cgroup.memory_limit_bytes:
            share = cgroup.memory_bytes / cgroup.memory_limit_bytes
            text += f" of {_size(cgroup.memory_limit_bytes)} ({share:.0%})"
            pressed = share >= 0.9
        parts.append(text)
    cpu = []
    if use is not None and use.cores_used is not None:
        cpu.append(f"{use.cores_used:.1f}")
    if cgroup.cpu_quota_cores:
        quota = f"{cgroup.cpu_quota_cores:g} cores"
        cpu.append(f"of {quota}" if cpu else f"quota {quota}")
    elif cpu:
        cpu.append("cores")
    if cpu:
        text = "CPU " + " ".join(cpu)
        if use is not None and use.throttled_share is not None and cgroup.cpu_quota_cores:
            text += f", throttled {use.throttled_share:.0%} of periods"
            if use.throttled_s:
                text += f" ({use.throttled_s:.1f} s held back)"
            pressed = pressed or use.throttled_share >= THROTTLED
        parts.append(text)
    if use is not None and use.oom_kills:
        parts.append(f"{use.oom_kills} OOM kill{'s' if use.oom_kills != 1 else ''}")
        pressed = True
    return " · ".join(parts) or "no limit set", pressed
