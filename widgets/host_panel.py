"""Host panel: CPU, its package energy (RAPL), RAM, swap and each local engine's process-tree RSS (host RAM
kills engines too)."""

from __future__ import annotations

from rich.text import Text

from tui.model.samples import HostSample
from widgets.energy import window_text
from widgets.fmt import Rows, bar, gib, num
from widgets.panel import Panel

RAM_ALARM = 0.90  # above this share of RAM (or any swap in use under load) the panel turns red


class HostPanel(Panel):
    DEFAULT_CSS = """
    HostPanel { border: round $secondary; padding: 0 1; height: auto; }
    """
    BORDER_TITLE = "host"

    def show(self, sample: HostSample | None) -> None:
        self.redraw(render_host(sample))


def render_host(h: HostSample | None) -> Text:
    if h is None:
        return Text("reading host…", style="dim")
    grid = Rows()
    cpu = h.cpu_pct
    grid.add_row("CPU", f"{bar(None if cpu is None else cpu / 100).plain} {num(cpu, '{:.0f}%')}"
                 f" of {num(h.cpu_count, '{:.0f}')} cores")
    energy = window_text(h.cpu_energy)
    if energy is not None:
        grid.add_row("CPU energy", energy)
    elif h.cpu_energy_error:
        grid.add_row("CPU energy", Text(h.cpu_energy_error, style="dim"))
    ram_frac = None
    if h.ram_used_bytes is not None and h.ram_total_bytes:
        ram_frac = h.ram_used_bytes / h.ram_total_bytes
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
