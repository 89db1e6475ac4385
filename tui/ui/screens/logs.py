"""The tail of a launched engine's log file (key `l`), refreshed while it is open."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tui.base.process import tail_lines

LINES = 60


class LogScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,l", "dismiss", "Close")]
    DEFAULT_CSS = """
    LogScreen { align: center middle; }
    LogScreen > VerticalScroll { width: 95%; height: 85%; border: thick $primary; background: $surface; }
    """

    def __init__(self, title: str, path: Path | None) -> None:
        super().__init__()
        self.title_text = title
        self.path = path

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = self.title_text
            yield Static(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_tail()
        self.set_interval(1.0, self.refresh_tail)

    def refresh_tail(self) -> None:
        if self.path is None:
            text = Text("this engine was not launched by enginetop: no log file", style="dim")
        else:
            lines = tail_lines(self.path, LINES)
            text = Text("\n".join(lines) if lines else f"{self.path} is empty")
        self.query_one("#log", Static).update(text)
