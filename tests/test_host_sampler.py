"""HostSampler, CpuMeter and pids_listening against real processes, real CPU time and real sockets."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import psutil
import pytest
from waiting import until

from tui.sources import host
from tui.sources.host import CpuMeter, HostSampler
from tui.sources.processes import children_map, pids_listening, tree_memory

MiB = 1 << 20
LEAF_MIB = 64

# Each node starts the next one down and prints the chain of PIDs below it; the leaf touches LEAF_MIB MiB.
NODE = r"""
import os, subprocess, sys, time
depth = int(sys.argv[1])
if depth > 0:
    kid = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]],
                           stdout=subprocess.PIPE, text=True)
    below = kid.stdout.readline().strip()
    print(os.getpid(), below, flush=True)
else:
    data = b"\x01" * (int(os.environ["LEAF_MIB"]) << 20)  # bytes repetition writes every page
    print(os.getpid(), flush=True)
time.sleep(600)
"""

LISTENER = r"""
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(600)
"""


@dataclass
class Chain:
    proc: subprocess.Popen[str]
    root: int
    middle: int
    leaf: int


def wait_until(condition, what: str, limit: float = 30.0) -> None:
    until(condition, what, limit)


def kill_session(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def chain() -> Iterator[Chain]:
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE, "2", NODE],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "LEAF_MIB": str(LEAF_MIB)},
    )
    try:
        assert proc.stdout is not None
        root, middle, leaf = (int(p) for p in proc.stdout.readline().split())
        yield Chain(proc, root, middle, leaf)
    finally:
        kill_session(proc)


def by_engine(sample) -> dict:
    return {e.engine: e for e in sample.engines}


def test_tree_rss_and_process_count(chain: Chain) -> None:
    assert chain.root == chain.proc.pid
    sampler = HostSampler()
    engines = by_engine(sampler.sample({"whole": chain.root, "middle": chain.middle, "leaf": chain.leaf}))
    whole, middle, leaf = engines["whole"], engines["middle"], engines["leaf"]
    assert (whole.pid, whole.processes) == (chain.root, 3)
    assert (middle.processes, leaf.processes) == (2, 1)
    assert leaf.rss_bytes >= LEAF_MIB * MiB
    # every Python interpreter above the leaf holds at least a few MiB of its own
    assert middle.rss_bytes >= leaf.rss_bytes + 4 * MiB
    assert whole.rss_bytes >= LEAF_MIB * MiB + 2 * 4 * MiB
    assert whole.rss_bytes > middle.rss_bytes


def tree_pids(pid: int) -> set[int]:
    tree = tree_memory("e", pid, children_map())
    return set(tree.pids) if tree is not None else set()


def test_tree_pids(chain: Chain) -> None:
    # the GPU panel maps GPU processes to engines with these
    assert tree_pids(chain.root) == {chain.root, chain.middle, chain.leaf}
    assert tree_pids(chain.middle) == {chain.middle, chain.leaf}
    assert tree_pids(chain.leaf) == {chain.leaf}


def test_vanished_processes(chain: Chain) -> None:
    sampler = HostSampler()
    os.kill(chain.leaf, signal.SIGKILL)  # the middle never reaps it: it stays a zombie in the tree
    wait_until(lambda: psutil.Process(chain.leaf).status() == psutil.STATUS_ZOMBIE, "the leaf to be a zombie")
    engines = by_engine(sampler.sample({"whole": chain.root, "leaf": chain.leaf}))
    assert engines["whole"].processes == 2
    assert engines["whole"].rss_bytes < LEAF_MIB * MiB
    assert "leaf" not in engines  # a zombie has no memory to report
    kill_session(chain.proc)
    wait_until(lambda: not psutil.pid_exists(chain.middle), "the middle process to go")
    assert sampler.sample({"whole": chain.root}).engines == ()
    assert tree_pids(chain.root) == set()


def test_the_process_table_is_walked_again_for_a_new_engine_a_gone_process_or_its_interval(
        chain: Chain, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    # the sampler's own clock only (the waits below keep the real one)
    monkeypatch.setattr(host, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    walks = []
    walk = host.children_map
    monkeypatch.setattr(host, "children_map", lambda: walks.append(clock[0]) or walk())
    young = HostSampler()  # the chain started just now: an engine that young may still start workers
    for _ in range(3):
        clock[0] += host.TREE_REFRESH_S
        young.sample({"whole": chain.root})
    assert len(walks) == 3  # the same tree each time, walked every TREE_REFRESH_S all the same
    walks.clear()
    monkeypatch.setattr(host, "TREE_YOUNG_S", 0.0)  # from here the chain counts as old
    sampler = HostSampler()

    def sample_after(seconds: float, **roots: int) -> dict:
        clock[0] += seconds
        return by_engine(sampler.sample(roots))

    assert sample_after(0, whole=chain.root)["whole"].processes == 3 and len(walks) == 1
    sample_after(2, whole=chain.root)
    assert len(walks) == 1  # RSS is read again, the table is not
    sample_after(host.TREE_REFRESH_S, whole=chain.root)
    assert len(walks) == 2  # the trees were new at the first walk: the next one came after TREE_REFRESH_S
    sample_after(host.TREE_REFRESH_S, whole=chain.root)
    assert len(walks) == 2  # the second walk found the same tree: steady, walked every TREE_STEADY_S
    sample_after(host.TREE_STEADY_S, whole=chain.root)
    assert len(walks) == 3
    sample_after(2, whole=chain.root, middle=chain.middle)
    assert len(walks) == 4  # a new engine: walked at once
    os.kill(chain.leaf, signal.SIGKILL)  # a zombie: still in the table, and in no need of a walk
    wait_until(lambda: psutil.Process(chain.leaf).status() == psutil.STATUS_ZOMBIE, "the leaf to be a zombie")
    assert sample_after(2, whole=chain.root, middle=chain.middle)["whole"].processes == 2
    assert len(walks) == 4
    kill_session(chain.proc)
    wait_until(lambda: not psutil.pid_exists(chain.middle), "the middle process to go")
    assert sample_after(2, whole=chain.root, middle=chain.middle) == {}
    assert len(walks) == 4
    sample_after(2, whole=chain.root, middle=chain.middle)
    assert len(walks) == 5  # processes of the trees went: the next sample walks (a worker may restart)
    sample_after(2, whole=chain.root, middle=chain.middle)
    assert len(walks) == 5  # and the trees, now empty, do not make every sample walk


def test_host_figures() -> None:
    sampler = HostSampler()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # some CPU work since the priming call
        pass
    s = sampler.sample()
    assert s.cpu_count == os.cpu_count()
    assert s.cpu_pct is not None and 0.0 < s.cpu_pct <= 100.0
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    assert s.ram_total_bytes == int(fields["MemTotal"].split()[0]) * 1024
    assert s.ram_used_bytes is not None and 0 < s.ram_used_bytes <= s.ram_total_bytes
    assert s.swap_total_bytes == int(fields["SwapTotal"].split()[0]) * 1024
    assert s.swap_used_bytes is not None and 0 <= s.swap_used_bytes <= s.swap_total_bytes
    assert s.engines == ()


def burn_cpu(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_each_cpu_reader_has_its_own_interval() -> None:
    """The host panel and an A/B block read the CPU at once: neither may shorten the other's interval."""
    panel = HostSampler()
    burn_cpu(0.5)  # one core busy for 0.5 s: at least 1/cpu_count of the host
    block = CpuMeter()  # a second reader starts its interval now...
    psutil.cpu_percent(interval=None)  # ...and a third uses psutil's one shared baseline
    busy = panel.sample().cpu_pct  # still measured over the panel's own 0.5 s, burn included
    assert busy is not None and busy >= 0.8 * 100.0 / psutil.cpu_count(), busy
    burn_cpu(0.2)
    assert (block.percent() or 0.0) >= 0.8 * 100.0 / psutil.cpu_count()


