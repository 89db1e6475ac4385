"""SlotCounters and RunningTokens on /slots readings shaped as llama-server 2026 gives them (tests/data/slots:
the real server's answer; the real server under load is tests/test_slots_under_load.py): a restart seen from
the slots alone starts the counters again, so the store says so and voids the window; a run seen from its
start counts what its slots already did; --metrics' counter gets the running requests' tokens without ever
going back."""

from __future__ import annotations

from tui.live.store import Store
from tui.model.samples import EngineReading, EngineSample
from tui.model.slots import SlotsReading, SlotState
from tui.sources.slot_counters import RunningTokens, SlotCounters


def busy(task: int, decoded: int, prompt: int = 20, slot: int = 0, n_ctx: int = 4096) -> SlotState:
    return SlotState(slot, n_ctx, True, task=task, prompt_tokens=prompt + decoded, prompt_processed=prompt,
                     prompt_cached=0, decoded=decoded)


def ended(task: int, generated: int, prompt: int = 20, slot: int = 0, n_ctx: int = 4096) -> SlotState:
    return SlotState(slot, n_ctx, False, task=task, prompt_tokens=prompt + generated - 1, prompt_processed=0,
                     prompt_cached=0, decoded=0)


def slots(*states: SlotState) -> SlotsReading:
    return SlotsReading(tuple(states))


def test_a_restart_seen_from_the_slots_starts_the_counters_again_and_the_store_says_so():
    counters = SlotCounters()
    store = Store()
    t = 0.0

    def add(reading: SlotsReading) -> EngineReading:
        nonlocal t
        made = counters.add(reading)
        assert made is not None
        t += 1.0
        store.add(EngineSample("e", "http://e", t, t, "up", reading=made, slots=reading))
        return made

    add(slots(busy(400, 5)))  # the first sight: the window starts here
    add(slots(busy(400, 25)))
    made = add(slots(ended(400, 30)))
    assert (made.generation_tokens_total, made.requests_finished_total) == (25, 1)
    assert not store.engines["e"].stats.counter_reset
    # killed and started again between two polls: task ids begin anew, far below the one last seen (every
    # request and every reading of /slots takes one); what the new run's slot did already is its own
    made = add(slots(busy(3, 7)))
    assert counters.restarts == 1 and made.generation_tokens_total == 7
    assert store.engines["e"].stats.counter_reset  # "counters reset: engine restarted"
    # a new run that reuses the id last seen (ids restart at 0 and climb): a task cannot come back to life
    counters = SlotCounters()
    counters.add(slots(busy(3, 10)))
    counters.add(slots(ended(3, 12)))
    made = counters.add(slots(busy(3, 4)))
    assert counters.restarts == 1 and made is not None and made.generation_tokens_total == 4
    # nor un-decode tokens
    counters = SlotCounters()
    counters.add(slots(busy(8, 10)))
    made = counters.add(slots(busy(8, 2)))
    assert counters.restarts == 1 and made is not None and made.generation_tokens_total == 2
    # a slot that had a task and has none now, or slots of another number or context: a new run, idle
    for before, after in ((slots(ended(9, 4)), slots(SlotState(0, 4096, False))),
                          (slots(ended(9, 4)), slots(ended(9, 4), ended(9, 4, slot=1))),
                          (slots(ended(9, 4)), slots(ended(9, 4, n_ctx=8192)))):
        counters = SlotCounters()
        counters.add(before)
        counters.add(after)
        assert counters.restarts == 1, after


def test_nothing_a_running_server_does_reads_as_a_restart():
    # two requests sent at once, served in the other order: the slot's next task has the lower id
    counters = SlotCounters()
    for reading in (slots(busy(41, 3)), slots(ended(41, 9)), slots(busy(40, 2)), slots(ended(40, 5))):
        counters.add(reading)
    assert counters.restarts == 0 and counters.generated == 6 + 5
    counters = SlotCounters()
    for reading in (slots(busy(1, 1), SlotState(1, 4096, False)), slots(busy(1, 9), busy(2, 1, slot=1)),
                    slots(ended(1, 12), busy(2, 6, slot=1)), slots(busy(7, 3), ended(2, 10, slot=1)),
                    slots(ended(7, 3), ended(2, 10, slot=1))):
        counters.add(reading)
    assert counters.restarts == 0
    # the first sight counts from there (task 1 from its 1st token: 11 more); tasks 2 (10) and 7 (3) whole;
    # every end was seen, so nothing is uncounted
    assert (counters.generated, counters.ended, counters.uncounted) == (11 + 10 + 3, 3, 0)


def test_a_slot_reused_between_two_readings_is_said_as_missed():
    counters = SlotCounters()
    counters.add(slots(busy(1, 5)))
    made = counters.add(slots(busy(4, 2)))  # task 1 ended and task 4 began between the two
    assert made is not None and made.slots_uncounted_total == 1 and made.requests_finished_total == 1


def test_running_tokens_move_with_the_generation_and_never_go_back():
    running = RunningTokens()

    def add(counter: float, *states: SlotState, error: str | None = None) -> float:
        reading = running.add(EngineReading("llamacpp", generation_tokens_total=counter),
                              SlotsReading(tuple(states), error))
        assert reading.generation_tokens_total is not None
        return reading.generation_tokens_total

    assert add(100, busy(5, 10)) == 110
    assert add(100, busy(5, 150)) == 250  # a long generation moves while it runs
    assert add(100, ended(5, 400)) == 250  # it ended after /metrics was read: held, not a dip
    assert add(500, SlotState(0, 4096, False, task=5)) == 500  # the counter has it now
    idle = EngineReading("llamacpp", generation_tokens_total=500)
    assert running.add(idle, slots(SlotState(0, 4096, False, task=5))) is idle  # nothing ahead: as it came
    assert add(500, busy(9, 3), error="/slots answered HTTP 503") == 500  # unreadable: the counter alone
    assert add(10, busy(2, 4)) == 14  # the counter went back: a restart, from its new value
