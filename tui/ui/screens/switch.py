"""Confirming a profile switch, and watching its steps live (each with its elapsed time)."""

from __future__ import annotations

import threading

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static

from tui.lifecycle.engine import EngineInstance
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import STEPS
from tui.model.status import StepEvent

STATUS_STYLE = {
    "ok": "green", "failed": "bold red", "cancelled": "yellow", "skipped": "dim", "running": "cyan",
}


def switch_question(current: EngineInstance | None, to: Profile) -> str:
    """What the confirmation asks: what the switch will stop (or unload), wait for, and start (or load)."""
    if current is not None and current.profile.same_router(to):
        return (f"Switch to profile {to.name}: model {to.router_model} of the router at {to.url}?\n"
                f"The router keeps running. This unloads {current.profile.router_model}, waits until the "
                f"router says unloaded, its process is gone and its VRAM released, then loads "
                f"{to.router_model} and waits until it is loaded and answers a 1-token completion.")
    if current is None:
        what = "No engine is running in this column"
    elif current.profile.router_model and current.attached:
        what = f"This unloads {current.profile.router_model} from the router at {current.url}"
    elif current.pid:
        what = f"This stops {current.name} (PID {current.pid}) at {current.url}"
    else:
        what = f"This detaches from {current.name} at {current.url}"
    then = f"has the router load {to.router_model}" if to.router_model else f"starts {to.name}"
    return (f"Switch to profile {to.name} ({to.engine}, port {to.port})?\n{what}, waits until its VRAM is "
            f"released and its port is closed, then {then} and waits until ready.")


class ConfirmSwitch(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n,q", "answer(False)", "No"), Binding("enter,y", "answer(True)", "Yes")]
    DEFAULT_CSS = """
    ConfirmSwitch { align: center middle; }
    ConfirmSwitch > Vertical {
        width: 80; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    ConfirmSwitch Horizontal { height: auto; align-horizontal: right; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question)
            with Horizontal():
                yield Button("Switch (y)", variant="warning", id="yes")
                yield Button("Cancel (n)", id="no")
        yield Footer()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class SwitchProgress(ModalScreen[None]):
    """Fed StepEvents by the app's switch worker; escape cancels a running switch, or closes a done one."""

    BINDINGS = [Binding("escape,q", "cancel_or_close", "Cancel / close")]
    DEFAULT_CSS = """
    SwitchProgress { align: center middle; }
    SwitchProgress > Vertical {
        width: 110; height: auto; border: thick $primary; background: $surface; padding: 1 2;
    }
    """

    def __init__(self, title: str, cancel: threading.Event) -> None:
        super().__init__()
        self.title_text = title
        self.cancel = cancel
        self.events: dict[str, StepEvent] = {}
        self.done: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text, style="bold"))
            yield Static(id="steps")
            yield Static(Text("escape: cancel the switch", style="dim"), id="hint")
        yield Footer()

    def on_mount(self) -> None:
        self._draw()

    def step(self, event: StepEvent) -> None:
        self.events[event.name] = event
        self._draw()

    def finish(self, message: str, ok: bool) -> None:
        self.done = message
        hint = self.query_one("#hint", Static)
        hint.update(Text(f"{message}\nescape: close", style="green" if ok else "bold red"))
        self._draw()

    def _draw(self) -> None:
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="dim")
        table.add_column("step")
        table.add_column("status")
        table.add_column("elapsed", justify="right")
        table.add_column("detail")
        for name in STEPS:
            event = self.events.get(name)
            if event is None:
                table.add_row(name, Text("pending", style="dim"), "", "")
            else:
                table.add_row(name, Text(event.status, style=STATUS_STYLE.get(event.status, "")),
                              f"{event.elapsed_s:.1f} s", event.message)
        self.query_one("#steps", Static).update(table)

    def action_cancel_or_close(self) -> None:
        if self.done is None:
            self.cancel.set()
            self.query_one("#hint", Static).update(Text("cancelling…", style="yellow"))
        else:
            self.dismiss()
