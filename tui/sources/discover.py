"""The engines on this machine, found without flags (`enginetop`, `enginetop snapshot` with no --engine,
--profile or --prometheus; `--no-discover` turns it off).

Two ways in, each confirmed by asking the server itself (GET /health and /v1/models, on loopback):
* from a command line: every process LISTENing on a TCP port reachable on loopback (127.0.0.0/8, ::1, or a
  wildcard address) whose command line runs an engine: llama-server, llama-swap, `vllm serve` and vLLM's
  entrypoints, SGLang's launch_server (tui.engines.known.serving_program);
* on a usual port: any OpenAI-compatible server (its /v1/models answers a model list) on loopback at one of
  8080 (llama-server), 8000 (vLLM), 30000 (SGLang), 1234 (LM Studio), 11434 (Ollama), or the ports
  ENGINETOP_DISCOVER_PORTS lists (`8080,9000`; empty: none).

A listener on IPv6 is asked on [::1]: one bound to ::1, and one bound to the IPv6 wildcard `::` when 127.0.0.1
does not answer (an IPv6-only socket, IPV6_V6ONLY, as a server started with `--host ::` may be). A usual port
whose listener cannot be seen is asked on 127.0.0.1, then [::1].

Each is named after its model (one model), else its program. Only this machine's processes and loopback are
ever asked, and nothing is started, stopped or loaded: two GETs per candidate, with a short timeout.

Sockets of another user's processes list no PID unless enginetop runs as root: their command lines cannot
be read, so such an engine is found only on a usual port (`Discovery.unreadable` says so).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import psutil

from tui.base.install import command, demo_hint
from tui.engines.knowledge import program_name
from tui.engines.known import serving_program

DEFAULT_PORTS = (8080, 8000, 30000, 1234, 11434)
PORTS_ENV = "ENGINETOP_DISCOVER_PORTS"
ASK_TIMEOUT_S = 1.5
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)

How = Literal["command line", "usual port"]


class DiscoverError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class FoundEngine:
    """An engine found on this machine and confirmed by its answer."""

    name: str  # its column's name: the model it serves, else its program
    url: str  # on loopback, e.g. http://127.0.0.1:8080
    port: int
    pid: int | None  # None: the socket's owner could not be read (another user's process)
    program: str  # "llama-server", "llama-swap", "vLLM", "SGLang", or the listening process's program
    how: How
    models: tuple[str, ...] = ()  # as /v1/models lists them

    def words(self) -> str:
        """How it was found, in a line: "llama-server pid 4242 on :8080, from its command line"."""
        who = f"{self.program} pid {self.pid}" if self.pid is not None else self.program
        how = ("from its command line" if self.how == "command line"
               else "answering as an OpenAI-compatible server on a usual port")
        serves = f", serving {len(self.models)} models" if len(self.models) > 1 else ""
        return f"{self.name}: {who} on :{self.port}, {how}{serves}"


@dataclass
class Discovery:
    engines: list[FoundEngine] = field(default_factory=list)
    ports: tuple[int, ...] = DEFAULT_PORTS
    unreadable: str | None = None  # what could not be looked at, and why

    def asked(self) -> str:
        """What was looked at, in words."""
        ports = ", ".join(str(p) for p in self.ports) or "none"
        return f"listening processes' command lines, and loopback ports {ports}"

    def report(self, subcommand: str = "") -> list[str]:
        """What was found and how, a line each; with nothing found, what was asked and the two ways on
        (`subcommand`: the one the hint names, e.g. "snapshot")."""
        if self.engines:
            lines = [f"found {e.words()}" for e in self.engines]
        else:
            lines = [f"no engine found on this machine (asked: {self.asked()})", *start_hints(subcommand)]
        if self.unreadable:
            lines.append(self.unreadable)
        return lines


def start_hints(subcommand: str = "") -> list[str]:
    """The one line to point enginetop (or its `subcommand`, e.g. "snapshot") at an engine and the one to
    start the demo, each as this install runs it (tui.base.install: a clone's is `.venv/bin/enginetop`)."""
    run = " ".join(filter(None, (command(), subcommand)))
    return [f"watch an engine: `{run} --engine NAME=http://HOST:PORT`", f"start the demo: {demo_hint()}"]


def usual_ports(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    env = os.environ if environ is None else environ
    text = env.get(PORTS_ENV)
    if text is None:
        return DEFAULT_PORTS
    ports = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise DiscoverError(f"{PORTS_ENV}={text!r}: expected port numbers separated by commas")
        ports.append(int(part))
    return tuple(dict.fromkeys(ports))


_EITHER = ("127.0.0.1", "[::1]")


@dataclass(frozen=True, slots=True)
class _Candidate:
    hosts: tuple[str, ...]  # as a URL writes them (127.0.0.1, [::1]), asked in turn until one answers
    port: int
    pid: int | None
    program: str | None  # an engine's program when its command line says so
    process: str | None  # the listening process's program, whatever it is


def _url_hosts(ip: str) -> tuple[str, ...]:
    """The loopback addresses that may reach a socket listening on `ip`, in the order to ask them; none when
    loopback does not. IPv6's wildcard `::` takes IPv4 too unless the socket is IPv6-only: 127.0.0.1 first."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return ()
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_unspecified:
        return ("127.0.0.1",) if addr.version == 4 else _EITHER
    if addr.is_loopback:
        return (str(addr),) if addr.version == 4 else (f"[{addr}]",)
    return ()


def _listeners(ports: tuple[int, ...]) -> tuple[list[_Candidate], str | None]:
    """Every candidate: the engines' listening sockets, and the usual ports (asked even when the socket list
    cannot be read). Blocking: one walk of every socket and a read of each listener's command line."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError) as exc:
        conns = []
        unreadable: str | None = (f"this machine's sockets cannot be listed here ({exc}): only the usual "
                                  "ports were asked")
    else:
        unreadable = None
    mine = os.getpid()
    found: dict[int, _Candidate] = {}
    own: set[int] = set()
    hidden = 0
    argvs: dict[int, list[str] | None] = {}
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        hosts = _url_hosts(conn.laddr.ip)
        port = conn.laddr.port
        if not hosts or port in found:
            continue
        if conn.pid == mine:
            own.add(port)
            continue
        if conn.pid is None:
            hidden += 1
            if port in ports:  # asked where it listens (its owner is unknown)
                found[port] = _Candidate(hosts, port, None, None, None)
            continue
        if conn.pid not in argvs:
            try:
                argvs[conn.pid] = psutil.Process(conn.pid).cmdline()
            except _GONE:
                argvs[conn.pid] = None
        argv = argvs[conn.pid]
        program = serving_program(argv) if argv else None
        if program is not None or port in ports:
            found[port] = _Candidate(hosts, port, conn.pid, program, program_name(argv) if argv else None)
    for port in ports:
        if port not in own:  # this process's own listener (a proxy, `enginetop web`) is not an engine
            found.setdefault(port, _Candidate(_EITHER, port, None, None, None))
    if hidden and unreadable is None and os.geteuid() != 0:
        unreadable = (f"{hidden} listening socket(s) belong to other users' processes, whose command lines "
                      "cannot be read without root: an engine among them is found only on a usual port")
    return sorted(found.values(), key=lambda c: c.port), unreadable


async def _get(client: httpx.AsyncClient, url: str) -> tuple[int | None, Any]:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None, None
    try:
        body = response.json() if response.status_code == 200 else None
    except ValueError:
        body = None
    return response.status_code, body


def _model_ids(body: Any) -> tuple[str, ...] | None:
    """The ids of an OpenAI model list, or None when `body` is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    return tuple(str(m["id"]) for m in body["data"] if isinstance(m, dict) and m.get("id"))


async def _confirm(client: httpx.AsyncClient, c: _Candidate) -> FoundEngine | None:
    for host in c.hosts:  # the first address whose server answers at all
        base = f"http://{host}:{c.port}"
        (health, _), (listed, body) = await asyncio.gather(_get(client, f"{base}/health"),
                                                           _get(client, f"{base}/v1/models"))
        if health is not None or listed is not None:
            break
    models = _model_ids(body)
    if c.program is not None:
        # its command line says what it is: any answer of its HTTP server confirms it (503: still loading)
        if health is None and listed is None:
            return None
        program = c.program
        how: How = "command line"
    else:
        keyed = listed in (401, 403) and health == 200  # an OpenAI server that wants a key
        if models is None and not keyed:
            return None
        program = c.process or "a process whose command line cannot be read"
        how = "usual port"
    return FoundEngine(name="", url=base, port=c.port, pid=c.pid, program=program, how=how,
                       models=models or ())


def _short(model: str) -> str:
    """A model id as a column names it: its last path part, without a .gguf."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return name[:-5] if name.lower().endswith(".gguf") else name


def _named(found: list[FoundEngine]) -> list[FoundEngine]:
    out: list[FoundEngine] = []
    taken: set[str] = set()
    for engine in found:
        if len(engine.models) == 1:
            name = _short(engine.models[0])
        elif engine.how == "command line" or engine.pid is not None:
            name = engine.program.replace(" ", "-")
        else:
            name = f"server-{engine.port}"
        if name in taken:
            name = f"{name}:{engine.port}"
        taken.add(name)
        out.append(FoundEngine(name, engine.url, engine.port, engine.pid, engine.program, engine.how,
                               engine.models))
    return out


async def discover_async(ports: tuple[int, ...] | None = None, timeout_s: float = ASK_TIMEOUT_S) -> Discovery:
    ports = usual_ports() if ports is None else ports
    candidates, unreadable = await asyncio.to_thread(_listeners, ports)
    # loopback only, asked directly: no proxy from the environment, no .netrc
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False, follow_redirects=False) as client:
        answers = await asyncio.gather(*(_confirm(client, c) for c in candidates))
    return Discovery(_named([a for a in answers if a is not None]), ports, unreadable)


def discover(ports: tuple[int, ...] | None = None, timeout_s: float = ASK_TIMEOUT_S) -> Discovery:
    """The engines on this machine (blocking; at most about `timeout_s`). DiscoverError: a bad
    ENGINETOP_DISCOVER_PORTS."""
    return asyncio.run(discover_async(ports, timeout_s))
