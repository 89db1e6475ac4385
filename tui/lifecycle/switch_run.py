"""One start, stop or switch as it runs: the events it emits, each step's final one, its cancel, and the
routers it asked.

Every step of a switch (tui.lifecycle.switch runs them in order, tui.lifecycle.engine_steps and
tui.lifecycle.drain do their work) gets the same `SwitchRun`: a step says so with `enter` (the engine's
status shows it), reports with `emit`, and stops at its next `check_cancel` once the run is cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tui.lifecycle.engine import Cancelled, StepError
from tui.lifecycle.profile_resolve import ResolvedProfile
from tui.lifecycle.router import Router, open_router
from tui.model.status import StepEvent, StepStatus


@dataclass
class SwitchRun:
    """Bookkeeping of one start/stop/switch: emits events and collects each step's final one."""

    on_step: Callable[[StepEvent], None] | None
    cancel: threading.Event
    # where the engine's status learns the step that runs now (EngineManager.poll_status reads it)
    show_step: Callable[[str | None], None]
    steps: list[StepEvent] = field(default_factory=list)
    current: str | None = None
    began: float = 0.0
    routers: dict[str, Router] = field(default_factory=dict)

    def enter(self, step: str | None) -> None:
        """The step that runs from now on (None: none, the run is over), as the engine's status shows it."""
        self.show_step(step)

    def emit(self, name: str, status: StepStatus, message: str) -> StepEvent:
        if name != self.current:
            self.current, self.began = name, time.monotonic()
        event = StepEvent(name, status, time.monotonic() - self.began, message)
        if status != "running":
            self.steps.append(event)
        if self.on_step is not None:
            self.on_step(event)
        return event

    def check_cancel(self, step: str) -> None:
        if self.cancel.is_set():
            raise Cancelled(step)

    def unexpected(self, exc: Exception) -> StepError:
        """A surprise still fails one named step: the one that was running."""
        step = self.current or "resolve"
        return StepError(step, f"step '{step}' failed unexpectedly: {type(exc).__name__}: {exc}")

    def router(self, resolved: ResolvedProfile) -> Router:
        """The router (llama-server router mode or llama-swap) of a profile's `router_model`, one per URL for
        the whole switch: a start llama-swap is still doing belongs to the one that asked for it."""
        if resolved.profile.url not in self.routers:
            self.routers[resolved.profile.url] = open_router(resolved.profile, resolved.api_key)
        return self.routers[resolved.profile.url]

    def forget_router(self, url: str) -> None:
        """Ask which kind of router it is again (one launched just now did not answer yet)."""
        router = self.routers.pop(url, None)
        if router is not None:
            router.close()

    def close(self) -> None:
        for url in list(self.routers):
            self.forget_router(url)
