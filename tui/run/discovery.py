"""Discovery as enginetop tells it to a user: what tui.sources.discover found, and, when it found nothing,
the commands that go on from there, as this install runs them (tui.base.install: a clone's enginetop is
`.venv/bin/enginetop` and its demo a make target, a wheel's `enginetop --demo`). The dashboard, `snapshot`
and the app's offer after a failed start say these; tui.sources.discover itself only finds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tui.base.install import command, demo_hint
from tui.sources.discover import DEADLINE_S, Discovery
from tui.sources.discover import discover as find_engines


def start_hints(subcommand: str = "") -> list[str]:
    """The one line to point enginetop (or its `subcommand`, e.g. "snapshot") at an engine and the one to
    start the demo, each as this install runs it (tui.base.install: a clone's is `.venv/bin/enginetop`)."""
    run = " ".join(filter(None, (command(), subcommand)))
    return [f"watch an engine: `{run} --engine NAME=http://HOST:PORT`", f"start the demo: {demo_hint()}"]


@dataclass
class Discovered(Discovery):
    """A discovery whose report, with nothing found, ends with the two ways on (start_hints)."""

    def next_steps(self, subcommand: str = "") -> list[str]:
        return start_hints(subcommand)


def discover(ports: tuple[int, ...] | None = None, deadline_s: float = DEADLINE_S) -> Discovered:
    """The engines on this machine (tui.sources.discover.discover: blocking, DiscoverError for a bad
    ENGINETOP_DISCOVER_PORTS), its report saying how to go on when there are none."""
    found = find_engines(ports, deadline_s)
    return Discovered(**{f.name: getattr(found, f.name) for f in dataclasses.fields(found)})
