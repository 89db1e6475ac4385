"""One engine's every figure (key `enter` on its column): what the column leaves out to be read at a glance,
refreshed while it is open."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tui.live.engine_state import EngineState
from widgets.engine_panel import render_engine


class EngineDetailScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]
    DEFAULT_CSS = """
    EngineDetailScreen { align: center middle; }
    EngineDetailScreen > VerticalScroll { width: 95%; height: 90%; border: thick $primary;
                                          background: $surface; padding: 0 1; }
    """

    def __init__(self, name: str, state: Callable[[], EngineState | None]) -> None:
        super().__init__()
        self.engine_name = name
        self.state = state  # the engine's state now: the app's store answers

    def compose(self) -> ComposeResult:
        with VerticalScroll() as scroll:
            scroll.border_title = f"{self.engine_name}: every figure"
            yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)

    def redraw(self) -> None:
        state = self.state()
        width = max(40, self.size.width - 8) if self.size.width else 100
        text = render_engine(state, width=width) if state is not None else Text(
            f"{self.engine_name} is no longer watched", style="dim")
        self.query_one("#detail", Static).update(text)
