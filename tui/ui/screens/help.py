"""The help screen: every key the dashboard knows, generated from the bindings so it cannot drift."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from tui.sources.rates import MIN_BUSY_TOKENS

ABOUT = (
    "Rates come from counters (Δ/Δt over the rate window), never from llama.cpp's reset-on-scrape gauges. "
    "prompt tok/s counts every prompt token, those served from the prefix cache included; prefill tok/s "
    "counts only the prompt tokens the engine computed (cache hits excluded). Both mean the same on every "
    "engine. decode busy (llama.cpp) = generated tokens per second of decode time, shown from "
    f"{MIN_BUSY_TOKENS} tokens on; llama.cpp adds up each slot's decode time, so with several requests at "
    "once it is the rate of one stream, not of the engine (gen tok/s is the engine's). "
    "Latency quantiles come from histogram bucket deltas (vLLM, SGLang). "
    "'n/a' = the engine does not expose it; '–' = exposed but idle in the window, or too little in it "
    "for a figure that can be trusted. config = what the engine is really set to, read from it (/props, "
    "/slots, its command line; vLLM's cache_config_info); ERROR / WARNING / INFO rows are findings: a trap "
    "its figures or its traffic show, the numbers it rests on, and what to try. spec per pos = the share of "
    "drafts whose token at each position was accepted."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 90; height: auto; border: thick $primary; background: $surface; padding: 1 2;
    }
    """

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self._keys = bindings

    def compose(self) -> ComposeResult:
        table = Table(title="enginetop keys", expand=True, show_edge=False)
        table.add_column("key", style="bold cyan", no_wrap=True)
        table.add_column("does")
        for key, description in self._keys:
            table.add_row(key, description)
        with Vertical():
            yield Static(table)
            yield Static(ABOUT, classes="about")
            yield Static("[dim]escape / q / ? closes this screen[/dim]")
        yield Footer()
