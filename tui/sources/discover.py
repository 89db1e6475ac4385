"""The engines on this machine, found without flags (`enginetop`, `enginetop snapshot` with no --engine,
--profile or --prometheus; `--no-discover` turns it off).

Two ways in, each confirmed by asking the server itself (GET /health and /v1/models):
* from a command line: every process LISTENing on a TCP port of this machine whose command line runs an
  engine: llama-server, llama-swap, `vllm serve` and vLLM's entrypoints, SGLang's launch_server
  (tui.engines.known.serving_program);
* on a usual port: any OpenAI-compatible server (its /v1/models answers a model list) on loopback at one of
  8080 (llama-server), 8000 (vLLM), 30000 (SGLang), 1234 (LM Studio), 11434 (Ollama), or the ports
  ENGINETOP_DISCOVER_PORTS lists (`8080,9000`; empty: none).

Where each is asked, and what is never an engine (enginetop itself, a router's or llama-swap's children, which
are listed under their parent): tui.sources.discover_listeners. A listener on IPv6 is asked on [::1]: one
bound to ::1, and one bound to the IPv6 wildcard `::` when 127.0.0.1 does not answer (an IPv6-only socket,
IPV6_V6ONLY, as a server started with `--host ::` may be). A usual port whose listener cannot be seen is asked
on 127.0.0.1, then [::1]. One bound only to another address of this machine is asked there; one bound to an
address this machine does not have is not asked, and said so.

How long it may take: all are asked at once, within one deadline (tui.sources.discover_ask.DEADLINE_S, 3 s)
and with a cap on each answer's body; a port that has not answered by then is said ("did not answer in time")
and not watched.

Each is named after its model (one model), else its program. Only this machine's processes and addresses are
ever asked, and nothing is started, stopped or loaded: two GETs per candidate (three for a process that is not
an engine by its command line: enginetop's proxy answers /enginetop/traffic).

Sockets of another user's processes list no PID unless enginetop runs as root: their command lines cannot
be read, so such an engine is found only on a usual port (`Discovery.unreadable` says so). Which found engine
may be given an API key that names none: tui.sources.discover_keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from tui.base.defaults import DEFAULT_PORTS, PORTS_ENV
from tui.sources.containers import shared_catalog
from tui.sources.discover_ask import DEADLINE_S, Late, confirm
from tui.sources.discover_containers import in_containers
from tui.sources.discover_found import FoundChild, FoundEngine, How
from tui.sources.discover_listeners import EITHER, Listeners, listeners, url_hosts

__all__ = ["DEADLINE_S", "DiscoverError", "Discovery",
           "FoundChild", "FoundEngine", "How", "discover", "discover_async", "url_hosts", "usual_ports"]


class DiscoverError(ValueError):
    pass


@dataclass
class Discovery:
    engines: list[FoundEngine] = field(default_factory=list)
    ports: tuple[int, ...] = DEFAULT_PORTS
    unreadable: str | None = None  # what could not be looked at, and why
    late: list[str] = field(default_factory=list)  # a line each: a port that did not answer in time
    not_asked: list[str] = field(default_factory=list)  # a line each: a listener not asked, and why

    def asked(self) -> str:
        """What was looked at, in words."""
        ports = ", ".join(str(p) for p in self.ports) or "none"
        return f"listening processes' command lines, and loopback ports {ports}"

    def report(self, subcommand: str = "") -> list[str]:
        """What was found and how, a line each, then what did not answer in time or was not asked; with
        nothing found, what was asked and what to run next (next_steps; `subcommand`: the one it names, e.g.
        "snapshot")."""
        if self.engines:
            lines = [f"found {e.words()}" for e in self.engines]
        else:
            lines = [f"no engine found on this machine (asked: {self.asked()})"]
        lines += self.late + self.not_asked
        if not self.engines:
            lines += self.next_steps(subcommand)
        if self.unreadable:
            lines.append(self.unreadable)
        return lines

    def next_steps(self, subcommand: str = "") -> list[str]:
        """The commands that go on from nothing found: none here. Discovery only finds; which command a user
        runs depends on how enginetop was installed, and is said where the command line's text is built
        (tui.run.discovery)."""
        return []


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


# the name tests/test_discover.py has always used
_url_hosts = url_hosts


def _short(model: str) -> str:
    """A model id as a column names it: its last path part, without a .gguf."""
    name = model.rstrip("/").rsplit("/", 1)[-1]
    return name[:-5] if name.lower().endswith(".gguf") else name


def _named(found: list[FoundEngine]) -> list[FoundEngine]:
    out: list[FoundEngine] = []
    taken: set[str] = set()
    for engine in found:
        if engine.container is not None and engine.container.name:
            name = engine.container.name  # what its user called it when they started it
        elif len(engine.models) == 1:
            name = _short(engine.models[0])
        elif engine.how == "command line" or engine.pid is not None:
            name = engine.program.replace(" ", "-")
        else:
            name = f"server-{engine.port}"
        if name in taken:
            name = f"{name}:{engine.port}"
        taken.add(name)
        out.append(dataclasses.replace(engine, name=name))
    return out


def _walk(ports: tuple[int, ...]) -> Listeners:
    """The listeners, then the engines in containers that none of them publishes."""
    catalog = shared_catalog()
    walked = listeners(ports, None, catalog)
    inside, lines = in_containers({c.pid for c in walked.candidates if c.pid is not None}, catalog)
    published = {c.port for c in inside if c.hosts[0] in EITHER}
    # a usual port asked blind (its listener unseen) that a runtime says it publishes: asked as that engine
    walked.candidates = [c for c in walked.candidates if c.pid is not None or c.port not in published]
    walked.candidates += inside
    walked.not_asked += lines
    if catalog.error:
        walked.not_asked.append(f"containers not read through their runtime: {catalog.error}")
    return walked


async def discover_async(ports: tuple[int, ...] | None = None, deadline_s: float = DEADLINE_S) -> Discovery:
    """The engines on this machine: the socket walk, then every candidate asked at once, all within
    `deadline_s` of the first question."""
    ports = usual_ports() if ports is None else ports
    walked = await asyncio.to_thread(_walk, ports)
    deadline = asyncio.get_running_loop().time() + deadline_s
    # asked directly: no proxy from the environment, no .netrc; httpx's own timeout (for each connect and
    # read) is the deadline too, so that a port is given up only at the deadline, and then said
    async with httpx.AsyncClient(timeout=deadline_s, trust_env=False, follow_redirects=False) as client:
        outcomes = await asyncio.gather(*(confirm(client, c, deadline) for c in walked.candidates))
    late = [f":{o.candidate.port} ({o.candidate.who()}) did not answer in time (within {deadline_s:g} s): "
            "not watched" for o in outcomes if isinstance(o, Late)]
    engines = [o for o in outcomes if isinstance(o, FoundEngine)]
    return Discovery(_named(engines), ports, walked.unreadable, late, walked.not_asked)


def discover(ports: tuple[int, ...] | None = None, deadline_s: float = DEADLINE_S) -> Discovery:
    """The engines on this machine (blocking; the socket walk, then at most `deadline_s`). DiscoverError: a
    bad ENGINETOP_DISCOVER_PORTS."""
    return asyncio.run(discover_async(ports, deadline_s))
