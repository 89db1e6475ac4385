"""Small order statistics: quantiles that say None when there is nothing to summarise (probes, benches, the
proxy's traffic: one definition, linear interpolation between ranks)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def _clean(values: Iterable[float | None]) -> list[float]:
    return sorted(v for v in values if v is not None and math.isfinite(v))


def quantile(values: Iterable[float | None], q: float) -> float | None:
    """Linear-interpolated quantile (q in 0..1) of the values that exist; None if there are none."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be within 0..1, got {q}")
    data = _clean(values)
    if not data:
        return None
    pos = (len(data) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Iterable[float | None]) -> float | None:
    return quantile(values, 0.5)
