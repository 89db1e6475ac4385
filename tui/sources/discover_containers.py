"""Engines in containers that no listener of this machine publishes, for discovery (tui.sources.discover):
Docker without its userland proxy publishes a port through the firewall alone, and a container may publish
nothing at all. Both are found from the runtimes' API (tui.sources.containers) and, where no socket answers,
from the host's /proc (every process running an engine by its command line, in a container by its cgroup).

A published one is asked on its host port; an unpublished one at its own address where this machine routes to
it (a runtime's bridge network: Podman's 10.88.0.0/16, Docker's 172.17.0.0/16), on the ports its network
namespace listens on; else one line says why it cannot be read. Blocking: /proc reads and the API's calls.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import psutil

from tui.engines.knowledge import program_name
from tui.engines.known import serving_program
from tui.model.containers import Container
from tui.sources.container_of import container_of
from tui.sources.containers import Catalog
from tui.sources.discover_listeners import Candidate, local_addresses
from tui.sources.port_holder import engine_in, in_container, namespace_addresses

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)
_LISTEN = "0A"


def in_containers(known: set[int], catalog: Catalog | None) -> tuple[list[Candidate], list[str]]:
    """Candidates for the engines in containers whose process is not in `known` (the engines found through
    a listener), and a line for each that cannot be asked."""
    found: list[Candidate] = []
    lines: list[str] = []
    seen: set[str] = set()
    for c in catalog.containers() if catalog is not None else ():
        pid = engine_in(c)
        program = _program(pid)
        if pid is None or program is None:
            continue
        seen.add(c.id)
        if pid in known:
            continue
        if c.ports:  # published without a process (the firewall's): asked where it is published
            hosts: dict[int, str] = {}
            for ip, port, _ in c.ports:  # Docker lists a port once for IPv4 and once for IPv6: asked once
                hosts.setdefault(port, "127.0.0.1" if ip in ("", "0.0.0.0", "::") else ip)
            found.extend(Candidate((_url_host(host),), port, pid, program, program, container=c)
                         for port, host in hosts.items())
        else:
            _at_address(pid, program, c, found, lines)
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info.get("cmdline") or ()
        program = serving_program(argv) if argv else None
        if program is None or proc.pid in known:
            continue
        where = container_of(proc.pid)
        if where is None or where[1] in seen:
            continue
        seen.add(where[1])  # its first engine process: vLLM's workers run under it
        container = in_container(proc.pid, catalog) or Container(where[1], where[0])
        _at_address(proc.pid, program, container, found, lines)
    return found, lines


def _program(pid: int | None) -> str | None:
    if pid is None:
        return None
    try:
        return serving_program(psutil.Process(pid).cmdline())
    except _GONE:
        return None


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _at_address(pid: int, program: str, c: Container, found: list[Candidate], lines: list[str]) -> None:
    who = f"{program} pid {pid} in {c.runtime} container {c.label()}"
    ports = sorted(listening(pid))
    # its own addresses: not loopback, and not one of this machine's (pasta copies the host's address into a
    # rootless container: asked there, the host's own port would answer)
    mine = local_addresses()
    addresses = sorted(a for a in namespace_addresses(pid)
                       if not ipaddress.ip_address(a).is_loopback and a not in mine)
    if c.address and c.address not in addresses:
        addresses.insert(0, c.address)
    if not ports:
        lines.append(f"not asked: {who} listens on no port of its own network, or only on its loopback")
        return
    routed = [a for a in addresses if routed_here(a)]
    if not routed:
        why = f"its address {addresses[0]} is not routed from this machine" if addresses else \
            "it has no address of its own"
        lines.append(f"not asked: {who} listens on :{', :'.join(map(str, ports))} inside its container, "
                     f"published on no port of this machine enginetop could tie to it, and {why}: publish it "
                     "(-p HOST:CONTAINER), give the runtime's API socket (DOCKER_HOST), or run enginetop in "
                     "its network")
        return
    found.extend(Candidate((routed[0],), port, pid, program, program_name([program]), container=c)
                 for port in ports)


def listening(pid: int) -> set[int]:
    """The TCP ports process `pid`'s network namespace listens on, on any address but loopback."""
    ports: set[int] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 4 or fields[3] != _LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            if not _loopback(address):
                ports.add(int(port, 16))
    return ports


def _loopback(hex_address: str) -> bool:
    """A /proc/net/tcp address (little-endian words) on loopback."""
    if len(hex_address) == 8:
        return hex_address.endswith("7F")  # 127.x.x.x: its first byte is the last pair
    return hex_address == "0" * 24 + "01000000" or hex_address.endswith("0100007F")


def routed_here(address: str, routes: Iterable[tuple[int, int]] | None = None) -> bool:
    """This machine has a route to `address` other than its default one (a runtime's bridge)."""
    try:
        ip = int(ipaddress.IPv4Address(address))
    except ValueError:
        return False
    return any(mask and ip & mask == net for net, mask in (_routes() if routes is None else routes))


def _routes() -> list[tuple[int, int]]:
    """(network, mask) of the host's IPv4 routes but the default, from /proc/net/route (little-endian)."""
    try:
        with open("/proc/net/route", encoding="ascii") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return []
    out = []
    for row in rows:
        fields = row.split()
        if len(fields) >= 8:
            # each address in network order, written as a little-endian word: read back little-endian
            out.append((int.from_bytes(bytes.fromhex(fields[1]), "little"),
                        int.from_bytes(bytes.fromhex(fields[7]), "little")))
    return out
