"""A plotted series: (t, value) points over a horizon, at most so many of them, and what a sparkline or a
throttle strip reads of it. Memory grows with neither session length nor horizon."""

from __future__ import annotations

import math
from collections import deque

Point = tuple[float, float]  # (time.monotonic(), value)

SPARK_CELL_S = 1.0  # a sparkline's cell is this much time, whatever the poll interval: its span stays put
SPARK_HOLD_S = 10.0  # the slowest poll `-` allows: a figure holds through the cells until the next reading


class Series:
    """(t, value) points over the last `horizon_s`, at most `max_points` + 1 of them.

    Samples that fall in the same time bucket of horizon/max_points seconds share one point: the first
    sample's time and the mean of the values, or their maximum with `peak=True` (a throttled second must
    never be averaged away). Samples further apart than a bucket keep a point each, so a short horizon
    keeps full resolution. Values that are not available are not stored.
    """

    def __init__(self, horizon_s: float, max_points: int, peak: bool = False) -> None:
        self.horizon_s = horizon_s
        self.bucket_s = horizon_s / max_points
        self.peak = peak
        self.points: deque[Point] = deque(maxlen=max_points + 1)
        self._bucket: int | None = None  # bucket of the newest point
        self._sum = 0.0
        self._n = 0

    def add(self, t: float, value: float | None) -> None:
        if value is None:
            return
        bucket = math.floor(t / self.bucket_s)
        if bucket == self._bucket and self.points:
            first_t, kept = self.points[-1]
            self._sum += value
            self._n += 1
            self.points[-1] = (first_t, max(kept, value) if self.peak else self._sum / self._n)
        else:
            self.points.append((t, value))
            self._bucket, self._sum, self._n = bucket, value, 1
        cutoff = t - self.horizon_s
        while self.points[0][0] < cutoff:
            self.points.popleft()

    def since(self, t0: float) -> list[Point]:
        return [p for p in self.points if p[0] >= t0]

    def cells(self, width: int, cell_s: float = SPARK_CELL_S) -> list[float | None]:
        """The last `width` cells of `cell_s` seconds each, oldest first, for a sparkline: the same span of
        time whatever the poll interval (`+`/`-`), each cell the mean of its points, a cell no point fell in
        holding the one before (a rate holds until the next reading) for up to SPARK_HOLD_S, None after (no
        figure then: an engine that did not answer is not drawn as steady). Cells before the first point are
        left out, so a young series is right-aligned. Reads only the points of the span, however long the
        history."""
        if not self.points or width <= 0:
            return []
        newest = self.points[-1][0]
        sums = [0.0] * width
        counts = [0] * width
        out: list[float] = []  # seeded with the last point before the span, which the first cells hold
        since = 0  # cells since the last that had a point
        for t, v in reversed(self.points):
            back = round((newest - t) / cell_s)  # round: polls a cell apart with jitter stay a cell apart
            if back >= width:
                out.append(v)
                since = back - width
                break
            sums[width - 1 - back] += v
            counts[width - 1 - back] += 1
        held: list[float | None] = list(out)
        for total, n in zip(sums, counts, strict=True):
            since = 0 if n else since + 1
            if n:
                held.append(total / n)
            elif held:
                held.append(held[-1] if since * cell_s <= SPARK_HOLD_S else None)
        return held[-width:]


def spans(series: Series, t0: float) -> list[tuple[float, float]]:
    """Periods (start, end) since t0 in which a 0/1 series was 1; a span still open ends at its last point."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    last_t = t0
    for t, v in series.since(t0):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t))
            start = None
        last_t = t
    if start is not None:
        out.append((start, last_t))
    return out
