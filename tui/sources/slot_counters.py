"""A llama-server started without --metrics (its default) still answers /slots: what each slot is doing, and
its task's token counts so far. SlotCounters turns successive /slots readings into the same counters /metrics
would give (generated, prompt, prefilled and cached tokens, requests ended), so the store's rates work
unchanged and the column says where they came from.

What one slot says of its task, as llama-server 2026 gives it (checked against the real server):
- while processing: n_prompt_tokens = the prompt so far + n_decoded; n_prompt_tokens_processed = the prompt
  tokens computed; n_prompt_tokens_cache = those served from the slot's cache; next_token.n_decoded = the
  tokens generated so far.
- once the task ended (is_processing false, the same id_task): n_decoded and n_prompt_tokens_processed read 0,
  and n_prompt_tokens = prompt + generated - 1 (the tokens in the slot's cache), so the generated tokens the
  last poll did not see are recovered from it.
A request's last token shows only in the ended state: while processing, n_decoded stops one short of the end
(checked: 39 of a 40-token request at every reading, 2 ms apart), and under a queue the next request takes the
slot at once. One seen one token from its max_tokens (n_remain 1) ended with that token, whatever it was, and
is counted so. Otherwise a task that ends and is followed by the next one on the same slot between two
readings loses its last tokens, and one that starts and ends between two readings is counted as ended but its
tokens are not: `uncounted` says how many tasks were missed so. tui.sources.slot_watch reads /slots once per
token of the fastest slot while one is busy where requests follow each other at once, so what is lost is about
a token a request, and less often where every end is seen (`seen_ended`) since clients pause between them.

A restart is seen here too, since the counters of a new server must start again (the store then voids the
window, as for /metrics counters that went back): within one run a slot never forgets its last task, a task
never returns to processing once ended nor un-decodes a token, the slots' number and context are fixed, and
task ids only grow. Not strictly per slot (two requests sent at once may be served in the other order:
seen here, one id back), but every request and every reading of /slots takes the next id, so a watched
server is hundreds of ids along within seconds, while a new one starts again from 0: an id less than half
the one last seen, and ID_SLACK lower, is a new run. The caller adds what it knows besides (nothing listened
on the port for a while): `restart()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tui.model.samples import EngineReading
from tui.model.slots import SlotsReading, SlotState

ID_SLACK = 64  # more requests than this sent at once can be served out of their ids' order


@dataclass
class _Task:
    id: int | None
    ended: bool
    decoded: int = 0  # generated tokens counted so far
    computed: int = 0  # prompt tokens computed, counted so far
    prompt: int | None = None  # the prompt's length, once decoding began
    remaining: int | None = None  # next_token.n_remain when last seen: tokens left to its max_tokens


@dataclass
class SlotCounters:
    generated: int = 0
    computed: int = 0
    cached: int = 0
    ended: int = 0
    uncounted: int = 0  # tasks whose last tokens, or all of them, ended between two readings
    # tasks read in their ended state and counted to their last token: every other end (ended - seen_ended)
    # fell between two readings (tui.sources.slot_watch.Pace reads faster after one)
    seen_ended: int = 0
    restarts: int = 0  # runs of the server seen to begin after the first
    # A run seen from its start (after a restart): what its slots hold at the first sight is this run's, and
    # counted; at the very first reading the server's past is not (the window starts there).
    _fresh: bool = False
    _tasks: dict[int, _Task] = field(default_factory=dict)
    _shape: tuple[tuple[int, int | None], ...] | None = None  # (slot id, n_ctx) of this run
    _pending: bool | None = None  # new_run(fresh) said, for the next reading

    def add(self, reading: SlotsReading) -> EngineReading | None:
        """Counters as of this /slots reading (None when it has no slots to read)."""
        if reading.error is not None or not reading.slots:
            return None
        if self._pending is not None:
            self.restart(fresh=self._pending)
        shape = tuple((s.id, s.n_ctx) for s in reading.slots)
        if self._shape is not None and (shape != self._shape or any(map(self._went_back, reading.slots))):
            self.restart()
        self._shape = shape
        for slot in reading.slots:
            self._slot(slot)
        return self.reading(reading)

    @property
    def seen(self) -> bool:
        """A reading of this run was taken."""
        return self._shape is not None

    def reading(self, slots: SlotsReading) -> EngineReading:
        return EngineReading(
            dialect="llamacpp", origin="/slots",
            running=float(sum(s.processing for s in slots.slots)),
            generation_tokens_total=float(self.generated),
            prompt_tokens_computed_total=float(self.computed),
            prompt_tokens_cached_total=float(self.cached),
            prompt_tokens_processed_total=float(self.computed + self.cached),
            requests_finished_total=float(self.ended),
            slots_uncounted_total=float(self.uncounted),
        )

    def new_run(self, fresh: bool) -> None:
        """The caller knows the server began a new run: its counters start again at the next reading, from
        whichever reader it comes (the poll's, or the watch's). `fresh`: no reading of the new run was counted
        yet (nothing listened on the port meanwhile), so what its slots hold then is the new run's; False
        where the new run was seen late (another build in /props) and its readings were counted already."""
        if self.seen:
            self._pending = fresh

    def restart(self, fresh: bool = True) -> None:
        """A new run of the server: its counters start at 0 (the store sees them go back: a reset), and what
        its slots hold at the next reading is counted as this run's (`fresh`) or taken as where it starts."""
        self.generated = self.computed = self.cached = self.ended = self.uncounted = self.seen_ended = 0
        self.restarts += 1
        self._tasks.clear()
        self._shape = None
        self._fresh = fresh
        self._pending = None

    def _went_back(self, slot: SlotState) -> bool:
        """What no slot of one run can do: a new run answers."""
        task = self._tasks.get(slot.id)
        if task is None or task.id is None:
            return False
        if slot.task is None or slot.task < 0:
            return True  # a slot forgets its last task only with its server
        if slot.task < task.id // 2 and slot.task < task.id - ID_SLACK:
            return True
        if slot.task == task.id:  # the same id: the same task, unless it came back to life or un-decoded
            return slot.processing and (task.ended or (slot.decoded or 0) < task.decoded
                                        or (slot.prompt_processed or 0) < task.computed)
        return False

    def _slot(self, slot: SlotState) -> None:
        task = self._tasks.get(slot.id)
        if task is None:
            self._first_sight(slot)
            return
        if slot.processing:
            if slot.task != task.id:
                if not task.ended:  # it ended and this one began between two readings
                    self.ended += 1
                    if task.remaining == 1:
                        self.generated += 1  # a token from its cap: it ended with that token, whatever it was
                    else:
                        self.uncounted += 1
                self.cached += slot.prompt_cached or 0
                task = self._tasks[slot.id] = _Task(slot.task, ended=False)
            self.generated += max(0, (slot.decoded or 0) - task.decoded)
            self.computed += max(0, (slot.prompt_processed or 0) - task.computed)
            task.decoded = max(task.decoded, slot.decoded or 0)
            task.computed = max(task.computed, slot.prompt_processed or 0)
            task.prompt = _prompt(slot) if slot.decoded else task.prompt
            task.remaining = slot.remaining
            return
        if slot.task == task.id and not task.ended:  # it ended since the last reading
            if task.prompt is not None and slot.prompt_tokens is not None:
                self.generated += max(0, slot.prompt_tokens - task.prompt + 1 - task.decoded)
                self.seen_ended += 1
            else:
                self.uncounted += 1  # still in its prefill when last seen: its length is not known
            self.ended += 1
        elif slot.task != task.id and slot.task is not None and slot.task >= 0:
            self.uncounted += 1  # begun and ended between two readings
            self.ended += 1
        self._tasks[slot.id] = _Task(slot.task, ended=True)

    def _first_sight(self, slot: SlotState) -> None:
        """From here on; in a run seen from its start, what the slot did already is counted too."""
        started = slot.task is not None and slot.task >= 0
        if not slot.processing:
            if self._fresh and started:
                self.uncounted += 1  # it ran and ended before this run was first read
                self.ended += 1
            self._tasks[slot.id] = _Task(slot.task if started else None, ended=True)
            return
        task = self._tasks[slot.id] = _Task(slot.task, ended=False, decoded=slot.decoded or 0,
                                            computed=slot.prompt_processed or 0, prompt=_prompt(slot))
        if self._fresh:
            self.generated += task.decoded
            self.computed += task.computed
            self.cached += slot.prompt_cached or 0


