"""Energy figures as the panels draw them: an engine's joules per generated token (its column), a GPU's and
the CPU package's power over the window and idle power (the GPU and host panels). Only drawing: the figures
are tui.sources.energy's, carried by EngineStats, GpuSample.energy and HostSample.cpu_energy."""

from __future__ import annotations

from rich.text import Text

from tui.model.samples import EnergyWindow, EngineStats
from widgets.fmt import IDLE, Rows


def joules(value: float) -> str:
    """Joules with the digits that matter: 0.0123 J, 0.42 J, 12.3 J, 1,234 J."""
    if value < 0.1:
        return f"{value:.4f} J"
    if value < 10:
        return f"{value:.2f} J"
    if value < 1000:
        return f"{value:.1f} J"
    return f"{value:,.0f} J"


def _whose(stats: EngineStats) -> str:
    scope = stats.energy_scope or ""
    if stats.energy_shared_with:
        scope += ", shared with " + ", ".join(stats.energy_shared_with)
    return f"{scope}, {stats.energy_source}" if stats.energy_source else scope


def energy_rows(grid: Rows, stats: EngineStats) -> None:
    """The column's energy rows: joules per generated token and tokens per joule over the rate window, the
    watts they rest on and whose they are (the engine's own GPUs, GPUs it shares, the CPU package), or why
    there is no figure. Nothing for an engine whose energy cannot be known here (not on this machine)."""
    if stats.energy_w is not None:
        if stats.joules_per_token is not None:
            per_j = "n/a" if stats.tokens_per_joule is None else f"{stats.tokens_per_joule:.2f}"
            per_token = f"{joules(stats.joules_per_token)}/tok · {per_j} tok/J"
        else:  # what is unknown (an engine's generation rate on the same device), else truly no tokens
            per_token = f"{IDLE} J/tok ({stats.energy_note or 'no tokens generated'})"
        grid.add_row("energy", f"{per_token} at {stats.energy_w:.1f} W")
        grid.add_row("", Text(_whose(stats), style="dim"))
    elif stats.energy_note:
        grid.add_row("energy", Text(stats.energy_note, style="dim"))


def window_text(window: EnergyWindow | None) -> str | None:
    """A GPU's or the CPU package's energy over the window: watts, joules and seconds, how it was measured,
    and its idle power."""
    if window is None:
        return None
    text = f"{window.watts:.1f} W avg ({joules(window.joules)} in {window.seconds:.0f} s, {window.source})"
    if window.idle_w is not None:
        text += f"  idle {window.idle_w:.1f} W"
    return text
