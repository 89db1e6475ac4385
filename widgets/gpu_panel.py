"""GPU panel: every GPU (NVIDIA, AMD, Intel, each with its vendor) with utilisation, bandwidth, power, energy
over the window and idle power, heat, clocks, VRAM, throttling and who holds VRAM."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from tui.model.samples import GpuReport, GpuSample
from widgets.energy import window_text
from widgets.fmt import NA, Rows, bar, gib, num
from widgets.panel import Panel
from widgets.styles import ALARM


class GpuPanel(Panel):
    DEFAULT_CSS = """
    GpuPanel { border: round $secondary; padding: 0 1; height: auto; }
    """
    BORDER_TITLE = "GPU"

    def show(self, report: GpuReport | None) -> None:
        self.redraw(render_gpus(report))


def render_gpus(report: GpuReport | None) -> Group | Text:
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
    parts.extend(_render_gpu(g) for g in report.gpus)
    return Group(*parts)


def _render_gpu(g: GpuSample) -> Group:
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
    util = g.util_gpu_pct
    grid.add_row("util", f"{bar(None if util is None else util / 100).plain} {num(util, '{:.0f}%')}"
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
    used, total = g.vram_used_bytes, g.vram_total_bytes
    frac = used / total if used is not None and total else None
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
