"""Starting and switching the engines enginetop drives through profiles, from the dashboard: the workers
that run a start or a switch in a thread, the notifications that say how it ended, and the keys that ask
for one (1-9) or show an engine's log (`l`).

A start that leaves nothing running is said where the column's health is, and offers what does run on this
machine; the engines enginetop launched are stopped when the app exits (stop_managed), and a start in
progress is cancelled on quit so that it cannot hold the exit for minutes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from tui.base.install import command
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import SwitchResult
from tui.live.store import Store
from tui.model.samples import EngineSample
from tui.model.status import StepEvent
from tui.run.discovery import discover, start_hints
from tui.run.targets import profile_target
from tui.sources.containers import shared_catalog
from tui.ui.core import AppCore
from tui.ui.screens.logs import LINES, LogScreen
from tui.ui.screens.switch import ConfirmSwitch, SwitchProgress, switch_question
from tui.ui.slots import Slot
from widgets.engine_panel import EnginePanel

log = logging.getLogger(__name__)


def give_up(store: Store, slot: Slot, why: str) -> None:
    """Nothing runs in this column and nothing will until the next start: say so where its health is, and
    stop polling a port nothing listens on."""
    slot.given_up = why
    target = slot.target
    store.add(EngineSample(name=target.name, url=target.url, t=time.monotonic(), wall=time.time(),
                           health="down", health_reason=why))


def what_works(watched: set[str]) -> list[str]:
    """In a thread, after a start that left nothing running: the engines running on this machine (but those
    at the `watched` URLs), or how to point enginetop at one."""
    try:
        found = discover().engines
    except Exception as exc:  # discovery is an offer: its failure must not hide the start's
        log.warning("discovery after a failed start: %r", exc)
        found = []
    found = [e for e in found if e.url not in watched]
    if found:
        return [f"running on this machine (`{command()}` with no flags watches them):",
                *(f"  {e.words()}" for e in found)]
    return [start_hints()[0]]


class Lifecycle(AppCore):
    """The keys and workers of the engines this dashboard drives; a mixin of EnginetopApp."""

    def _selected_slot(self, managed: bool) -> Slot | None:
        candidates = [s for s in self.slots if s.manager is not None] if managed else list(self.slots)
        focused = self.focused
        for slot in candidates:
            if focused is not None and focused.id == f"engine-{slot.index}":
                return slot
        return candidates[0] if candidates else None

    def action_switch(self, number: int) -> None:
        profiles = self.config.switchable
        if not 1 <= number <= len(profiles):
            self.notify(f"no profile {number}: {len(profiles)} switchable profile(s), see ?",
                        severity="warning")
            return
        slot = self._selected_slot(managed=True)
        if slot is None or slot.manager is None:
            self.notify("no engine here was started by enginetop: start one with --profile NAME",
                        severity="warning")
            return
        to = profiles[number - 1]
        question = switch_question(slot.manager.current, to)

        def answered(yes: bool | None) -> None:
            if yes:
                progress = SwitchProgress(f"switching {slot.target.name} → {to.name}", threading.Event())
                self.push_screen(progress)
                self._run_lifecycle(slot, to, progress)

        self.push_screen(ConfirmSwitch(question), answered)

    def _run_lifecycle(self, slot: Slot, to: Profile, progress: SwitchProgress | None,
                       initial: bool = False) -> None:
        """Start (initial: or adopt the engine `enginetop up` left running for this profile) or switch."""
        assert slot.manager is not None
        manager = slot.manager
        cancel = progress.cancel if progress else threading.Event()
        new_target = profile_target(to)
        slot.profile = to
        slot.given_up = None
        slot.target = new_target
        self.store.engine(new_target.name, new_target.url)
        self._relabel(slot)

        def on_step(event: StepEvent) -> None:
            self.record_event("switch", slot.target.name, {"to": to.name, **event.to_json()})
            if progress is not None:
                self.call_from_thread(progress.step, event)

        def work() -> tuple[SwitchResult, list[str]]:
            adopted = manager.adopt_recorded(to, on_step=on_step, cancel=cancel) if initial else None
            result = adopted if adopted is not None else manager.switch(to, on_step=on_step, cancel=cancel)
            offer = []
            if not result.ok and manager.current is None and not cancel.is_set():
                offer = what_works({s.target.url for s in self.slots})
            return result, offer

        def done(result: SwitchResult, offer: list[str]) -> None:
            if progress is not None:
                progress.finish(result.message, result.ok)
            slot.failure = None if result.ok else f"{result.failed_step} failed: {result.message}"
            self.record_event("switch-result", slot.target.name, {
                "to": to.name, "ok": result.ok, "failed_step": result.failed_step, "message": result.message})
            if not result.ok and manager.current is None and not cancel.is_set():
                why = f"not running: {to.name} did not start ({result.failed_step} failed)"
                give_up(self.store, slot, why)
            if not result.ok:
                self.notify("\n".join([result.message, *offer]), severity="error",
                            title=f"{to.name}: {result.failed_step} failed", timeout=30 if offer else 15)

        async def run() -> None:
            result, offer = await asyncio.to_thread(work)
            done(result, offer)

        self.run_worker(run(), name=f"lifecycle {to.name}", group="lifecycle")

    def _relabel(self, slot: Slot) -> None:
        if hasattr(self, "_main") and self._main.is_mounted:
            self._main.query_one(f"#engine-{slot.index}", EnginePanel).border_title = slot.target.name
            self.sub_title = self._subtitle()

    def action_show_log(self) -> None:
        """The log of the engine enginetop started, else of the focused engine's container (its runtime's
        log API), else why there is none."""
        slot = self._selected_slot(managed=True)
        if slot is None or slot.manager is None:
            watched = self._selected_slot(managed=False)
            state = self.store.engines.get(watched.target.name) if watched is not None else None
            container = state.container if state is not None else None
            if watched is None or container is None:
                self.notify("no engine here was started by enginetop or runs in a container enginetop "
                            "can see, so there is no log to show", severity="warning")
                return
            key = [k for k in (watched.target.api_key,) if k]
            self.push_screen(LogScreen(f"log of {watched.target.name}: {container.runtime} container "
                                       f"{container.label()}", None,
                                       read=lambda: shared_catalog().logs(container, LINES, key)))
            return
        status = slot.manager.poll_status()
        current = slot.manager.current
        path = status.log_path or (current.log_path if current else None)
        self.push_screen(LogScreen(f"log of {slot.target.name}: {path}", path))

    def _cancel_lifecycle(self) -> None:
        for slot in self.slots:
            if slot.manager is not None:
                slot.manager.cancel()

    def stop_managed(self) -> list[SwitchResult]:
        """Stop the engines this dashboard launched (an engine adopted from `enginetop up` is left running,
        and its result says so); called after the app exits (it blocks)."""
        return [slot.manager.shutdown() for slot in self.slots if slot.manager is not None]
