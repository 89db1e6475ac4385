"""GPU processes in containers. NVML lists a process by its host PID: one a watched engine's tree holds is
that engine's; one that none holds is "not watched", and where it runs in a container the panel says which
(runtime and short id, from its /proc/PID/cgroup: tui.sources.container_of).

A real Podman container first (`make podman` installs it: a missing podman fails this test, never skips it),
then the cgroup path of each runtime from text and from a /proc-shaped tree.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml, h200

import tui.sources.gpu as gpu_source
from tui.sources.container_of import container_of, container_of_cgroup, nspid
from tui.sources.gpu import GpuSampler
from widgets.gpu_panel import render_gpus

GiB = 1 << 30
ID_A = "3d8f423a11bc" + "0123456789abcdef" * 3 + "0123"  # 64 hex
ID_B = "c1aa391cb4a7" + "fedcba9876543210" * 3 + "fedc"
assert len(ID_A) == len(ID_B) == 64


def plain(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


# ---- a real Podman container ---------------------------------------------------------------------------


@pytest.fixture
def podman(podman_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(podman's argv, its environment): runc, and a containers.conf without default ulimits (a container here
    may not raise them). Podman's own storage: a private --root left its overlay mounted under the test's
    temporary folder when podman's cleanup ran after the folder was gone."""
    found = shutil.which("podman")
    assert found is not None, "podman is not installed: `make podman` installs it (this test never skips)"
    return [found, "--runtime", "runc"], podman_env


def test_a_gpu_process_in_a_real_podman_container(podman: tuple[list[str], dict[str, str]]) -> None:
    podman_argv, env = podman
    started = subprocess.run([*podman_argv, "run", "-d", "--rm", "--network", "none", "--rootfs", "/:O",
                              "/bin/sleep", "60"], env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip().splitlines()[-1]
    try:
        assert len(cid) == 64 and int(cid, 16) >= 0, cid
        inspected = subprocess.run([*podman_argv, "inspect", "-f", "{{.State.Pid}}", cid], env=env,
                                   capture_output=True, text=True, timeout=60, check=True)
        pid = int(inspected.stdout.strip())
        assert pid > 0 and pid != os.getpid()

        # what /proc says of it: podman's cgroup path, and PID 1 in its own namespace
        assert container_of(pid) == ("podman", cid)
        assert nspid(pid) == (pid, 1)

        sampler = GpuSampler(FakeNvml([h200(compute_procs=[(pid, GiB)])]))
        # (a) a watched engine's tree holds the host PID: the engine's, however it was started
        (owned,) = sampler.sample({"llama": {pid}}).gpus[0].processes
        assert (owned.pid, owned.used_bytes, owned.engine, owned.container) == (pid, GiB, "llama", None)
        # (b) no engine holds it: "not watched", in podman's container with that id
        report = sampler.sample()
        (other,) = report.gpus[0].processes
        assert (other.pid, other.used_bytes, other.engine) == (pid, GiB, None)
        assert other.container == f"podman {cid[:12]}"
        assert f"pid {pid} (in podman {cid[:12]}, not watched) 1.0 GiB" in plain(render_gpus(report))
    finally:
        subprocess.run([*podman_argv, "rm", "-f", "-t", "0", cid], env=env, capture_output=True, timeout=120)
    gone = subprocess.run([*podman_argv, "ps", "-a", "-q", "--no-trunc"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert cid not in gone.stdout


# ---- the parser: each runtime's cgroup path --------------------------------------------------------------

V1_PODMAN_CGROUPFS = "".join(  # as this machine's podman writes it (cgroupfs manager, cgroup v1 and v2)
    f"{n}:{c}:/libpod_parent/libpod-{ID_A}\n"
    for n, c in ((9, "name=systemd"), (8, "pids"), (4, "memory"), (1, "cpu"), (0, "")))


@pytest.mark.parametrize(("text", "expected"), [
    # podman: systemd (rootful, rootless with its `container` sub-cgroup), cgroupfs (v1, every controller)
    (f"0::/machine.slice/libpod-{ID_A}.scope\n", ("podman", ID_A)),
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_A}.scope/container\n",
     ("podman", ID_A)),
    (V1_PODMAN_CGROUPFS, ("podman", ID_A)),
    (f"0::/machine.slice/libpod-conmon-{ID_A}.scope\n", None),  # podman's conmon: on the host
    # docker: systemd, cgroupfs (v1 with the other controllers first at the root)
    (f"0::/system.slice/docker-{ID_A}.scope\n", ("docker", ID_A)),
    (f"13:rdma:/\n12:memory:/docker/{ID_A}\n11:pids:/docker/{ID_A}\n1:name=systemd:/docker/{ID_A}\n",
     ("docker", ID_A)),
    # containerd and cri-o under Kubernetes' systemd driver
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5e1f2a3b_4c5d_6e7f_8091_a2b3c4d5e6f7"
     f".slice/cri-containerd-{ID_A}.scope\n", ("containerd", ID_A)),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice/crio-{ID_A}.scope\n",
     ("cri-o", ID_A)),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podabc.slice/crio-conmon-{ID_A}.scope\n",
     None),
    # Kubernetes' cgroupfs driver: the path names no runtime
    (f"0::/kubepods/burstable/pod5e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7/{ID_A}\n", ("kubernetes", ID_A)),
    (f"11:memory:/kubepods/besteffort/podabc/{ID_A}\n", ("kubernetes", ID_A)),
    # a container in a container: the innermost is the process's own
    (f"0::/docker/{ID_A}/docker/{ID_B}\n", ("docker", ID_B)),
    (f"0::/system.slice/docker-{ID_A}.scope/libpod_parent/libpod-{ID_B}\n", ("podman", ID_B)),
    # on the host
    ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
    ("0::/\n", None),
    ("", None),
    ("4:memory:/process_api/5ae3abaaef44dad79ce255b53aa90fe0\n0::/\n", None),
    (f"0::/system.slice/{ID_A}\n", None),  # 64 hex under no runtime's folder: not said to be a container
    (f"0::/system.slice/docker-{ID_A[:40]}.scope\n", None),  # not a whole id
])
def test_container_of_cgroup(text: str, expected: tuple[str, str] | None) -> None:
    assert container_of_cgroup(text) == expected


