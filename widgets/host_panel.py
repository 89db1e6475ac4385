"""Host panel: CPU, its package energy (RAPL), RAM, swap and each local engine's process-tree RSS (host RAM
kills engines too)."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from tui.live.shares import host_shares
from tui.model.samples import HostSample
from tui.model.shares import HostShares
from widgets.energy import window_text
from widgets.fmt import Rows, bar, gib, num
from widgets.panel import Panel

RAM_ALARM = 0.90  # above this share of RAM (or any swap in use under load) the panel turns red


class MachinePanel(Panel):
    """A panel of the machine's own figures (the host's, its GPUs'), in the look they share: `show` draws the
    reading it is given, with its bars' shares (tui.live.shares), through the subclass's `draw`."""

    DEFAULT_CSS = """
    MachinePanel { border: round $secondary; padding: 0 1; height: auto; }
    """

    def draw(self, reading: Any, shares: Any) -> RenderableType:
        raise NotImplementedError

    def show(self, reading: Any, shares: Any = None) -> None:
        self.redraw(self.draw(reading, shares))


def render_host(h: HostSample | None, shares: HostShares | None = None) -> Text:
    """`shares`: the sample's CPU and RAM (tui.live.shares.host_shares); made from it where a caller has
    none."""
    if h is None:
        return Text("reading host…", style="dim")
    if shares is None:
        shares = host_shares(h)
    grid = Rows()
    grid.add_row("CPU", f"{bar(shares.cpu).plain} {num(h.cpu_pct, '{:.0f}%')}"
                 f" of {num(h.cpu_count, '{:.0f}')} cores")
    energy = window_text(h.cpu_energy)
    if energy is not None:
        grid.add_row("CPU energy", energy)
    elif h.cpu_energy_error:
        grid.add_row("CPU energy", Text(h.cpu_energy_error, style="dim"))
    ram_frac = shares.ram
    ram = Text(f"{bar(ram_frac).plain} {gib(h.ram_used_bytes)} / {gib(h.ram_total_bytes)}")
    if ram_frac is not None and ram_frac > RAM_ALARM:
        ram.stylize("bold red")
    grid.add_row("RAM", ram)
    swap = Text(f"{gib(h.swap_used_bytes)} / {gib(h.swap_total_bytes)}")
    if h.swap_used_bytes and ram_frac is not None and ram_frac > RAM_ALARM:
        swap.stylize("bold red")
    grid.add_row("swap", swap)
    for m in h.engines:
        where = f", in {m.container.runtime} container {m.container.label()}" if m.container else ""
        grid.add_row(m.engine, f"RSS {gib(m.rss_bytes)} in {m.processes} process(es), pid {m.pid}{where}")
    for engine, why in h.unowned:
        grid.add_row(engine, Text(f"no process here: its port is held by {why}", style="dim"))
    return grid.text()


class HostPanel(MachinePanel):
    BORDER_TITLE = "host"

    def draw(self, reading: HostSample | None, shares: HostShares | None) -> Text:
        return render_host(reading, shares)
