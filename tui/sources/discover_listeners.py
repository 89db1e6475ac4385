"""The listening sockets discovery asks (tui.sources.discover), read from the OS, and the ones it does not
ask, each with the reason.

* Where to ask: a socket bound to loopback or a wildcard is asked on loopback; one bound only to another
  address of this machine (an interface's own address, as `--host 192.168.1.5` binds) is asked there, since
  that is still this machine; one bound to an address this machine does not have (IP_FREEBIND, an address
  since removed) or to an IPv6 link-local address (a URL cannot name it without its interface) is not asked,
  and said so.
* What is never an engine: enginetop itself (this process, and any other enginetop: `enginetop proxy`, a
  dashboard's --proxy-listen, `enginetop web`) relays or serves engines, so its listener would be found as a
  second copy of the engine behind it.
* What is part of an engine: a listener whose process descends from another listening engine process (a
  llama-server router's child servers, llama-swap's upstreams, started through a shell or not) is listed under
  that parent, never as an engine of its own: the parent answers for its models, and a child is started and
  stopped by it at any time.

Blocking: one walk of every socket and a read of each listener's command line (psutil).
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from tui.engines.knowledge import program_name
from tui.engines.known import serving_program
from tui.model.containers import Container
from tui.sources.containers import Catalog
from tui.sources.discover_found import FoundChild
from tui.sources.port_holder import PUBLISHERS, held_by, is_enginetop

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)
EITHER = ("127.0.0.1", "[::1]")
UNREAD = "a process whose command line cannot be read"


@dataclass(frozen=True, slots=True)
class Candidate:
    hosts: tuple[str, ...]  # as a URL writes them (127.0.0.1, [::1], 192.0.2.2), asked until one answers
    port: int
    pid: int | None
    program: str | None  # an engine's program when its command line says so
    process: str | None  # the listening process's program, whatever it is
    uid: int | None = None  # the user its process runs as (effective uid); None: not readable
    children: tuple[FoundChild, ...] = ()
    container: Container | None = None  # the container the engine's process runs in

    def who(self) -> str:
        """"llama-server pid 42", or what could be told of an unreadable process."""
        name = self.program or self.process
        if self.pid is None:
            return UNREAD
        return f"{name} pid {self.pid}" if name else f"pid {self.pid}"


@dataclass
class Listeners:
    candidates: list[Candidate]
    unreadable: str | None = None  # what could not be looked at, and why
    not_asked: list[str] = field(default_factory=list)  # a line each: a listener not asked, and why


def local_addresses() -> frozenset[str]:
    """This machine's own interface addresses (IPv6 without its scope), as ipaddress writes them."""
    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return frozenset()
    out: set[str] = set()
    for entries in interfaces.values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    out.add(str(ipaddress.ip_address(entry.address.split("%")[0])))
                except ValueError:
                    continue
    return frozenset(out)


