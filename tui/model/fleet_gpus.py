"""What the fleet table says of the GPUs one engine is matched to (its own, or its node's shared with the
engines there): their count, mean utilisation, hottest temperature, summed power and why any is throttled
(tui.live.fleet_gpus)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FleetGpus:
    count: int  # the GPUs matched; 0: none (every figure None)
    util_pct: float | None = None  # the mean over the GPUs that say theirs
    temp_c: float | None = None  # the hottest of those that say theirs
    # summed over those that say theirs; matched GPUs of which none says it sum to 0 (as the table always
    # showed them), no GPU matched is None
    power_w: float | None = None
    throttle: tuple[str, ...] = ()  # every active reason on any of them but "idle", A to Z
