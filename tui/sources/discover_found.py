"""What discovery found (tui.sources.discover): an engine, confirmed by its answer, and the child processes it
runs (a llama-server router's or llama-swap's own servers), which are part of it and never engines of their
own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tui.model.containers import Container

How = Literal["command line", "usual port"]


@dataclass(frozen=True, slots=True)
class FoundChild:
    """A server a router or llama-swap started for one of its models: shown under its parent, never watched
    apart (the parent answers for it, and asking the child directly would bypass what the parent counts)."""

    pid: int
    port: int
    program: str  # "llama-server", or whatever the parent runs
    model: str | None  # from its command line (--alias, else the model file); None when it names none

    def words(self) -> str:
        """"gemma-a (llama-server pid 4243 on :40123)"."""
        what = f"{self.program} pid {self.pid} on :{self.port}"
        return f"{self.model} ({what})" if self.model else what


@dataclass(frozen=True, slots=True)
class FoundEngine:
    """An engine found on this machine and confirmed by its answer."""

    name: str  # its column's name: the model it serves, else its program
    url: str  # on loopback, or on one of this machine's own addresses, e.g. http://127.0.0.1:8080
    port: int
    pid: int | None  # None: the socket's owner could not be read (another user's process)
    program: str  # "llama-server", "llama-swap", "vLLM", "SGLang", or the listening process's program
    how: How
    models: tuple[str, ...] = ()  # as /v1/models lists them
    children: tuple[FoundChild, ...] = ()  # the servers it started for its models (router, llama-swap)
    uid: int | None = None  # the user its process runs as (effective uid); None: not readable
    container: Container | None = None  # the container its process runs in (tui.sources.port_holder)

    def words(self) -> str:
        """How it was found, in a line: "gemma: llama-server pid 4242 on :8080, from its command line"."""
        return f"{self.name}: {self.found_as()}"

    def found_as(self) -> str:
        """The line of words() after its name."""
        who = f"{self.program} pid {self.pid}" if self.pid is not None else self.program
        if self.container is not None:
            who += f" in {self.container.runtime} container {self.container.label()}"
        how = ("from its command line" if self.how == "command line"
               else "answering as an OpenAI-compatible server on a usual port")
        serves = f", serving {len(self.models)} models" if len(self.models) > 1 else ""
        kids = ", ".join(c.words() for c in self.children)
        runs = f"; its child processes: {kids}" if kids else ""
        return f"{who} on :{self.port}, {how}{serves}{runs}"
