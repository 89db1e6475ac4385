"""The fleet table's GPU figures for one engine, from the GPUs matched to it (by pod, GPU labels or node in
tui.fleet.match, a floor above): the mean utilisation, the hottest temperature, the summed power and the
throttle reasons of them all."""

from __future__ import annotations

from collections.abc import Sequence

from tui.model.fleet_gpus import FleetGpus
from tui.model.samples import GpuSample


def fleet_gpus(gpus: Sequence[GpuSample]) -> FleetGpus:
    """The figures of `gpus`, each over the GPUs that say it."""
    if not gpus:
        return FleetGpus(count=0)
    utils = [g.util_gpu_pct for g in gpus if g.util_gpu_pct is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    return FleetGpus(
        count=len(gpus),
        util_pct=sum(utils) / len(utils) if utils else None,
        temp_c=max(temps) if temps else None,
        power_w=sum(g.power_w for g in gpus if g.power_w is not None),
        throttle=tuple(sorted({w for g in gpus if g.throttled for w in g.throttle_reasons if w != "idle"})))
