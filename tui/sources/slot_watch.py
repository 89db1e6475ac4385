"""While a llama-server without --metrics is busy, its /slots read several times a second instead of once a
poll, so that a request's end is seen (tui.sources.slot_counters counts the tokens from the readings).

Why: a request's last tokens show in /slots only while its slot stands ended, from its last token until the
next request takes the slot, which under a queue is the few milliseconds the client takes to send it. Read
once a second, a slot reused in between loses every token its request made since the last reading (a fifth of
them at one slot under back-to-back load); read once per token the slot generates, it loses half a token per
request on average. llama-server answers /slots at once, between its decode steps too (checked: ~3 ms apart
back to back on the demo model, while it generated 14 tok/s), so the pace is set here: one reading per token
of the fastest slot (its rate measured from the readings themselves), never more often than MIN_GAP_S nor less
often than MAX_GAP_S. After the last busy reading it goes on at LINGER_GAP_S for LINGER_S, so that a request
arriving after a think time is seen running rather than only ended; then the poll's own pace takes over.
A reading costs ~0.17 ms of CPU here (4 slots: HTTP on a kept connection, JSON, the counters).

Reading once per token is needed only where a slot is taken again at once (a queue, a client sending its next
request as soon as the answer came). Where clients think between requests, a slot stands ended for that
while, and is seen so read far less often (Pace): once `needed` ends in a row were read and counted to their
last token (SlotCounters.seen_ended), the watch reads at half the shortest stretch a slot was lately seen busy
or ended (from its first to its last reading in that state: never longer than it was), 100 to 500 ms apart
(MAX_GAP_S to RELAXED_MAX_GAP_S), lingering too. Any other end (one that fell between two readings, a task
begun and ended between them, one whose tokens could not all be counted) loses at most the tokens of one gap,
puts the watch back to once per token, and, if it was relaxed, doubles the ends it needs in a row to relax
again (3 at first, 64 at most). One request shorter than any stretch seen, begun and ended between two
relaxed readings after its slot was read ended, is lost unseen (Pace says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

from tui.model.slots import SlotsReading
from tui.sources.slot_counters import SlotCounters

MIN_GAP_S = 0.02  # 50 readings a second at most: a slot at 100 tok/s loses a token a request on average
MAX_GAP_S = 0.1
LINGER_S = 10.0
LINGER_GAP_S = 0.1  # a request lasts longer than this (its prefill and first token), so it is seen running
RELAX_AFTER = 3  # ends seen in a row before the watch relaxes its pace (Pace), at first
MAX_RELAX_AFTER = 64  # ... and at most, after ends missed while relaxed
RELAXED_MAX_GAP_S = 0.5
STRETCHES = 8  # the last stretches a slot was seen busy or ended, for the relaxed pace
# The watch stops when no poll has taken its readings for this many of the source's intervals (a paused
# dashboard, a source no longer read): it runs only for a poller that uses it.
UNREAD_INTERVALS = 3.0


def gap_s(before: SlotsReading | None, before_t: float, now: SlotsReading, now_t: float) -> float:
    """How long to wait before the next reading: a token of the fastest slot between two readings, or the
    linger pace when none is busy."""
    if not any(s.processing for s in now.slots):
        return LINGER_GAP_S
    fastest = 0.0
    if before is not None and now_t > before_t:
        was = {s.id: s for s in before.slots}
        for slot in now.slots:
            old = was.get(slot.id)
            if slot.processing and old is not None and old.processing and old.task == slot.task:
                fastest = max(fastest, ((slot.decoded or 0) - (old.decoded or 0)) / (now_t - before_t))
    if fastest <= 0:
        return MIN_GAP_S  # not decoding yet, or no rate yet: the next token may be the last
    return min(MAX_GAP_S, max(MIN_GAP_S, 1.0 / fastest))


def _tally(counters: SlotCounters) -> tuple[int, int, int]:
    """What Pace compares between two readings: the server's run, its ends, and those read to the last."""
    return counters.restarts, counters.ended, counters.seen_ended


