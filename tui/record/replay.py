"""A recording played back as a feed source: the store takes the recorded readings again and derives the
same rates, quantiles and throttle spans the live dashboard derived from them.

The cursor is a time on the recording's own clock (its time.monotonic()), so every recorded time (sample
times, probe send/first-token instants) is used as it was. Going back, or jumping, rebuilds the store
from the rows the windows need: the plots' horizon plus the latency window before the cursor.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta

from tui.lifecycle.switch import EngineStatus
from tui.record.reader import Recording
from tui.record.writer import Event
from tui.store import MIN_PROBES_KEPT, Store

SPEEDS = (1, 2, 5, 10, 30, 60)
EXTRA_S = 2.0  # beyond the latency window: the oldest reading it compares with


class ReplaySource:
    """The feed source of a replay. `read` moves the cursor by the time passed (times the speed) unless
    paused, and returns what the recording holds up to it."""

    name = "replay"

    def __init__(self, recording: Recording, store: Store, interval_s: float = 0.25,
                 start: float | None = None) -> None:
        self.rec = recording
        self.store = store
        self.interval_s = interval_s
        self.speed = 1
        self.paused = False
        self.events: deque[Event] = deque(maxlen=1000)  # switch steps, alerts, crashes seen so far
        self.now = recording.start if start is None else start  # the cursor, on the recording's clock
        self._fed_to: float | None = None  # rows up to this time are in the store
        self._real: float | None = None  # time.monotonic() of the last advance
        self._probe_sources = recording.sources("probe")
        self._engines = list(dict.fromkeys([*recording.engines, *recording.sources("engine")]))

    @property
    def at_end(self) -> bool:
        return self.rec.end is None or self.now >= self.rec.end

    async def read(self) -> Iterable[object]:
        real = time.monotonic()
        if self._real is not None and not self.paused and not self.at_end:
            self.now = min(self.rec.end, self.now + (real - self._real) * self.speed)
        self._real = real
        return self.take()

    def take(self) -> list[object]:
        """What the store has not been given yet, up to the cursor; everything it needs after a seek."""
        if self.rec.empty:
            return []
        if self._fed_to is None:
            return self._prime()
        if self.now <= self._fed_to:
            return []
        items = [r for r in self.rec.rows(self._fed_to, self.now) if r.t > self._fed_to]
        self._fed_to = self.now
        return self._split(items)

    def seek(self, t: float) -> None:
        """Move the cursor (clamped to the recording); the next read rebuilds the store."""
        assert self.rec.start is not None and self.rec.end is not None
        self.now = min(max(t, self.rec.start), self.rec.end)
        self._fed_to = None

    def step(self, forward: bool) -> None:
        """One sample on: the next (or previous) engine poll time; the display pauses there."""
        self.paused = True
        rows = self.rec.rows(self.now + 1e-9, None, ("engine",)) if forward else \
            iter(self.rec.last_before("engine", self.now - 1e-9, 1))
        row = next(rows, None)
        if row is None:
            return
        if forward:
            self.now = row.t
        else:
            self.seek(row.t)

    def faster(self, up: bool) -> int:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 0
        self.speed = SPEEDS[min(len(SPEEDS) - 1, i + 1) if up else max(0, i - 1)]
        return self.speed

    def engine_status(self, name: str) -> EngineStatus | None:
        """The launcher's state of an engine enginetop started, as recorded last before the cursor."""
        rows = [r for r in self.rec.last_before("event", self.now + 1e-9, 50, name)
                if r.item is not None and r.item.kind == "engine-state"]
        if not rows:
            return None
        data = rows[-1].item.data
        return EngineStatus(state=data.get("state", "idle"), profile=name, message=data.get("message") or "",
                            exit_code=data.get("exit_code"), log_tail=tuple(data.get("log_tail") or ()))

    def _prime(self) -> list[object]:
        self.store.reset()
        for name in self._engines:  # every column keeps its engine, whether or not it polled yet
            self.store.engine(name, self.rec.engines.get(name, ""))
        self.events.clear()
        t0 = self.now - self.store.horizon_s - self.store.latency_window_s - EXTRA_S
        # The probe panel lists the last few probes however old they are.
        old_probes = []
        for name in self._probe_sources:
            old_probes += [r for r in self.rec.last_before("probe", t0, MIN_PROBES_KEPT, name)]
        rows = sorted(old_probes, key=lambda r: r.t) + list(self.rec.rows(t0, self.now))
        self._fed_to = self.now
        return self._split(rows)

    def _split(self, rows: list) -> list[object]:
        out = []
        for row in rows:
            if row.item is None:
                continue
            if isinstance(row.item, Event):
                self.events.append(row.item)
            else:
                out.append(row.item)
        return out


def parse_goto(text: str, rec: Recording) -> float:
    """`HH:MM[:SS]` (wall-clock time on the recording's days; the first match from its start) or `-5m`,
    `-90s`, `-1h` from the end, to a time on the recording's clock."""
    assert rec.start is not None and rec.end is not None
    text = text.strip()
    rel = re.fullmatch(r"-\s*(\d+(?:\.\d+)?)\s*([smh]?)", text)
    if rel:
        seconds = float(rel.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[rel.group(2)]
        return max(rec.start, rec.end - seconds)
    clock = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", text)
    if not clock:
        raise ValueError(f"{text!r}: give a time of day HH:MM:SS or a time before the end like -5m")
    h, m, s = int(clock.group(1)), int(clock.group(2)), int(clock.group(3) or 0)
    if h > 23 or m > 59 or s > 59:
        raise ValueError(f"{text!r} is not a time of day")
    first = datetime.fromtimestamp(rec.wall(rec.start))
    target = first.replace(hour=h, minute=m, second=s, microsecond=0)
    if target < first.replace(microsecond=0):
        target += timedelta(days=1)
    t = target.timestamp() - rec.mono_to_wall
    if t > rec.end + 1:
        raise ValueError(f"{text} is after the recording ends ({rec.clock(rec.end)})")
    return max(rec.start, t)
