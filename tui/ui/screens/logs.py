"""The tail of an engine's log (key `l`), refreshed while it is open: the file of one enginetop launched, or
what a container's runtime keeps of one in a container (read in a thread: its API answers over a socket)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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

    def __init__(self, title: str, path: Path | None, read: Callable[[], list[str]] | None = None) -> None:
        """`read`: the log's last lines from elsewhere than a file (raises with the reason it cannot)."""
        super().__init__()
        self.title_text = title
        self.path = path
        self.read = read

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = self.title_text
            yield Static(id="log")
        yield Footer()

    async def on_mount(self) -> None:
        await self.refresh_tail()
        self.set_interval(1.0, self.refresh_tail)

    async def refresh_tail(self) -> None:
        if self.read is not None:
            try:
                lines = await asyncio.to_thread(self.read)
            except Exception as exc:  # the runtime's words: which socket, and why
                text = Text(str(exc), style="yellow")
            else:
                text = Text("\n".join(lines[-LINES:]) if lines else "the container's log is empty")
        elif self.path is None:
            text = Text("this engine was not launched by enginetop: no log file", style="dim")
        else:
            lines = tail_lines(self.path, LINES)
            text = Text("\n".join(lines) if lines else f"{self.path} is empty")
        self.query_one("#log", Static).update(text)
