"""The shares a bar draws (tui.model.shares): a part over its whole, a percentage over 100; None where either
is not known or the whole is 0, never a bar of nothing."""

from __future__ import annotations

from tui.model.samples import EngineSample, GpuReport, HostSample
from tui.model.shares import EngineShares, GpuShares, HostShares


def share(part: float | None, whole: float | None) -> float | None:
    """`part` of `whole`, 0 to 1 (or past 1: a part over its whole is said as it is)."""
    return part / whole if part is not None and whole else None


def pct_share(pct: float | None) -> float | None:
    """A percentage (0 to 100) as a share (0 to 1)."""
    return None if pct is None else pct / 100


def gpu_shares(report: GpuReport | None) -> tuple[GpuShares, ...]:
    """Each GPU's utilisation and memory, in the report's order; none without a report."""
    if report is None:
        return ()
    return tuple(GpuShares(util=pct_share(g.util_gpu_pct),
                           memory=share(g.vram_used_bytes, g.vram_total_bytes)) for g in report.gpus)


def host_shares(host: HostSample) -> HostShares:
    """The host's CPU and RAM."""
    return HostShares(cpu=pct_share(host.cpu_pct), ram=share(host.ram_used_bytes, host.ram_total_bytes))


def engine_shares(sample: EngineSample) -> EngineShares:
    """The engine's running requests of its slots, and its KV cache in use (its own figure, else its /slots'
    estimate); None where its reading, its slots or both figures are not known."""
    reading, config = sample.reading, sample.config
    if reading is None:
        return EngineShares(running=None, kv=None)
    kv = reading.kv_cache_usage
    if kv is None and sample.slots is not None:
        kv = sample.slots.kv_estimate
    return EngineShares(running=share(reading.running, config.slots if config is not None else None), kv=kv)