class Pace:
    """Whether requests follow each other at once on a slot: the ends read and counted to their last token in
    a row since the last other end (SlotCounters' own tally: an end between two readings, a task begun and
    ended between them, one whose prompt was never read, one recovered from its max_tokens). Relaxed, the
    watch reads at half the shortest stretch a slot was seen busy or ended lately (so neither a request nor
    the pause after one falls between two readings), between MAX_GAP_S and RELAXED_MAX_GAP_S.

    What no reading can tell: after a slot was read ended, a request that began and ended before the next
    request took the slot, all between two readings (shorter than any stretch seen, so not guarded by the
    pace), leaves no trace in /slots (task ids are taken by every request and every reading, on every
    slot): its tokens are lost and it is not counted as missed."""

    def __init__(self) -> None:
        self.seen_in_a_row = 0
        self.needed = RELAX_AFTER
        self._mark: tuple[int, int, int] | None = None  # the counters' (restarts, ended, seen_ended) noted
        # slot -> (task, processing, first and last reading in that state)
        self._since: dict[int, tuple[int | None, bool, float, float]] = {}
        self._stretches: deque[float] = deque(maxlen=STRETCHES)

    def resume(self, counters: SlotCounters) -> None:
        """The watch runs again from the counters as they stand: what the poll counted meanwhile is not the
        watch's to judge, every end its own readings count is."""
        self._mark = _tally(counters)

    def note(self, counters: SlotCounters, now: SlotsReading, now_t: float) -> None:
        mark = _tally(counters)
        if self._mark is not None and self._mark[0] != mark[0]:
            # a new run of the server: a new tally, and its slots' states are not the old run's
            self.seen_in_a_row = 0
            self._since.clear()
        elif self._mark is not None:
            ended, seen = mark[1] - self._mark[1], mark[2] - self._mark[2]
            if ended > seen:
                if self.relaxed:
                    self.needed = min(MAX_RELAX_AFTER, self.needed * 2)
                self.seen_in_a_row = 0
            else:
                self.seen_in_a_row += seen
        self._mark = mark
        for slot in now.slots:
            since = self._since.get(slot.id)
            if since is not None and since[:2] == (slot.task, slot.processing):
                self._since[slot.id] = (*since[:3], now_t)
                continue
            if since is not None:
                self._stretches.append(since[3] - since[2])  # it was in that state at least this long
            self._since[slot.id] = (slot.task, slot.processing, now_t, now_t)

    @property
    def relaxed(self) -> bool:
        return self.seen_in_a_row >= self.needed

    def relaxed_gap_s(self) -> float:
        shortest = min(self._stretches, default=0.0)
        return min(RELAXED_MAX_GAP_S, max(MAX_GAP_S, shortest / 2))

    def gap_s(self, counters: SlotCounters, before: SlotsReading | None, before_t: float,
              now: SlotsReading, now_t: float) -> float:
        self.note(counters, now, now_t)
        if self.relaxed:
            return self.relaxed_gap_s()
        return gap_s(before, before_t, now, now_t)


class SlotWatch:
    """Asks `ask()` at the pace Pace sets while a slot is processing and for LINGER_S after, counts each
    reading in `counters` (in the order they came, from one request at a time), and stops by itself then, on
    an error, or when its readings are no longer asked for (`touch` is the poller's call at each poll)."""

    def __init__(self, ask: Callable[[], Awaitable[SlotsReading | None]], counters: SlotCounters,
                 interval_s: Callable[[], float]) -> None:
        self._ask = ask
        self._counters = counters
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._touched = time.monotonic()
        self.latest: SlotsReading | None = None  # the last reading taken
        self.asked = 0  # readings taken since the watch was made (a figure for the bench and tests)
        self.pace = Pace()  # kept across the watch's runs: a workload's habit outlives a pause in it

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def touch(self) -> None:
        self._touched = time.monotonic()

    def start(self, counted: SlotsReading) -> None:
        """Watch from `counted` on, the reading the poll took (and counted) last: until the watch's own first
        reading comes, the poll is given that one and never asks /slots beside the watch (two readings in
        flight at once could be counted in the other order)."""
        if not self.running:
            self.touch()
            self.latest = counted
            self._task = asyncio.create_task(self._run(), name="slot watch")

    async def _run(self) -> None:
        before: SlotsReading | None = None
        before_t = busy_t = time.monotonic()
        self.pace.resume(self._counters)
        while time.monotonic() - self._touched < UNREAD_INTERVALS * self._interval_s():
            asked = time.monotonic()
            reading = await self._ask()
            if reading is None or reading.error is not None:
                return  # the poll says what went wrong, and asks again itself
            self._counters.add(reading)
            self.latest = reading
            self.asked += 1
            wait = self.pace.gap_s(self._counters, before, before_t, reading, asked)  # judged, even the last
            before, before_t = reading, asked
            if any(s.processing for s in reading.slots):
                busy_t = asked
            elif asked - busy_t > LINGER_S:
                return
            await asyncio.sleep(max(0.0, wait - (time.monotonic() - asked)))

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
