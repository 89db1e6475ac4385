"""Host CPU / RAM / swap and per-engine process-tree memory, via psutil; the CPU packages' energy via RAPL
(tui.sources.rapl). Never raises."""

from __future__ import annotations

import ipaddress
import logging
import math
import time

import psutil

from tui.model.samples import HostSample, ProcessTreeMemory
from tui.sources.rapl import RaplReader

log = logging.getLogger(__name__)

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess
TREE_REFRESH_S = 10.0  # between two process-table walks while an engine's tree changes (workers start)
TREE_STEADY_S = 60.0  # once a walk found every engine's tree as the walk before it had
TREE_YOUNG_S = 300.0  # an engine this young may still start workers (vLLM: after its imports)


def children_map() -> dict[int, list[int]]:
    """PPID -> child PIDs, from one walk of the process table (each walk reads every /proc/PID/stat, so a
    sample makes one and shares it between engines)."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children.setdefault(ppid, []).append(proc.pid)
    return children


def _tree(pid: int, children: dict[int, list[int]] | None = None,
          known: dict[int, psutil.Process] | None = None) -> list[psutil.Process]:
    """The process and all its descendants; [] when the root has gone. `known`: Process objects kept from
    an earlier sample (making one reads /proc/PID/stat), and the ones made here are added to it."""
    children = children_map() if children is None else children
    known = {} if known is None else known
    tree = []
    for p in (pid, *sorted(_descendants(pid, children))):
        proc = known.get(p)
        if proc is None:
            try:
                proc = known[p] = psutil.Process(p)
            except _GONE:
                if p == pid:
                    return []
                continue
        tree.append(proc)
    return tree


def _age_s(pid: int) -> float:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except _GONE:
        return math.inf  # a process that went starts nothing more


def tree_pids(pid: int) -> set[int]:
    """The process and all its descendants, from one walk of the process table; empty when it has gone."""
    if not psutil.pid_exists(pid):
        return set()
    return {pid} | _descendants(pid, children_map())


def _descendants(pid: int, children: dict[int, list[int]]) -> set[int]:
    found: set[int] = set()
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found.add(child)
            todo.extend(children.get(child, ()))
    return found


def tree_memory(engine: str, pid: int, children: dict[int, list[int]] | None = None,
                known: dict[int, psutil.Process] | None = None) -> ProcessTreeMemory | None:
    """RSS summed over a process tree (shared pages count once per process) or None when the root has gone.

    vLLM / SGLang keep their model weights and KV cache in worker children, so the root alone says little.
    """
    rss = 0
    count = 0
    pids: list[int] = []
    for proc in _tree(pid, children, known):
        try:
            own = proc.memory_info().rss  # one read of /proc/PID/statm
        except _GONE:  # exited since the tree was listed
            if known is not None:
                known.pop(proc.pid, None)
            continue
        if own == 0:  # a zombie (dead, awaiting its parent): Linux shows it no memory, and it runs nothing
            continue
        rss += own
        count += 1
        pids.append(proc.pid)
    if count == 0:
        return None
    return ProcessTreeMemory(engine=engine, pid=pid, rss_bytes=rss, processes=count, pids=tuple(pids))


def _busy_and_total() -> tuple[float, float] | None:
    """CPU seconds of all cores since boot: (busy, total). Idle and I/O wait are not busy."""
    try:
        t = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    total = sum(t)
    return total - t.idle - getattr(t, "iowait", 0.0), total


class CpuMeter:
    """Whole-host CPU busy % since this meter's previous reading.

    Every reader owns its meter: psutil.cpu_percent(interval=None) keeps one baseline per process, so two
    readers of it (the host panel and an A/B block, say) would each measure the other's interval.
    """

    def __init__(self) -> None:
        self._last = _busy_and_total()

    def percent(self) -> float | None:
        """Busy % of all cores since the last call (or since the meter was made); None if unknown."""
        now = _busy_and_total()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return max(0.0, min(100.0, 100.0 * (now[0] - last[0]) / (now[1] - last[1])))


class HostSampler:
    """CPU % since the previous sample (its own CpuMeter), memory, swap, engine trees and the CPU packages'
    energy counter (RAPL; `rapl` injectable, by default read under ENGINETOP_SYSFS_ROOT or /sys)."""

    def __init__(self, rapl: RaplReader | None = None) -> None:
        self._rapl = rapl if rapl is not None else RaplReader()
        self._children_map: dict[int, list[int]] = {}
        self._children_at: float | None = None
        self._trees: dict[int, frozenset[int]] = {}  # each engine root's processes at the last walk
        self._steady = False  # the last walk found the trees the walk before it had
        self._known: dict[int, psutil.Process] = {}  # the engines' processes, until the next walk
        self._cpu = CpuMeter()

    def _children(self, now: float, roots: set[int]) -> dict[int, list[int]]:
        """The process-table walk is the costly part of a sample (a /proc/PID/stat read per process: ~6 ms
        for 70 processes here, tens of ms on a busy server), and RSS is read from every known process each
        sample anyway. So the table is walked again at once for a new engine or when a process of an
        engine's tree has gone (a worker restarting, a router swapping models), every TREE_REFRESH_S while
        the trees change or an engine is young (workers appear during start-up, after a quiet while), and
        every TREE_STEADY_S once neither holds."""
        gone = any(p not in self._known for tree in self._trees.values() for p in tree)
        wait = TREE_STEADY_S if self._steady else TREE_REFRESH_S
        if (self._children_at is None or gone or not roots <= self._trees.keys()
                or now - self._children_at >= wait):
            walked = children_map()
            alive = {pid for kids in walked.values() for pid in kids}  # every process is someone's child
            trees = {root: frozenset(_descendants(root, walked) | ({root} & alive)) for root in roots}
            self._steady = trees == self._trees and all(_age_s(root) > TREE_YOUNG_S for root in roots)
            self._children_map, self._children_at, self._trees = walked, now, trees
            self._known.clear()  # a PID that went may come back as another process
        return self._children_map

    def sample(self, engine_pids: dict[str, int] | None = None) -> HostSample:
        """`engine_pids` maps an engine name to its root PID; engines whose process has gone are left out."""
        t = time.monotonic()
        cpu_pct = cpu_count = ram_used = ram_total = swap_used = swap_total = None
        try:
            cpu_pct = self._cpu.percent()
            cpu_count = psutil.cpu_count(logical=True)
        except Exception as exc:
            log.debug("CPU figures unavailable: %s", exc)
        try:
            vm = psutil.virtual_memory()
            # total - available counts what programs hold, not reclaimable page cache
            ram_used, ram_total = vm.total - vm.available, vm.total
        except Exception as exc:
            log.debug("RAM figures unavailable: %s", exc)
        try:
            sw = psutil.swap_memory()
            swap_used, swap_total = sw.used, sw.total
        except Exception as exc:
            log.debug("swap figures unavailable: %s", exc)
        engines = []
        children = self._children(t, set(engine_pids.values())) if engine_pids else {}
        for name, pid in (engine_pids or {}).items():
            try:
                tree = tree_memory(name, pid, children, self._known)
            except Exception as exc:
                log.debug("memory of engine %s (pid %s) unavailable: %s", name, pid, exc)
                continue
            if tree is not None:
                engines.append(tree)
        try:
            # the sample's time is the counter's: a process walk before it takes milliseconds, and the
            # package's watts are joules over the time between two reads (seen: 9.4 W of a 10 W counter else)
            t = time.monotonic()
            energy = self._rapl.read()
            cpu_j, domains, energy_error = energy.joules, energy.domains, energy.error
        except Exception as exc:  # never let a reader surprise take the host panel down
            log.debug("CPU energy unavailable: %s", exc)
            cpu_j, domains, energy_error = None, (), f"CPU energy (RAPL) failed: {exc}"
        return HostSample(
            t=t,
            cpu_pct=cpu_pct,
            cpu_count=cpu_count,
            ram_used_bytes=ram_used,
            ram_total_bytes=ram_total,
            swap_used_bytes=swap_used,
            swap_total_bytes=swap_total,
            engines=tuple(engines),
            cpu_energy_j=cpu_j,
            cpu_energy_domains=domains,
            cpu_energy_error=energy_error,
        )


_WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _local_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    found = set()
    for addrs in psutil.net_if_addrs().values():
        for snic in addrs:
            addr = _address(snic.address)
            if addr is not None:
                found.add(addr)
    return found


def _host_matches(listen_ip: str, host: str | None) -> bool:
    if host is None:
        return True
    bound = _address(listen_ip)
    if bound is None:
        return False
    if host.lower() in _LOOPBACK_NAMES:
        return bound.is_loopback or bound in _WILDCARDS
    wanted = _address(host)
    if wanted is None:
        return False  # names are not resolved: a DNS lookup could block, and a name is rarely this machine
    if bound in _WILDCARDS:  # listening everywhere: a match only if `host` is one of this machine's addresses
        return wanted.is_loopback or wanted in _local_addresses()
    return wanted == bound


def pids_listening(addresses: list[tuple[str | None, int]]) -> dict[tuple[str | None, int], int]:
    """PID of the local process LISTENing on each (host, port), from one walk of every socket.

    `host` is an IP literal, "localhost" or None (any); wildcard listeners (0.0.0.0, ::) match any host of
    this machine. An address is left out when nothing listens there, the socket belongs to a process this
    user may not inspect, or the OS refuses the listing.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError) as exc:
        log.debug("cannot list TCP sockets: %s", exc)
        return {}
    found: dict[tuple[str | None, int], int] = {}
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.pid is None:
            continue
        for host, port in addresses:
            if (host, port) not in found and conn.laddr.port == port and _host_matches(conn.laddr.ip, host):
                found[(host, port)] = conn.pid
    return found