def pid_listening_on(port: int, host: str | None = None) -> int | None:
    return pids_listening([(host, port)]).get((host, port))


def start_listener(address: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", LISTENER, address], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_pid_listening_on_loopback() -> None:
    proc, port = start_listener("127.0.0.1")
    try:
        assert pid_listening_on(port) == proc.pid
        assert pid_listening_on(port, "127.0.0.1") == proc.pid
        assert pid_listening_on(port, "localhost") == proc.pid
        assert pid_listening_on(port, "203.0.113.7") is None  # another machine's address
        assert pid_listening_on(port, "engine.example.invalid") is None  # names are not resolved
    finally:
        kill_session(proc)
    assert pid_listening_on(port) is None


def test_pid_listening_on_wildcard() -> None:
    proc, port = start_listener("0.0.0.0")
    try:
        assert pid_listening_on(port, "127.0.0.1") == proc.pid
        assert pid_listening_on(port, "localhost") == proc.pid
        assert pid_listening_on(port, "203.0.113.7") is None  # not this machine, though the port matches
    finally:
        kill_session(proc)


def test_pid_listening_on_ignores_connected_sockets() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            client_port = client.getsockname()[1]
            assert pid_listening_on(port) == os.getpid()
            assert pid_listening_on(client_port) is None  # ESTABLISHED, not LISTEN
