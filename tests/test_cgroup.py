"""A process's cgroup, read as the kernel lays it out: trees under ENGINETOP_SYSFS_ROOT in the documented
layouts (Documentation/admin-guide/cgroup-v1/ and cgroup-v2.rst: v1 with separate and combined cpu,cpuacct
mounts, v2, hybrid), /proc/PID/cgroup's text passed in; malformed files; the counters over a window. And one
real Podman container whose 0.5-core quota throttles a busy loop."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.sysfs_tree import write
from tui.findings.container import container_findings
from tui.model.containers import CgroupReading, CgroupUse
from tui.sources import sysfs_files
from tui.sources.cgroup import parse_proc_cgroup, read_cgroup, use_between

CID = "libpod-" + "3f" * 32
PATH = f"/libpod_parent/{CID}"
GIB = 2**30
# /proc/PID/cgroup of a process in a Podman container on a hybrid (v1 + unified) host, as this machine's
V1_PROC = "\n".join([f"9:name=systemd:{PATH}", f"8:pids:{PATH}", f"4:memory:{PATH}", f"3:cpuset:{PATH}",
                     f"2:cpuacct:{PATH}", f"1:cpu:{PATH}", f"0::{PATH}"]) + "\n"
COMBINED_PROC = f"4:memory:{PATH}\n2:cpu,cpuacct:{PATH}\n1:name=systemd:{PATH}\n0::{PATH}\n"
V2_PROC = f"0::{PATH}\n"
PID = 4242  # never looked for: the text is passed in


@pytest.fixture
def cgroup_fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    return tmp_path / "fs" / "cgroup"


def v1_memory(fs: Path, limit: int = 2 * GIB, usage: int = 700 * 2**20, oom: int | None = 0) -> Path:
    d = fs / "memory" / PATH.lstrip("/")
    write(d / "memory.limit_in_bytes", limit)
    write(d / "memory.usage_in_bytes", usage)
    kill = f"oom_kill {oom}\n" if oom is not None else ""  # before Linux 4.13 the line is not there
    write(d / "memory.oom_control", f"oom_kill_disable 0\nunder_oom 0\n{kill}".rstrip())
    return d


def v1_cpu(fs: Path, mount: str = "cpu", quota: int = 150000, period: int = 100000, periods: int = 13,
           throttled: int = 0, throttled_ns: int = 0) -> Path:
    d = fs / mount / PATH.lstrip("/")
    write(d / "cpu.cfs_quota_us", quota)
    write(d / "cpu.cfs_period_us", period)
    write(d / "cpu.stat", f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled_ns}\n"
                          "nr_bursts 0\nburst_time 0")
    return d


def unified(fs: Path, top: Path, memory_max: str = "2147483648", cpu_max: str = "150000 100000") -> Path:
    write(top / "cgroup.controllers", "cpuset cpu io memory pids")
    d = top / PATH.lstrip("/")
    write(d / "memory.max", memory_max)
    write(d / "memory.current", 512 * 2**20)
    write(d / "memory.events", "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0")
    write(d / "cpu.max", cpu_max)
    write(d / "cpu.stat", "usage_usec 2500000\nuser_usec 2400000\nsystem_usec 100000\nnr_periods 40\n"
                          "nr_throttled 30\nthrottled_usec 1500000\nnr_bursts 0\nburst_usec 0")
    return d


def test_v1_separate_mounts_as_podman_makes_them(cgroup_fs: Path) -> None:
    """This machine's layout: each controller mounted on its own, a unified hierarchy beside them (hybrid):
    the v1 memory and cpu files hold the limits, and are read."""
    v1_memory(cgroup_fs)
    v1_cpu(cgroup_fs, periods=13)
    write(cgroup_fs / "cpuacct" / PATH.lstrip("/") / "cpuacct.usage", 1_060_842_345)
    write(cgroup_fs / "unified" / "cgroup.controllers", "")
    write(cgroup_fs / "unified" / PATH.lstrip("/") / "cpu.stat", "usage_usec 999\n")
    r = read_cgroup(PID, V1_PROC)
    assert r == CgroupReading(path=PATH, version=1, memory_bytes=700 * 2**20, memory_limit_bytes=2 * GIB,
                              oom_kills=0, cpu_quota_cores=1.5, cpu_periods=13, cpu_throttled_periods=0,
                              cpu_throttled_s=0.0, cpu_usage_s=1.060842345)


@pytest.mark.parametrize("links", [True, False], ids=["with-symlinks", "combined-only"])
def test_v1_combined_cpu_cpuacct(cgroup_fs: Path, links: bool) -> None:
    """cpu and cpuacct mounted together at cpu,cpuacct (systemd's way), with or without the cpu and cpuacct
    symlinks beside it."""
    v1_memory(cgroup_fs)
    d = v1_cpu(cgroup_fs, mount="cpu,cpuacct", quota=50000, period=100000, periods=200, throttled=150,
               throttled_ns=7_500_000_000)
    write(d / "cpuacct.usage", 30 * 10**9)
    if links:
        (cgroup_fs / "cpu").symlink_to("cpu,cpuacct")
        (cgroup_fs / "cpuacct").symlink_to("cpu,cpuacct")
    r = read_cgroup(PID, COMBINED_PROC)
    assert r is not None and r.error is None and r.version == 1
    assert (r.cpu_quota_cores, r.cpu_periods, r.cpu_throttled_periods) == (0.5, 200, 150)
    assert r.cpu_throttled_s == pytest.approx(7.5) and r.cpu_usage_s == pytest.approx(30.0)


def test_v1_no_limits_and_an_older_kernel(cgroup_fs: Path) -> None:
    """v1's "no limit" is the largest page-aligned long; -1 is no quota; a kernel before 4.13 has no
    oom_kill line: that counter is not known, not 0."""
    v1_memory(cgroup_fs, limit=9223372036854771712, oom=None)
    v1_cpu(cgroup_fs, quota=-1)
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.error is None
    assert (r.memory_limit_bytes, r.cpu_quota_cores, r.oom_kills) == (None, None, None)
    assert r.memory_bytes == 700 * 2**20 and r.cpu_periods == 13


def test_v2(cgroup_fs: Path) -> None:
    unified(cgroup_fs, cgroup_fs)
    r = read_cgroup(PID, V2_PROC)
    assert r == CgroupReading(path=PATH, version=2, memory_bytes=512 * 2**20, memory_limit_bytes=2 * GIB,
                              oom_kills=1, cpu_quota_cores=1.5, cpu_periods=40, cpu_throttled_periods=30,
                              cpu_throttled_s=1.5, cpu_usage_s=2.5)


def test_v2_without_limits(cgroup_fs: Path) -> None:
    unified(cgroup_fs, cgroup_fs, memory_max="max", cpu_max="max 100000")
    r = read_cgroup(PID, V2_PROC)
    assert r is not None and r.error is None
    assert (r.memory_limit_bytes, r.cpu_quota_cores) == (None, None)
    assert r.memory_bytes == 512 * 2**20 and r.cpu_throttled_periods == 30


def test_hybrid_unified_only(cgroup_fs: Path) -> None:
    """A hybrid host whose v1 memory and cpu controllers are not mounted: the unified hierarchy, under
    unified/, is read."""
    unified(cgroup_fs, cgroup_fs / "unified")
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.error is None and r.version == 2
    assert (r.memory_limit_bytes, r.cpu_quota_cores, r.cpu_usage_s) == (2 * GIB, 1.5, 2.5)


def test_hybrid_cpu_time_from_unified_without_cpuacct(cgroup_fs: Path) -> None:
    v1_memory(cgroup_fs)
    v1_cpu(cgroup_fs)
    write(cgroup_fs / "unified" / "cgroup.controllers", "")
    write(cgroup_fs / "unified" / PATH.lstrip("/") / "cpu.stat", "usage_usec 4000000\nuser_usec 1\n")
    r = read_cgroup(PID, f"4:memory:{PATH}\n1:cpu:{PATH}\n0::{PATH}\n")
    assert r is not None and r.version == 1 and r.cpu_usage_s == 4.0 and r.cpu_quota_cores == 1.5


@pytest.mark.parametrize("text", ["0::/\n", "4:memory:/\n1:cpu:/\n0::/\n"], ids=["v2", "v1"])
def test_root_cgroup_has_no_limits(cgroup_fs: Path, text: str) -> None:
    """A process outside any container: the root cgroup imposes nothing (and its counters are the whole
    machine's: not read as the process's). No limits, no error, whether anything is mounted or not."""
    r = read_cgroup(PID, text)
    assert r is not None and r.path == "/" and r.error is None
    assert (r.memory_limit_bytes, r.cpu_quota_cores, r.memory_bytes, r.cpu_usage_s) == (None,) * 4
    unified(cgroup_fs, cgroup_fs)
    write(cgroup_fs / "memory.max", 10)  # what a root would never have, not read anyway
    r = read_cgroup(PID, text)
    assert r is not None and r.error is None and r.memory_limit_bytes is None


@pytest.mark.parametrize("garbage", ["", "\n", "lots of words", "\x00\x01", "12abc", "-", "1 2 3"])
def test_malformed_files_are_none_fields(cgroup_fs: Path, garbage: str) -> None:
    d = v1_memory(cgroup_fs)
    c = v1_cpu(cgroup_fs)
    for f in (d / "memory.limit_in_bytes", d / "memory.oom_control", c / "cpu.cfs_quota_us", c / "cpu.stat"):
        f.write_text(garbage)
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.error is None  # the usage still read
    assert (r.memory_limit_bytes, r.oom_kills, r.cpu_quota_cores, r.cpu_periods) == (None,) * 4
    assert r.memory_bytes == 700 * 2**20
    d2 = unified(cgroup_fs, cgroup_fs)
    for f in d2.iterdir():
        f.write_text(garbage)
    r = read_cgroup(PID, V2_PROC)
    assert r is not None and r.error == f"its cgroup's files under {d2} hold no figure enginetop reads"


def test_a_cpu_stat_with_lines_of_garbage_keeps_what_it_can(cgroup_fs: Path) -> None:
    c = v1_cpu(cgroup_fs)
    c.joinpath("cpu.stat").write_text("nr_periods x\nwhat\n\nnr_throttled 7\nthrottled_time 1e9\n")
    r = read_cgroup(PID, f"1:cpu:{PATH}\n")
    assert r is not None and (r.cpu_periods, r.cpu_throttled_periods, r.cpu_throttled_s) == (None, 7, None)


def test_what_cannot_be_read_is_said(cgroup_fs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no mount at all
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.path == PATH
    assert r.error == f"no cgroup filesystem with its memory or cpu controller is mounted at {cgroup_fs}"
    # mounted, but its cgroup's directory is gone (the container ended) or in another namespace
    (cgroup_fs / "memory").mkdir(parents=True)
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.error is not None
    gone = cgroup_fs / "memory" / PATH.lstrip("/")
    assert r.error.startswith(f"its cgroup's directory {gone} is not there")
    # permission: the files are there, the reader may not read them

    def denied(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    v1_memory(cgroup_fs)
    monkeypatch.setattr(sysfs_files, "read_text", denied)
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.error is not None
    assert r.error.startswith(f"cannot read {cgroup_fs / 'memory' / PATH.lstrip('/')}/memory.limit_in_bytes: "
                              "Permission denied")
    assert read_cgroup(PID, "nothing here\n") == CgroupReading(path="", error=f"no cgroup named in "
                                                                             f"/proc/{PID}/cgroup")


def test_a_process_gone_is_none() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert read_cgroup(done.pid) is None


def test_proc_cgroup_lines() -> None:
    v2, v1 = parse_proc_cgroup("12:cpu,cpuacct:/a\n1:name=systemd:/s\n3:net_cls,net_prio:/n\n"
                               "0::/b (deleted)\ngarbage\n7:memory:relative\n")
    assert v2 == "/b"
    assert v1 == {"cpu": ("/a", "cpu,cpuacct"), "cpuacct": ("/a", "cpu,cpuacct"),
                  "net_cls": ("/n", "net_cls,net_prio"), "net_prio": ("/n", "net_cls,net_prio")}


def reading(path: str = PATH, **counters: float | int | None) -> CgroupReading:
    base: dict[str, float | int | None] = dict(cpu_periods=100, cpu_throttled_periods=10, cpu_throttled_s=1.0,
                                               cpu_usage_s=50.0, oom_kills=0, cpu_quota_cores=2.0)
    return CgroupReading(path=path, version=1, **(base | counters))  # type: ignore[arg-type]


def test_use_between() -> None:
    before = reading()
    now = reading(cpu_periods=300, cpu_throttled_periods=110, cpu_throttled_s=6.0, cpu_usage_s=90.0,
                  oom_kills=2, cpu_quota_cores=1.5)
    use = use_between(before, now, 20.0)
    assert use == CgroupUse(20.0, periods=200, throttled_periods=100, throttled_share=0.5, throttled_s=5.0,
                            throttled_s_per_s=0.25, cores_used=2.0, quota_cores=1.5, oom_kills=2)


def test_use_between_missing_and_idle() -> None:
    """A counter missing in either reading is None; no period passed: no share; no time: no rates."""
    use = use_between(reading(oom_kills=None), reading(cpu_usage_s=None), 10.0)
    assert (use.oom_kills, use.cores_used, use.throttled_share) == (None, None, None)
    assert use.throttled_s_per_s == 0.0
    assert use.periods == 0 and not use.reset
    use = use_between(reading(), reading(cpu_usage_s=60.0), 0.0)
    assert (use.cores_used, use.throttled_s_per_s, use.throttled_s) == (None, None, 0.0)


@pytest.mark.parametrize("now", [reading(cpu_periods=5), reading(oom_kills=0, cpu_usage_s=1.0),
                                 reading(path=f"/libpod_parent/libpod-{'9' * 64}")],
                         ids=["periods-went-back", "usage-went-back", "new-cgroup"])
def test_use_between_void_when_counters_went_back(now: CgroupReading) -> None:
    """A restarted container is a new cgroup whose counters start again: nothing in the window compares."""
    use = use_between(reading(), now, 10.0)
    assert use == CgroupUse(10.0, quota_cores=2.0, reset=True)


def _podman_env(tmp: Path) -> dict[str, str]:
    conf = tmp / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")  # the host's ulimits may exceed a container's
    return os.environ | {"CONTAINERS_CONF": str(conf)}


def test_a_real_podman_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy loop in a Podman container with --memory 256m --cpus 0.5, on the host's root overlaid (no image
    registry needed): its cgroup says both, and within seconds the quota throttles it, and the finding says
    so. Podman comes from `make podman`: missing, this fails."""
    assert shutil.which("podman"), "podman is not installed: `make podman`"
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", "/sys")  # the real one, not the suite's empty tree
    # Podman's own storage: one of the test's own (--root) would be mounted again by the cleanup conmon runs
    # after the container ends, after the test had removed it, and left behind
    podman = ["podman"]
    env = _podman_env(tmp_path)
    run = subprocess.run([*podman, "--runtime", "runc", "run", "-d", "--rm", "--network", "none",
                          "--memory", "256m", "--cpus", "0.5", "--rootfs", "/:O",
                          "/bin/sh", "-c", "while :; do :; done"],
                         env=env, capture_output=True, text=True, timeout=120)
    cid = run.stdout.strip()
    try:
        assert run.returncode == 0, run.stderr
        pid = int(subprocess.run([*podman, "inspect", "-f", "{{.State.Pid}}", cid], env=env, check=True,
                                 capture_output=True, text=True, timeout=60).stdout)
        first, t0 = read_cgroup(pid), time.monotonic()
        assert first is not None and first.error is None, first
        assert cid in first.path
        assert (first.memory_limit_bytes, first.cpu_quota_cores) == (256 * 2**20, 0.5)
        deadline = t0 + 15
        while True:
            time.sleep(2)
            now, t = read_cgroup(pid), time.monotonic()
            assert now is not None and now.error is None, now
            use = use_between(first, now, t - t0)
            if (use.throttled_periods or 0) > 0 or t > deadline:
                break
        assert not use.reset and use.periods and use.throttled_periods, use
        assert use.throttled_s and use.throttled_s > 0 and use.quota_cores == 0.5
        # a loop that wants a whole core, held to half of one
        assert use.cores_used is not None and 0.2 < use.cores_used < 0.75, use
        found = container_findings("llama", use, now)
        assert [f.id for f in found] == ["container-cpu-throttled"], found
    finally:
        if cid:
            subprocess.run([*podman, "rm", "-f", "-t", "0", cid], env=env, capture_output=True, timeout=60)


def test_memory_is_the_working_set_without_inactive_file_pages(cgroup_fs: Path) -> None:
    """An engine that maps its model file: the file's pages the kernel can drop are not memory that brings
    it near its limit (v1's hierarchical total_inactive_file, v2's inactive_file)."""
    d = v1_memory(cgroup_fs, usage=900 * 2**20)
    write(d / "memory.stat", f"cache 600000000\ninactive_file 1\ntotal_inactive_file {500 * 2**20}\n")
    v1_cpu(cgroup_fs)
    r = read_cgroup(PID, V1_PROC)
    assert r is not None and r.memory_bytes == 400 * 2**20
    unified(cgroup_fs, cgroup_fs)
    write(cgroup_fs / PATH.lstrip("/") / "memory.stat", f"anon 1\ninactive_file {112 * 2**20}\n")
    r = read_cgroup(PID, V2_PROC)
    assert r is not None and r.memory_bytes == 400 * 2**20


def test_cruns_container_child_is_read_as_its_scope(cgroup_fs: Path) -> None:
    """crun on v2 puts the container's processes in `<scope>/container`; its limits are on the scope."""
    unified(cgroup_fs, cgroup_fs)
    (cgroup_fs / PATH.lstrip("/") / "container").mkdir()
    r = read_cgroup(PID, f"0::{PATH}/container\n")
    assert r is not None and r.path == PATH
    assert (r.memory_limit_bytes, r.cpu_quota_cores) == (2 * GIB, 1.5)
