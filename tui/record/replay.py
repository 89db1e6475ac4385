"""A recording played back as a feed source: the store takes the recorded readings again and derives the
same rates, quantiles and throttle spans the live dashboard derived from them.

The cursor is a time on the recording's own clock (its time.monotonic()), so every recorded time (sample
times, probe send/first-token instants) is used as it was. Going back, or jumping, rebuilds the store
from the rows the windows need: the plots' horizon plus the latency window before the cursor.
"""

from __future__ import annotations

import gc
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tui.live.store import MIN_PROBES_KEPT, Sample, Store
from tui.model.events import Event, Severity
from tui.model.status import EngineStatus
from tui.record.reader import Recording, Row

SPEEDS = (1, 2, 5, 10, 30, 60)
EXTRA_S = 2.0  # beyond the latency window: the oldest reading it compares with
SAME_NOTICE_S = 1.0  # one incident recorded as two events (a switch result and its alert) is said once
SEVERITIES: dict[object, Severity] = {"information": "information", "warning": "warning", "error": "error"}


@dataclass(frozen=True, slots=True)
class Notice:
    """A notification the live dashboard showed (or, for a crash, the line `enginetop record` printed)."""

    title: str
    message: str
    severity: Severity


def notice_of(event: Event) -> Notice | None:
    """What was said when this event happened, if anything.

    An alert is every warning or error the dashboard notified, as it said it. A failed switch is said as
    the dashboard said it (its alert then is the same notice, said once); a recording made by `enginetop
    record` has the switch result without the alert. A crash: the dashboard showed it in the column (a
    replay does too), `enginetop record` on stderr; a replay also says it, so playing fast does not pass
    it unseen. "failed" engine states follow a failed switch, already said. The end of the dashboard's
    A/B run is said as it was (its verdicts are in the report; sweep levels only there).
    """
    data = event.data
    if event.kind == "alert":
        return Notice(str(data.get("title") or ""), str(data.get("message") or ""),
                      SEVERITIES.get(data.get("severity"), "warning"))
    if event.kind == "switch-result" and data.get("ok") is False:
        return Notice(f"{data.get('to')}: {data.get('failed_step')} failed", str(data.get("message") or ""),
                      "error")
    if event.kind == "engine-state" and data.get("state") == "crashed":
        return Notice(f"{event.source} crashed", str(data.get("message") or ""), "error")
    if event.kind == "ab" and data.get("summary"):  # the dashboard's A/B run ending, as it said it
        return Notice("A/B", str(data["summary"]), "error" if data.get("error") else "information")
    return None


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
        # What the cursor played past that the live dashboard said (alerts, failed switches, crashes), for
        # the app to show and clear. Events a seek rebuilds the store from are not said again: a notice
        # says something happens now, and after a jump the columns already show the state it left.
        self.notices: list[Notice] = []
        self._said: dict[tuple[str, str], float] = {}  # notice -> when it was last said (recording's clock)
        self.now = recording.start if start is None else start  # the cursor, on the recording's clock
        self._fed_to: float | None = None  # rows up to this time are in the store
        self._real: float | None = None  # time.monotonic() of the last advance
        self._probe_sources = recording.sources("probe")
        self._engines = list(dict.fromkeys([*recording.engines, *recording.sources("engine")]))

    @property
    def at_end(self) -> bool:
        return self.rec.end is None or self.now >= self.rec.end

    async def read(self) -> Iterable[Sample]:
        real = time.monotonic()
        if self._real is not None and not self.paused and not self.at_end:
            self.now = min(self.rec.end, self.now + (real - self._real) * self.speed)
        self._real = real
        return self.take()

    def take(self) -> list[Sample]:
        """What the store has not been given yet, up to the cursor. After a seek the store is rebuilt here
        (everything the windows need) and nothing is returned."""
        if self.rec.empty:
            return []
        if self._fed_to is None:
            return self._prime()
        if self.now <= self._fed_to:
            return []
        items = [r for r in self.rec.rows(self._fed_to, self.now) if r.t > self._fed_to]
        self._fed_to = self.now
        return self._split(items, played=True)

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
        row = self.rec.last_event("engine-state", self.now + 1e-9, name)
        if row is None:
            return None
        data = row.item.data
        return EngineStatus(state=data.get("state", "idle"), profile=name, message=data.get("message") or "",
                            exit_code=data.get("exit_code"), log_tail=tuple(data.get("log_tail") or ()))

    def _prime(self) -> list[Sample]:
        self.store.reset()
        self._said.clear()
        for name in self._engines:  # every column keeps its engine, whether or not it polled yet
            self.store.engine(name, self.rec.engines.get(name, ""))
        self.events.clear()
        t0 = self.now - self.store.horizon_s - self.store.latency_window_s - EXTRA_S
        # The probe panel lists the last few probes however old they are.
        old_probes = []
        for name in self._probe_sources:
            old_probes += [r for r in self.rec.last_before("probe", t0, MIN_PROBES_KEPT, name)]
        rows = sorted(old_probes, key=lambda r: r.t)
        self._fed_to = self.now
        # A seek builds some 10^5 objects (samples, bucket tuples, plot points), none in a reference cycle:
        # the garbage collections their number sets off during the build free nothing and took 15 % of
        # the seek (bench/bench_record.py); they run after it instead.
        collecting = gc.isenabled()
        gc.disable()
        try:
            rows += self.rec.rows(t0, self.now, skip=self._unseen(t0))
            # Given here, in one go: the store derives full stats only for each engine's last reading
            self.store.add_many(self._split(rows))
        finally:
            if collecting:
                gc.enable()
        return []

    def _unseen(self, t0: float) -> Callable[[float, str], bool]:
        """Rows from t0 to the cursor that would change nothing the store keeps, so a seek need not decode
        them: host samples before the last (the store keeps only the newest), and GPU reports whose
        throttle points the plots' horizon has dropped (whole throttle buckets before the last report's
        horizon: a report always adds a point, so the newest one sets where the horizon starts)."""
        last_host = self.rec.newest_t("host", t0, self.now)
        last_gpu = self.rec.newest_t("gpu", t0, self.now)
        throttle = self.store.throttle
        first_bucket = None if last_gpu is None else \
            math.floor((last_gpu - throttle.horizon_s) / throttle.bucket_s)

        def skip(t: float, kind: str) -> bool:
            if kind == "host":
                return last_host is not None and t < last_host
            if kind == "gpu":
                return first_bucket is not None and math.floor(t / throttle.bucket_s) < first_bucket
            return False

        return skip

    def _split(self, rows: list[Row], played: bool = False) -> list[Sample]:
        out: list[Sample] = []
        for row in rows:
            if row.item is None:
                continue
            if isinstance(row.item, Event):
                self.events.append(row.item)
                if played:
                    self._say(row.item)
            else:
                out.append(row.item)
        return out

    def _say(self, event: Event) -> None:
        notice = notice_of(event)
        if notice is None:
            return
        key = (notice.title, notice.message)
        last = self._said.get(key)
        if last is None or event.t - last > SAME_NOTICE_S:
            self._said[key] = event.t
            self.notices.append(notice)


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
