"""This machine's processes as enginetop needs them: process trees (an engine and its workers) with their
memory, and which process listens on an address. Blocking (psutil reads /proc): called from threads."""

from __future__ import annotations

import ipaddress
import logging
import math
import time

import psutil

from tui.model.samples import ProcessTreeMemory

log = logging.getLogger(__name__)

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess


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
    for p in (pid, *sorted(descendants(pid, children))):
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


def age_s(pid: int) -> float:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except _GONE:
        return math.inf  # a process that went starts nothing more


def tree_pids(pid: int) -> set[int]:
    """The process and all its descendants, from one walk of the process table; empty when it has gone."""
    if not psutil.pid_exists(pid):
        return set()
    return {pid} | descendants(pid, children_map())


def descendants(pid: int, children: dict[int, list[int]]) -> set[int]:
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