def _address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def url_hosts(ip: str, local: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The addresses that reach a socket listening on `ip`, in the order to ask them, as a URL writes them;
    none when it is not this machine's. IPv6's wildcard `::` takes IPv4 too unless the socket is IPv6-only:
    127.0.0.1 first. An address of `local` (this machine's interfaces) is asked on itself."""
    addr = _address(ip)
    if addr is None:
        return ()
    if addr.is_unspecified:
        return ("127.0.0.1",) if addr.version == 4 else EITHER
    if addr.is_loopback or (str(addr) in local and not addr.is_link_local):
        return (str(addr),) if addr.version == 4 else (f"[{addr}]",)
    return ()


def _why_not(ip: str) -> str:
    addr = _address(ip)
    if addr is not None and addr.is_link_local:
        return "an IPv6 link-local address, which a URL cannot name without its interface"
    return "not an address of this machine"


def _rank(ip: str, pid: int | None, local: frozenset[str]) -> tuple[int, bool]:
    """Which of a port's sockets to ask: loopback or a wildcard first, then an own address, then one that
    cannot be asked; a socket whose owner can be read before one whose owner cannot."""
    addr = _address(ip)
    if not url_hosts(ip, local):
        where = 2
    elif addr is not None and (addr.is_loopback or addr.is_unspecified):
        where = 0
    else:
        where = 1
    return where, pid is None


def served_model(argv: Sequence[str]) -> str | None:
    """The model a child server's command line names: its --alias (a router names each child so), else
    --served-model-name, else its model file's name."""
    pairs: dict[str, str] = {}
    for arg, value in itertools.pairwise(argv):
        if arg.startswith("-") and "=" not in arg:
            pairs.setdefault(arg, value)
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name.startswith("--"):
            pairs.setdefault(name, value)
    for names in (("--alias", "-a"), ("--served-model-name",), ("-m", "--model")):
        given = next((pairs[n] for n in names if n in pairs), None)
        if given:
            # a URL's query and fragment may sign it (X-Amz-Signature=...): never part of a name
            model = given.split(",")[0].partition("?")[0].partition("#")[0].rstrip("/").rsplit("/", 1)[-1]
            return model[:-5] if model.lower().endswith(".gguf") else model
    return None


@dataclass(slots=True)
class _Process:
    argv: list[str] | None
    uid: int | None


def _read(pid: int) -> _Process:
    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
    except _GONE:
        return _Process(None, None)
    try:
        uid: int | None = proc.uids().effective
    except _GONE:
        uid = None
    return _Process(argv, uid)


def _ancestors(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).parents()]
    except _GONE:
        return []


def listeners(ports: tuple[int, ...], local: frozenset[str] | None = None,
              catalog: Catalog | None = None) -> Listeners:
    """Every candidate: the engines' listening sockets (a container runtime's publisher followed to the
    engine in its container: tui.sources.port_holder), and the usual `ports` (asked even when the socket
    list cannot be read); the children of engines found among them attached to their parent; and a line for
    each engine's (or usual port's) socket that is not asked. `catalog`: the runtimes' containers."""
    local = local_addresses() if local is None else local
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError) as exc:
        conns = []
        unreadable: str | None = (f"this machine's sockets cannot be listed here ({exc}): only the usual "
                                  "ports were asked")
    else:
        unreadable = None
    binds: dict[int, list[tuple[str, int | None]]] = {}
    hidden = 0
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            binds.setdefault(conn.laddr.port, []).append((conn.laddr.ip, conn.pid))
            hidden += conn.pid is None

    mine = os.getpid()
    procs: dict[int, _Process] = {}
    skip: set[int] = set()  # enginetop's own ports: never an engine, never guessed at as a usual port
    found: dict[int, Candidate] = {}
    unasked: dict[int, tuple[str, Candidate]] = {}  # port -> (the address it listens on, what it is)
    for port, bound in sorted(binds.items()):
        ip, pid = min(bound, key=lambda b: _rank(b[0], b[1], local))
        hosts = url_hosts(ip, local)
        if pid is None:
            if port in ports:  # asked where it listens (its owner is unknown)
                candidate = Candidate(hosts, port, None, None, None)
                if hosts:
                    found[port] = candidate
                else:
                    unasked[port] = (ip, candidate)
            continue
        if pid == mine:
            skip.add(port)
            continue
        if pid not in procs:
            procs[pid] = _read(pid)
        info = procs[pid]
        if info.argv and is_enginetop(info.argv):
            skip.add(port)
            continue
        program = serving_program(info.argv) if info.argv else None
        container = None
        if program is None and info.argv and program_name(info.argv) in PUBLISHERS:
            held = held_by(pid, port, catalog)  # conmon, docker-proxy, ...: the engine is in a container
            if held.engine_pid is not None:
                pid, container = held.engine_pid, held.container
                info = procs.setdefault(pid, _read(pid))
                program = serving_program(info.argv) if info.argv else None
        if program is None and port not in ports:
            continue
        candidate = Candidate(hosts, port, pid, program, program_name(info.argv) if info.argv else None,
                              info.uid, container=container)
        if hosts:
            found[port] = candidate
        else:
            unasked[port] = (ip, candidate)

    found, unasked, children = _under_parents(found, unasked, procs)
    for port in ports:
        if port not in skip and port not in found and port not in unasked and port not in children:
            found[port] = Candidate(EITHER, port, None, None, None)
    if hidden and unreadable is None and os.geteuid() != 0:
        unreadable = (f"{hidden} listening socket(s) belong to other users' processes, whose command lines "
                      "cannot be read without root: an engine among them is found only on a usual port")
    not_asked = []
    for port, (ip, c) in sorted(unasked.items()):
        runs = f", with its child processes on {', '.join(f':{k.port}' for k in c.children)}" if c.children \
            else ""
        not_asked.append(f"not asked: :{port} ({c.who()}{runs}) listens on {ip} only, {_why_not(ip)}")
    return Listeners(sorted(found.values(), key=lambda c: c.port), unreadable, not_asked)


def _under_parents(found: dict[int, Candidate], unasked: dict[int, tuple[str, Candidate]],
                   procs: dict[int, _Process]
                   ) -> tuple[dict[int, Candidate], dict[int, tuple[str, Candidate]], set[int]]:
    """Each listener whose process descends from another listener's process, moved under that parent (the
    parent's lowest port, asked or not); and the ports moved."""
    # the engines by their command line: a process that only happens to listen on a usual port (a web app
    # that runs a llama-server of its own) is no router, and must not hide what it started
    parents: dict[int, int] = {}  # pid -> the port it is listed under
    for port in sorted({*found, *unasked}):
        c = found[port] if port in found else unasked[port][1]
        if c.pid is not None and c.program is not None:
            parents.setdefault(c.pid, port)
    children: dict[int, list[FoundChild]] = {}
    for port, c in [*found.items(), *((p, c) for p, (_ip, c) in unasked.items())]:
        if c.pid is None:
            continue
        # the outermost listening ancestor: llama-swap's, not a router's it runs in turn
        above = [parents[a] for a in _ancestors(c.pid) if a in parents and a != c.pid]
        if not above:
            continue
        parent = above[-1]
        argv = procs[c.pid].argv or []
        children.setdefault(parent, []).append(
            FoundChild(c.pid, port, c.program or c.process or "a process", served_model(argv)))
    moved = {child.port for kids in children.values() for child in kids}

    def adopt(c: Candidate) -> Candidate:
        kids = tuple(sorted(children.get(c.port, ()), key=lambda k: k.port))
        return Candidate(c.hosts, c.port, c.pid, c.program, c.process, c.uid, kids) if kids else c

    return ({p: adopt(c) for p, c in found.items() if p not in moved},
            {p: (ip, adopt(c)) for p, (ip, c) in unasked.items() if p not in moved}, moved)
