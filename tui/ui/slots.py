"""An engine column ("slot") and how the feed reads it.

A slot either watches a URL, or drives an engine through a profile with an EngineManager (launch, verify
ready, switch safely, notice a crash). Kept apart from the app because the polling, the lifecycle workers
and the drawing all hold slots, and none of them should need another to know what one is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import EngineManager
from tui.live.feed import Source
from tui.model.samples import EngineSample
from tui.model.status import EngineStatus
from tui.model.targets import EngineTarget
from tui.sources.engine_source import EngineSource


@dataclass
class Slot:
    """One engine column, polled by its `source`. `target.name` is the store key: a switch gives the slot a
    new name, so the plots keep the old configuration's line beside the new one."""

    index: int
    source: EngineSource
    manager: EngineManager | None = None  # set when enginetop drives this engine through profiles
    profile: Profile | None = None
    status: EngineStatus | None = None
    failure: str | None = None  # why the last start/switch failed, until the next one succeeds
    # set when a start or switch left nothing running: the column says why, and its port is not polled (a
    # refused connection would read "starting" for ever) until the next start
    given_up: str | None = None
    probe_every_s: float | None = None

    @property
    def target(self) -> EngineTarget:
        return self.source.target

    @target.setter
    def target(self, target: EngineTarget) -> None:
        self.source.target = target


class _Gate:
    """A managed column's source as the feed reads it: not read while its slot has given up (nothing runs
    there), and an answer that arrives after it gave up is dropped."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.name = slot.source.name

    @property
    def interval_s(self) -> float:  # the source's own: `+` and `-` change it while the feed runs
        return self.slot.source.interval_s

    async def read(self) -> list[EngineSample]:
        if self.slot.given_up is not None:
            return []
        samples = await self.slot.source.read()
        return [] if self.slot.given_up is not None else samples


def feed_sources(sources: Iterable[Source], slots: Iterable[Slot]) -> list[Source]:
    """The run's sources as the feed reads them: a managed column's behind its gate, the rest as they are."""
    managed = {id(slot.source): slot for slot in slots if slot.manager is not None}
    return [_Gate(managed[id(s)]) if id(s) in managed else s for s in sources]
