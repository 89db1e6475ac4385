"""A llama-server started without --metrics (its default) still answers /slots: what each slot is doing, and
its task's token counts so far. SlotCounters turns successive /slots readings into the same counters /metrics
would give (generated, prompt, prefilled and cached tokens, requests ended), counted from the first reading
on, so the store's rates work unchanged and the column says where they came from.

What one slot says of its task, as llama-server 2026 gives it (checked against the real server):
- while processing: n_prompt_tokens = the prompt so far + n_decoded; n_prompt_tokens_processed = the prompt
  tokens computed; n_prompt_tokens_cache = those served from the slot's cache; next_token.n_decoded = the
  tokens generated so far.
- once the task ended (is_processing false, the same id_task): n_decoded and n_prompt_tokens_processed read 0,
  and n_prompt_tokens = prompt + generated - 1 (the tokens in the slot's cache), so the generated tokens the
  last poll did not see are recovered from it.
A task that ends and is followed by the next one on the same slot between two polls loses its last tokens;
one that starts and ends between two polls is counted as ended but its tokens are not: `uncounted` says how
many were missed, and polling more often while slots are busy keeps it small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tui.model.samples import EngineReading
from tui.model.slots import SlotsReading, SlotState


@dataclass
class _Task:
    id: int | None
    ended: bool
    decoded: int = 0  # generated tokens counted so far
    computed: int = 0  # prompt tokens computed, counted so far
    prompt: int | None = None  # the prompt's length, once decoding began


@dataclass
class SlotCounters:
    generated: int = 0
    computed: int = 0
    cached: int = 0
    ended: int = 0
    uncounted: int = 0  # tasks whose last tokens, or all of them, ended between two polls
    _tasks: dict[int, _Task] = field(default_factory=dict)

    def add(self, reading: SlotsReading) -> EngineReading | None:
        """Counters as of this /slots reading (None when it has no slots to read)."""
        if reading.error is not None or not reading.slots:
            return None
        for slot in reading.slots:
            self._slot(slot)
        return EngineReading(
            dialect="llamacpp", origin="/slots",
            running=float(sum(s.processing for s in reading.slots)),
            generation_tokens_total=float(self.generated),
            prompt_tokens_computed_total=float(self.computed),
            prompt_tokens_cached_total=float(self.cached),
            prompt_tokens_processed_total=float(self.computed + self.cached),
            requests_finished_total=float(self.ended),
        )

    def _slot(self, slot: SlotState) -> None:
        task = self._tasks.get(slot.id)
        if task is None:  # the first sight: from here on, nothing before it
            self._tasks[slot.id] = _Task(slot.task, ended=not slot.processing, decoded=slot.decoded or 0,
                                         computed=slot.prompt_processed or 0, prompt=_prompt(slot))
            return
        if slot.processing:
            if slot.task != task.id:
                if not task.ended:
                    self.uncounted += 1  # it ended and this one began between two polls
                    self.ended += 1
                self.cached += slot.prompt_cached or 0
                task = self._tasks[slot.id] = _Task(slot.task, ended=False)
            self.generated += max(0, (slot.decoded or 0) - task.decoded)
            self.computed += max(0, (slot.prompt_processed or 0) - task.computed)
            task.decoded = max(task.decoded, slot.decoded or 0)
            task.computed = max(task.computed, slot.prompt_processed or 0)
            task.prompt = _prompt(slot) if slot.decoded else task.prompt
            return
        if slot.task == task.id and not task.ended:  # it ended since the last poll
            if task.prompt is not None and slot.prompt_tokens is not None:
                self.generated += max(0, slot.prompt_tokens - task.prompt + 1 - task.decoded)
            else:
                self.uncounted += 1  # still in its prefill when last seen: its length is not known
            self.ended += 1
        elif slot.task != task.id and slot.task is not None:
            self.uncounted += 1  # begun and ended between two polls
            self.ended += 1
        self._tasks[slot.id] = _Task(slot.task, ended=True)


def _prompt(slot: SlotState) -> int | None:
    """The task's prompt length while it decodes: the tokens in the slot less those it generated."""
    if slot.prompt_tokens is None or slot.decoded is None:
        return None
    return slot.prompt_tokens - slot.decoded
