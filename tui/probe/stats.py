"""Small order statistics for probe results: quantiles that say None when there is nothing to summarise."""

from __future__ import annotations

import math
from collections import deque
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


class RollingMedian:
    """Median of the last `window` values; None values ("not available") are skipped, not counted as 0."""

    def __init__(self, window: int = 5) -> None:
        if window < 1:
            raise ValueError(f"rolling window must be at least 1, got {window}")
        self._values: deque[float] = deque(maxlen=window)

    def add(self, value: float | None) -> float | None:
        if value is not None and math.isfinite(value):
            self._values.append(value)
        return self.value

    @property
    def value(self) -> float | None:
        return median(self._values)

    def __len__(self) -> int:
        return len(self._values)
