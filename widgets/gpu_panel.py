"""GPU panel: every GPU (NVIDIA, AMD, Intel, each with its vendor) with utilisation, bandwidth, power, energy
over the window and idle power, heat, clocks, VRAM, throttling and who holds VRAM."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from tui.live.shares import gpu_shares
from tui.model.samples import GpuReport, GpuSample
from tui.model.shares import GpuShares
from widgets.energy import window_text
from widgets.fmt import NA, Rows, bar, gib, num
from widgets.host_panel import MachinePanel
from widgets.styles import ALARM


def render_gpus(report: GpuReport | None, shares: Sequence[GpuShares] | None = None) -> Group | Text:
    """`shares`: each GPU's utilisation and memory, in the report's order (tui.live.shares.gpu_shares);
    made from the report where a caller has none."""
    if report is None:
        return Text("reading GPUs…", style="dim")
    if report.unavailable:
        return Text(report.unavailable, style="dim")
    if not report.gpus:
        return Text("no GPU found", style="dim")
    parts: list[RenderableType] = []
    if report.error:
        parts.append(Text(report.error, style="bold yellow"))
    if report.driver_version:
        parts.append(Text(f"driver {report.driver_version}", style="dim"))
    if shares is None:
        shares = gpu_shares(report)
    parts.extend(_render_gpu(g, s) for g, s in zip(report.gpus, shares, strict=True))
    return Group(*parts)


class GpuPanel(MachinePanel):
    BORDER_TITLE = "GPU"

    def draw(self, reading: GpuReport | None, shares: Sequence[GpuShares] | None) -> Group | Text:
        return render_gpus(reading, shares)


def _render_gpu(g: GpuSample, shares: GpuShares) -> Group:
    grid = Rows()
    where = f"{g.host} " if g.host else ""
    name = g.name or "GPU"
    if g.vendor and not name.lower().startswith(g.vendor.lower()):
        name = f"{g.vendor} {name}"
    title = Text(f"{where}[{g.index}] {name}", style="bold")
    if g.driver and g.driver not in ("nvml", "dcgm"):  # read from sysfs: which driver's files
        title.append(f" ({g.driver})", style="dim")
    if g.stale:
        title.append("  stale", style="bold yellow")
    if g.error:
        return Group(title, Text(g.error, style="bold red"))
    if g.throttled:
        title.append("  THROTTLED: " + ", ".join(r for r in g.throttle_reasons if r != "idle"), style=ALARM)
    elif g.throttle_reasons:
        title.append("  " + ", ".join(g.throttle_reasons), style="dim")
    grid.add_row("util", f"{bar(shares.util).plain} {num(g.util_gpu_pct, '{:.0f}%')}"
                 f"   mem-ctrl {num(g.util_mem_pct, '{:.0f}%')}")
    bw = NA
    if g.mem_bw_gbps is not None:
        bw = f"{g.mem_bw_gbps:.0f} GB/s"
        if g.mem_bw_pct is not None:
            bw += f" ({g.mem_bw_pct:.0f}% of {num(g.peak_bw_gbps, '{:.0f}')} GB/s, {g.mem_bw_source})"
    if g.mem_bw_gbps is None and g.mem_bw_pct is not None:  # dcgm: the share of cycles DRAM was busy
        bw = f"DRAM active {g.mem_bw_pct:.0f}% ({g.mem_bw_source})"
    grid.add_row("mem bw", bw)
    fan = f"   fan {g.fan_rpm:.0f} RPM" if g.fan_rpm is not None else ""
    grid.add_row("power", f"{num(g.power_w, '{:.0f}')} / {num(g.power_limit_w, '{:.0f} W')}"
                 f"   temp {num(g.temp_c, '{:.0f} °C')}{fan}")
    energy = window_text(g.energy)
    if energy is not None:
        grid.add_row("energy", energy)
    grid.add_row("clocks", f"SM {num(g.sm_clock_mhz, '{:.0f}')} MHz"
                 f"  mem {num(g.mem_clock_mhz, '{:.0f}')} MHz")
    used, total, frac = g.vram_used_bytes, g.vram_total_bytes, shares.memory
    if g.unified_memory and used is None and total is None:  # GB10, Jetson: the host's RAM is the figure
        grid.add_row("memory", Text("unified memory: see host RAM", style="dim"))
    elif g.unified_memory:
        grid.add_row("memory", f"{bar(frac).plain} {gib(used)} / {gib(total)}"
                     " (unified memory, shared with host RAM)")
    else:
        grid.add_row("VRAM", f"{bar(frac).plain} {gib(used)} / {gib(total)}")
    if g.xid_error:
        grid.add_row("XID", Text(f"last XID error {g.xid_error}", style="bold red"))
    for p in g.processes:
        who = p.engine or (f"in {p.container}, not watched" if p.container else "not watched")
        grid.add_row("", f"pid {p.pid} ({who}) {gib(p.used_bytes)}" + (" host RSS" if p.host_memory else ""))
    return Group(title, grid.text())
