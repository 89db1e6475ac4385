"""Findings from an engine's container (tui.findings.container): throttled by its CPU quota, near its memory
limit, OOM-killed; each with the figures it rests on, and none where the figures are ordinary or unknown."""

from __future__ import annotations

import pytest

from tui.findings.container import MIN_PERIODS, container_findings
from tui.model.config import EngineConfig
from tui.model.containers import CgroupReading, CgroupUse, Container

GIB = 2**30
MIB = 2**20
LLAMA = Container(id="ab" * 32, runtime="podman", name="llama")


def v1(memory: int | None = 1 * GIB, limit: int | None = 2 * GIB, version: int = 1) -> CgroupReading:
    return CgroupReading(path="/libpod_parent/libpod-x", version=version, memory_bytes=memory,
                         memory_limit_bytes=limit, oom_kills=0, cpu_quota_cores=1.5)


def window(periods: int = 600, throttled: int = 420, oom: int | None = 0, seconds: float = 60.0,
           quota: float | None = 1.5) -> CgroupUse:
    return CgroupUse(seconds, periods=periods, throttled_periods=throttled,
                     throttled_share=throttled / periods if periods else None, throttled_s=25.2,
                     throttled_s_per_s=25.2 / seconds, cores_used=1.49, quota_cores=quota, oom_kills=oom)


def test_throttled_by_the_quota() -> None:
    [f] = container_findings("llama", window(), v1(), container=LLAMA)
    assert (f.id, f.engine, f.severity) == ("container-cpu-throttled", "llama", "warning")
    assert f.title == ("llama is throttled by its container's CPU quota: container llama ran out of its "
                       "1.5-core quota in 420 of 600 periods (70%), using 1.49 cores")
    assert f.evidence == (
        "420 of 600 enforcement periods throttled in the last 60 s (cgroup v1 cpu.stat nr_throttled, "
        "nr_periods)",
        "held back 25.2 s in all, summed over the CPUs it ran on (0.42 s per second)",
        "quota 1.5 cores (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us)",
        "CPU used 1.49 cores (cgroup v1 cpuacct.usage)")
    assert "--cpus above 1.5" in f.suggestion
    assert dict(f.figures) == {"throttled_periods": 420, "periods": 600, "throttled_share": 0.7,
                               "throttled_s": 25.2, "quota_cores": 1.5, "cores_used": 1.49, "window_s": 60.0}


def test_throttled_in_v2_words_without_a_container_named() -> None:
    [f] = container_findings("vllm", window(periods=100, throttled=20), v1(version=2))
    assert "its container ran out of its 1.5-core quota in 20 of 100 periods (20%)" in f.title
    assert f.evidence[0].endswith("(cgroup v2 cpu.stat)") and f.evidence[2].endswith("(cgroup v2 cpu.max)")


@pytest.mark.parametrize("use", [window(throttled=30),  # 5 % of the periods
                                 window(periods=MIN_PERIODS - 1, throttled=MIN_PERIODS - 1),  # too few
                                 window(periods=0, throttled=0),  # idle
                                 CgroupUse(60.0, quota_cores=1.5, reset=True),  # counters went back
                                 None],
                         ids=["5%", "too-few-periods", "idle", "reset", "no-window"])
def test_not_throttled(use: CgroupUse | None) -> None:
    assert container_findings("llama", use, v1()) == []


def test_near_the_memory_limit() -> None:
    cfg = EngineConfig(engine="llama.cpp", read_wall=0.0)
    [f] = container_findings("llama", None, v1(memory=int(1.9 * GIB)), rss_bytes=1200 * MIB, container=LLAMA,
                             config=cfg)
    assert (f.id, f.severity) == ("container-memory-near-limit", "warning")
    assert f.title == ("llama is near its container's memory limit: container llama uses 1.90 GiB of "
                       "2.00 GiB (95%)")
    assert f.evidence == (
        "1.90 GiB used of a 2.00 GiB limit (cgroup v1 memory.usage_in_bytes, memory.limit_in_bytes)",
        "the engine's processes hold 1.17 GiB resident (RSS); the rest is the container's other processes "
        "and page cache (which the kernel reclaims before it kills)")
    assert "--memory, now 2.00 GiB" in f.suggestion and "-ctk q8_0" in f.suggestion  # llama.cpp's own options
    assert dict(f.figures) == {"memory_bytes": int(1.9 * GIB), "memory_limit_bytes": 2 * GIB,
                               "rss_bytes": 1200 * MIB}


def test_at_exactly_90_percent_in_v2() -> None:
    [f] = container_findings("sglang", None, v1(memory=900 * MIB, limit=1000 * MIB, version=2))
    assert f.id == "container-memory-near-limit" and "(90%)" in f.title
    assert f.evidence == ("900 MiB used of a 1000 MiB limit (cgroup v2 memory.current, memory.max)",)


@pytest.mark.parametrize("reading", [v1(memory=GIB), v1(memory=GIB, limit=None), v1(memory=None),
                                     CgroupReading(path="/"), CgroupReading(path="", error="cannot read"),
                                     None],
                         ids=["50%", "no-limit", "usage-unknown", "root-cgroup", "unreadable", "no-reading"])
def test_not_near_the_memory_limit(reading: CgroupReading | None) -> None:
    assert container_findings("llama", None, reading, rss_bytes=GIB) == []


def test_oom_killed_by_the_counter() -> None:
    found = container_findings("llama", window(throttled=0, oom=2), v1(memory=200 * MIB), container=LLAMA)
    [f] = found
    assert (f.id, f.severity) == ("container-oom-killed", "error")
    assert f.title == ("llama was OOM-killed in its container: the kernel's OOM killer ended 2 processes in "
                       "container llama at its 2.00 GiB memory limit")
    assert f.evidence == ("oom_kill rose by 2 in the last 60 s (cgroup v1 memory.oom_control)",)
    assert dict(f.figures) == {"oom_kills": 2, "runtime_oom_killed": False, "memory_limit_bytes": 2 * GIB}


def test_oom_killed_as_the_runtime_says() -> None:
    """The container restarted: a new cgroup, its counters void, but its runtime says the last exit was the
    OOM killer's."""
    dead = Container(id="cd" * 32, runtime="docker", name="vllm", oom_killed=True)
    [f] = container_findings("vllm", CgroupUse(30.0, reset=True), v1(memory=100 * MIB), container=dead)
    assert f.id == "container-oom-killed"
    assert "the kernel's OOM killer ended container vllm's last run" in f.title
    assert f.evidence == ("docker says the container's last exit was the kernel's OOM killer "
                          "(State.OOMKilled)",)
    assert dict(f.figures)["runtime_oom_killed"] is True and dict(f.figures)["oom_kills"] is None


def test_all_at_once_most_severe_first() -> None:
    found = container_findings("llama", window(oom=1), v1(memory=int(1.95 * GIB)), rss_bytes=GIB)
    assert [f.id for f in found] == ["container-oom-killed", "container-memory-near-limit",
                                     "container-cpu-throttled"]


def test_nothing_when_nothing_is_wrong() -> None:
    assert container_findings("llama", window(throttled=0), v1(), rss_bytes=GIB, container=LLAMA) == []
    assert container_findings("llama", None, None) == []
