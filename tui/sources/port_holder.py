"""Who holds an engine's port on this machine, and which processes are the engine's own: the one rule that
the configuration (argv), host memory, energy and GPU attribution all follow (tui.sources.config,
tui.sources.engine_source.LocalPids, tui.sources.energy_meter.EnginePids).

The listener is not always the engine:
* a container runtime's port publisher — conmon (Podman), docker-proxy (Docker), rootlessport, pasta,
  slirp4netns — forwards to an engine in a container: the engine's own process is followed into the container
  (the runtime's API says which container publishes the port and its first process; without a socket,
  conmon's command line names its container and its child runs in it, docker-proxy's names the container's
  address, which the engine's network namespace holds);
* a tunnel or forwarder — ssh, autossh, socat, kubectl port-forward, cloudflared, ngrok, frpc — relays to an
  engine elsewhere, and enginetop's own proxy relays to an engine it watches: nothing of such a process is the
  engine's (its argv says nothing of the engine's settings, its memory and its CPU's joules are not the
  engine's), so no process is given at all, and the words say why.
Any other listener is taken for the engine (a program enginetop has no table for may still be one).

Blocking (a socket walk, /proc reads, the runtime's API within its timeout): called from threads.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import psutil

from tui.engines.knowledge import program_name
from tui.engines.known import serving_program
from tui.model.containers import Container, PortHolder
from tui.sources.container_of import container_of
from tui.sources.containers import Catalog
from tui.sources.processes import children_map, pids_listening, tree_pids

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)

# a runtime's port publisher -> the runtime, as a user names it
PUBLISHERS = {"conmon": "podman", "docker-proxy": "docker", "rootlessport": "rootless podman",
              "rootlessport-child": "rootless podman", "slirp4netns": "slirp4netns (rootless podman)",
              "pasta": "pasta (rootless podman)", "pasta.avx2": "pasta (rootless podman)",
              "rootlesskit": "rootless docker", "gvproxy": "podman machine",
              "vpnkit-bridge": "Docker Desktop", "com.docker.backend": "Docker Desktop"}
# a relay to an engine that is not on this machine, or not in this process
TUNNELS = {"ssh": "an ssh tunnel", "autossh": "an ssh tunnel (autossh)", "socat": "a socat forwarder",
           "kubectl": "kubectl port-forward", "oc": "oc port-forward", "cloudflared": "a cloudflared tunnel",
           "ngrok": "an ngrok tunnel", "frpc": "an frp tunnel", "chisel": "a chisel tunnel",
           "sshuttle": "an sshuttle tunnel", "tailscaled": "tailscale serve",
           "sshd": "an ssh reverse tunnel (ssh -R)"}


def is_enginetop(argv: Sequence[str]) -> bool:
    """enginetop itself: its script (`enginetop proxy`), or `python -m tui` (a clone's way to run it)."""
    if not argv:
        return False
    name = program_name(argv).removesuffix(".exe")
    exe = argv[0].replace("\\", "/").rsplit("/", 1)[-1]
    return name == "enginetop" or (name == "tui" and exe.startswith("python"))


def whose_port(host: str | None, port: int, catalog: Catalog | None = None) -> PortHolder:
    """Who listens on (`host`, `port`) of this machine (host None: any address), and the engine behind it.
    `catalog`: the runtimes' containers (None: /proc alone)."""
    return whose_ports([(host, port)], catalog)[(host, port)]


def whose_ports(addresses: list[tuple[str | None, int]], catalog: Catalog | None = None
                ) -> dict[tuple[str | None, int], PortHolder]:
    """whose_port for each address, from one walk of every socket."""
    listening = pids_listening(addresses)
    return {(host, port): _holder(listening.get((host, port)), port, catalog) for host, port in addresses}


def _holder(pid: int | None, port: int, catalog: Catalog | None) -> PortHolder:
    if pid is None:
        # Docker with its userland proxy off publishes through the firewall alone: no process listens
        published = catalog.publishing(port) if catalog is not None else None
        if published is not None:
            return _into(PortHolder(port), published, f"published by {published.runtime} for container "
                         f"{published.label()} (no forwarding process: the firewall's)")
        return PortHolder(port, why_none="no process of this machine was found listening on its port")
    return held_by(pid, port, catalog)


def held_by(pid: int, port: int, catalog: Catalog | None = None) -> PortHolder:
    """What the process `pid` listening on `port` is, and the engine's own process behind it."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return PortHolder(port, pid, why_none=f"the process listening on its port (PID {pid}) has exited")
    except psutil.AccessDenied:
        return PortHolder(port, pid, why_none=f"the process listening on its port (PID {pid}) belongs to "
                          "another user")
    program = program_name(argv)
    name = program.removesuffix(".exe").rstrip(":")  # sshd's title: "sshd: user@pts/0"
    here = PortHolder(port, pid, program)
    if is_enginetop(argv):
        words = f"enginetop's proxy (PID {pid}): the engine is the one it relays to"
        return _with(here, forwarder=words, why_none=words)
    if name in TUNNELS:
        where = "the engine is where it forwards to" if name == "socat" else "the engine is elsewhere"
        words = f"{TUNNELS[name]} (PID {pid}{_to(name, argv)}): {where}"
        return _with(here, forwarder=words, why_none=words)
    if name in PUBLISHERS:
        runtime = PUBLISHERS[name]
        found = catalog.publishing(port) if catalog is not None else None
        if found is None:
            found = _from_proc(name, pid, argv, catalog)
        if found is None:
            words = f"{name} (PID {pid}) publishes it for {runtime}"
            return _with(here, forwarder=words, why_none=f"{words}; which container it forwards to cannot be "
                         "told without the runtime's API socket")
        return _into(here, found, f"published by {found.runtime} for container {found.label()}")
    # the engine itself, perhaps in a container on the host's network
    return _with(here, engine_pid=pid, container=in_container(pid, catalog))


def in_container(pid: int, catalog: Catalog | None = None) -> Container | None:
    """The container process `pid` runs in: the runtime's own account where a socket answers, else what
    /proc tells (its runtime and id)."""
    found = container_of(pid)
    if found is None:
        return None
    runtime, cid = found
    known = catalog.by_id(cid) if catalog is not None else None
    return known or Container(cid, runtime, name=_conmon_name(cid), pid=None)


def engine_in(container: Container) -> int | None:
    """The engine's root process among the container's: the first (lowest) that runs an engine by its
    command line, else the container's first process."""
    if container.pid is None:
        return None
    held = container_of(container.pid)
    if (held is not None and held[1] != container.id) or (held is None and container.via != "/proc"):
        # not in that container (a PID reused since the runtime was asked; a runtime running its containers
        # in a VM, whose PIDs are not this machine's): no process here is the engine's
        return None
    for pid in sorted(tree_pids(container.pid)):
        try:
            if serving_program(psutil.Process(pid).cmdline()):
                return pid
        except _GONE:
            continue
    return container.pid


def _into(holder: PortHolder, container: Container, words: str) -> PortHolder:
    engine = engine_in(container)
    why = None if engine is not None else f"{words}, whose process cannot be found on this machine"
    return _with(holder, engine_pid=engine, forwarder=words, container=container, why_none=why)


def _with(holder: PortHolder, **changes: object) -> PortHolder:
    return dataclasses.replace(holder, **changes)  # type: ignore[arg-type]


def _option(argv: Sequence[str], *names: str) -> str | None:
    for arg, value in itertools.pairwise(argv):
        if arg in names:
            return value
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in names:
            return value
    return None


def _from_proc(name: str, pid: int, argv: Sequence[str], catalog: Catalog | None) -> Container | None:
    """The container a publisher forwards to, from /proc alone: conmon's command line names its container
    (-c ID, -n NAME) and its child is the container's first process; docker-proxy's names the container's
    address (-container-ip), which the engine's network namespace holds."""
    if name == "conmon":
        cid = _option(argv, "-c", "--cid")
        if not cid:
            return None
        known = catalog.by_id(cid) if catalog is not None else None
        if known is not None:
            return known
        kids = sorted(children_map().get(pid, ()))
        return Container(cid, "podman", name=_option(argv, "-n", "--name"), pid=kids[0] if kids else None)
    if name == "docker-proxy":
        address = _option(argv, "-container-ip")
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info.get("cmdline") or ()
            if address and serving_program(argv) and address in namespace_addresses(proc.pid):
                found = container_of(proc.pid)
                if found is not None:
                    return Container(found[1], found[0], pid=proc.pid, address=address)
    return None


def namespace_addresses(pid: int) -> set[str]:
    """The IPv4 addresses of the process's network namespace (its fib_trie's host LOCAL entries)."""
    try:
        with open(f"/proc/{pid}/net/fib_trie", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    return {lines[i - 1].split()[-1] for i, line in enumerate(lines)
            if i and line.strip() == "/32 host LOCAL"}


_NAMES: dict[str, str | None] = {}  # container id -> its name: a walk of every process, once per container


def _conmon_name(cid: str) -> str | None:
    """Podman's name for container `cid`, from its conmon's command line (-n NAME)."""
    if cid not in _NAMES:
        if len(_NAMES) > 256:
            _NAMES.clear()
        _NAMES[cid] = next((_option(argv, "-n", "--name") for proc in psutil.process_iter(["name", "cmdline"])
                            if proc.info.get("name") == "conmon"
                            and _option(argv := proc.info.get("cmdline") or (), "-c", "--cid") == cid), None)
    return _NAMES[cid]


_SSH_VALUED = set("BbcDEeFIiJLlmOoPpQRSWw")  # ssh's options that take a value (ssh(1))


def _ssh_destination(args: Sequence[str]) -> str | None:
    """ssh's destination: its first argument that is no option nor an option's value (what follows it is a
    remote command, which may hold anything, a key among it: never shown)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if arg.startswith("-") and len(arg) > 1:
            flags = arg[1:]
            for k, flag in enumerate(flags):
                if flag in _SSH_VALUED:
                    i += 1 if k + 1 < len(flags) else 2  # its value joined ("-p22") or the next argument
                    break
            else:
                i += 1
            continue
        return arg.rsplit("@", 1)[-1]
    return None


def _to(name: str, argv: Sequence[str]) -> str:
    """Where a tunnel leads, when its command line says: ", to HOST:PORT"."""
    if name in ("socat",):
        target = next((a for a in argv[1:] if a.upper().startswith(("TCP:", "TCP4:", "TCP6:"))), None)
        return f", to {target.split(':', 1)[1].split(',')[0]}" if target else ""
    if name in ("ssh", "autossh"):
        host = _ssh_destination(argv[1:])
        return f", through {host}" if host else ""
    if name in ("kubectl", "oc") and "port-forward" in argv:
        rest = argv[argv.index("port-forward") + 1:]
        return f", to {rest[0]}" if rest else ""
    return ""