def _proc(tmp_path: Path, pid: int, cgroup: str | None = None, status: str | None = None) -> None:
    d = tmp_path / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup)
    if status is not None:
        (d / "status").write_text(status)


def test_container_of_and_nspid_read_a_proc_tree(tmp_path: Path) -> None:
    root = str(tmp_path)
    _proc(tmp_path, 31117, f"0::/machine.slice/libpod-{ID_A}.scope\n",
          "Name:\tsleep\nTgid:\t31117\nNgid:\t0\nPid:\t31117\nPPid:\t31105\nNSpid:\t31117\t1\nNSpgid:\t31117\t1\n")
    _proc(tmp_path, 5000, "0::/user.slice/session-2.scope\n", "Name:\tbash\nPid:\t5000\nNSpid:\t5000\n")
    _proc(tmp_path, 6000, f"0::/docker/{ID_A}/docker/{ID_B}\n", "Pid:\t6000\nNSpid:\t6000\t300\t1\n")
    _proc(tmp_path, 7000, status="Name:\told kernel\nPid:\t7000\n")  # no cgroup file, no NSpid line
    assert container_of(31117, root) == ("podman", ID_A) and nspid(31117, root) == (31117, 1)
    assert container_of(5000, root) is None and nspid(5000, root) == (5000,)
    assert container_of(6000, root) == ("docker", ID_B) and nspid(6000, root) == (6000, 300, 1)
    assert container_of(7000, root) is None and nspid(7000, root) == ()
    assert container_of(9999, root) is None and nspid(9999, root) == ()  # gone


def test_the_sampler_names_containers_of_unwatched_processes_only(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's process is the engine's (its container is not looked up); an unwatched one in a container
    is said with the container; one on the host is "not watched"; each PID's cgroup is read once per sample
    though it is listed twice on a GPU and on two GPUs."""
    _proc(tmp_path, 100, f"0::/machine.slice/libpod-{ID_A}.scope\n")  # the engine, in podman
    _proc(tmp_path, 200, f"0::/system.slice/docker-{ID_B}.scope\n")  # another program, in docker
    _proc(tmp_path, 300, "0::/user.slice/session-2.scope\n")  # a program on the host
    reads: list[int] = []
    real = gpu_source.container_of

    def counted(pid: int, proc_root: str = "/proc") -> tuple[str, str] | None:
        reads.append(pid)
        return real(pid, proc_root)

    monkeypatch.setattr(gpu_source, "container_of", counted)
    procs = [(100, 20 * GiB), (200, 2 * GiB), (300, None)]
    nvml = FakeNvml([h200(compute_procs=procs, graphics_procs=[(200, None)]), h200(compute_procs=procs)])
    sampler = GpuSampler(nvml, proc_root=str(tmp_path))
    for round_ in (1, 2):
        report = sampler.sample({"vllm": {100}})
        for g in report.gpus:
            assert [(p.pid, p.engine, p.container) for p in g.processes] == [
                (100, "vllm", None), (200, None, f"docker {ID_B[:12]}"), (300, None, None)]
        assert sorted(reads) == sorted([200, 300] * round_)  # once per PID per sample, never the engine's
    text = plain(render_gpus(report))
    assert "pid 100 (vllm) 20.0 GiB" in text
    assert f"pid 200 (in docker {ID_B[:12]}, not watched) 2.0 GiB" in text
    assert "pid 300 (not watched) n/a" in text


def test_a_pid_reused_between_samples_is_read_again(tmp_path: Path) -> None:
    """The container is kept for one sample only: a PID that is another process at the next sample (ended,
    its number reused) is not said to be in the first one's container."""
    _proc(tmp_path, 200, f"0::/system.slice/docker-{ID_B}.scope\n")
    sampler = GpuSampler(FakeNvml([h200(compute_procs=[(200, GiB)])]), proc_root=str(tmp_path))
    assert sampler.sample().gpus[0].processes[0].container == f"docker {ID_B[:12]}"
    (tmp_path / "200" / "cgroup").write_text("0::/user.slice/session-3.scope\n")
    assert sampler.sample().gpus[0].processes[0].container is None