def _prompt(slot: SlotState) -> int | None:
    """The task's prompt length while it decodes: the tokens in the slot less those it generated."""
    if slot.prompt_tokens is None or slot.decoded is None:
        return None
    return slot.prompt_tokens - slot.decoded


@dataclass
class RunningTokens:
    """llama-server with --metrics: `llamacpp:tokens_predicted_total` moves only when a request ends, so a
    long generation reads 0 tok/s and then a spike. The tokens its running requests generated so far (/slots'
    n_decoded, read after /metrics) are added to it: the figure moves while the engine generates.

    /slots is read after /metrics, so a request that ended between the two is in neither for one poll (a dip
    of its tokens) and never in both; the total is held at its last value through such a dip and catches up
    at the next poll, when the counter has it. A counter that went back (a restart) starts again from it."""

    _last: tuple[float, float] | None = None  # (the engine's counter, the total given) at the last poll

    def add(self, reading: EngineReading, slots: SlotsReading | None) -> EngineReading:
        counter = reading.generation_tokens_total
        if counter is None:
            self._last = None
            return reading
        running = 0 if slots is None or slots.error is not None else \
            sum(s.decoded or 0 for s in slots.slots if s.processing)
        total = counter + running
        if self._last is not None and counter >= self._last[0]:
            total = max(total, self._last[1])  # never below what was given: no false restart
        self._last = (counter, total)
        if total == counter:  # nothing ahead of the counter: the reading as it came (an idle server's /slots
            return reading   # are not asked again while its /metrics reads the same)
        return replace(reading, generation_tokens_total=total, generation_in_progress=total - counter)
