"""SlotCounters and RunningTokens on /slots readings shaped as llama-server 2026 gives them (tests/data/slots:
the real server's answer; the real server under load is tests/test_slots_under_load.py): a restart seen from
the slots alone starts the counters again, so the store says so and voids the window; a run seen from its
start counts what its slots already did; --metrics' counter gets the running requests' tokens without ever
going back."""

from __future__ import annotations

import dataclasses

import pytest

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


def test_the_watch_reads_once_per_token_of_the_fastest_slot_within_its_bounds():
    from tui.sources.slot_watch import LINGER_GAP_S, MAX_GAP_S, MIN_GAP_S, gap_s

    before = slots(busy(5, 10), busy(6, 10, slot=1))
    # slot 1 went 10 -> 15 tokens in 0.5 s: 10 tok/s, a reading every 0.1 s
    assert gap_s(before, 0.0, slots(busy(5, 12), busy(6, 15, slot=1)), 0.5) == 0.1
    # 200 tok/s: never more often than MIN_GAP_S; 2 tok/s: never less often than MAX_GAP_S
    assert gap_s(before, 0.0, slots(busy(5, 110), busy(6, 10, slot=1)), 0.5) == MIN_GAP_S
    assert gap_s(before, 0.0, slots(busy(5, 11), busy(6, 10, slot=1)), 0.5) == MAX_GAP_S
    # a new task on the slot, or none yet: no rate, so as often as allowed (its next token may be its last)
    assert gap_s(before, 0.0, slots(busy(9, 3), busy(6, 10, slot=1)), 0.5) == MIN_GAP_S
    assert gap_s(None, 0.0, before, 0.5) == MIN_GAP_S
    # every slot idle: the linger's pace
    assert gap_s(before, 0.0, slots(ended(5, 12), ended(6, 15, slot=1)), 0.5) == LINGER_GAP_S


def test_the_watch_relaxes_its_pace_while_every_end_is_counted_and_reads_once_per_token_after_a_miss():
    from tui.sources.slot_watch import (
        MAX_GAP_S,
        MAX_RELAX_AFTER,
        MIN_GAP_S,
        RELAX_AFTER,
        RELAXED_MAX_GAP_S,
        Pace,
    )

    counters, pace = SlotCounters(), Pace()
    t = 0.0
    before = slots(ended(0, 5))

    def read(now: SlotsReading, after: float = 0.05) -> float:
        """One reading of the watch: counted, then paced (as SlotWatch does)."""
        nonlocal t, before
        t += after
        counters.add(now)
        gap = pace.gap_s(counters, before, t - after, now, t)
        before = now
        return gap

    def think(first: int, requests: int) -> None:
        """Clients that think: every slot read ended (for 0.6 s) before its next task takes it (1 s busy)."""
        for task in range(first, first + requests):
            read(slots(busy(task, 2)), after=0.6)
            read(slots(busy(task, 30)), after=1.0)
            read(slots(ended(task, 31)), after=0.05)

    read(before)
    # back to back: each task is followed by the next between two readings, its end never read
    for task in range(1, 6):
        read(slots(busy(task, 1)))
        assert read(slots(busy(task, 40))) == MIN_GAP_S  # the next token may be the last
    assert not pace.relaxed and counters.ended == 4 and counters.seen_ended == 0
    think(10, RELAX_AFTER - 1)
    assert not pace.relaxed
    think(20, 1)
    assert pace.relaxed and pace.seen_in_a_row == RELAX_AFTER
    # relaxed: half the shortest stretch lately seen, from its first reading to its last in that state
    # (ended from 0.05 s to 0.05 s: never less than MAX_GAP_S), however fast the slot generates
    assert read(slots(busy(21, 2)), after=0.6) == MAX_GAP_S
    assert read(slots(busy(21, 400))) == MAX_GAP_S
    # task 21 ended and task 22 took the slot between two readings: an end missed, once per token again, and
    # twice the ends needed in a row to relax
    assert read(slots(busy(22, 1))) == MIN_GAP_S
    assert not pace.relaxed and pace.needed == 2 * RELAX_AFTER
    # a task read ended, then another read ended (the whole of a request between two readings): a miss
    think(30, 2 * RELAX_AFTER)
    assert pace.relaxed
    read(slots(ended(40, 9)), after=0.3)
    assert not pace.relaxed and pace.needed == 4 * RELAX_AFTER
    # an end read whose prompt was never seen (still in its prefill when last read): its tokens are not all
    # counted, so it is no end seen
    think(50, 4 * RELAX_AFTER)
    assert pace.relaxed
    read(SlotsReading((dataclasses.replace(busy(70, 0), prompt_tokens=None),)), after=0.6)
    read(slots(ended(70, 3)))
    assert counters.uncounted and not pace.relaxed and pace.needed == 8 * RELAX_AFTER
    # a new run of the server is a new tally: its first ends are not misses of the old one's, nor seen ones
    pace.needed = pace.seen_in_a_row = 1
    read(slots(ended(3, 2)))  # an id far back: a restart, counted as the new run's (uncounted) end
    assert counters.restarts == 1 and not pace.relaxed and pace.needed == 1
    read(slots(busy(4, 2)), after=0.6)
    read(slots(ended(4, 3)))
    assert pace.relaxed
    # the ends needed never grow past MAX_RELAX_AFTER
    pace.needed = pace.seen_in_a_row = MAX_RELAX_AFTER
    read(slots(busy(4, 1)))
    read(slots(ended(5, 1)))
    assert pace.needed == MAX_RELAX_AFTER and not pace.relaxed

    # the stretches are lower bounds: 0.8 s seen busy (0.1 to 0.9) and 0.4 s seen ended give 0.2 s
    steady = Pace()
    for state, at in ((busy(1, 1), 0.1), (busy(1, 9), 0.9), (ended(1, 10), 1.0), (ended(1, 10), 1.4),
                      (busy(2, 1), 1.5)):
        steady.note(counters, slots(state), at)
    steady.seen_in_a_row = RELAX_AFTER
    assert steady.relaxed_gap_s() == pytest.approx(0.2)
    # after long stretches, never less often than RELAXED_MAX_GAP_S
    slow = Pace()
    for k in range(6):
        slow.note(counters, slots(busy(k // 2, 3) if k % 2 else ended(k // 2, 3)), k * 5.0)
        slow.note(counters, slots(busy(k // 2, 3) if k % 2 else ended(k // 2, 3)), k * 5.0 + 4.0)
    assert slow.relaxed_gap_s() == RELAXED_MAX_GAP_S


def test_the_watch_judges_its_first_reading_and_its_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of the watch that reads once, as it leaves (its linger over): a task begun and ended since the
    poll's reading is a miss even so, and the watch relaxed no longer."""
    import asyncio

    from tui.sources import slot_watch

    monkeypatch.setattr(slot_watch, "LINGER_S", 0.0)
    counters = SlotCounters()
    counted = slots(ended(1, 3))
    counters.add(counted)  # the poll's reading
    answers = [slots(ended(5, 2))]

    async def ask() -> SlotsReading | None:
        return answers.pop(0) if answers else None

    async def run() -> slot_watch.SlotWatch:
        watch = slot_watch.SlotWatch(ask, counters, lambda: 1.0)
        watch.pace.needed = watch.pace.seen_in_a_row = slot_watch.RELAX_AFTER
        watch.start(counted)
        assert watch._task is not None
        await watch._task
        return watch

    watch = asyncio.run(run())
    assert (watch.asked, counters.ended, counters.uncounted) == (1, 1, 1)
    assert not watch.pace.relaxed and watch.pace.needed == 2 * slot_watch.RELAX_AFTER


def test_the_column_says_what_the_slots_missed_and_a_counter_that_moves_only_at_the_end():
    from tui.live.provenance import COUNTER_ONLY, counter_only, generation_note, missed_note

    counted = EngineReading("llamacpp", generation_tokens_total=10.0, origin="/slots",
                            slots_uncounted_total=2)
    sample = EngineSample("e", "http://e", 1.0, 1.0, "up", reading=counted, slots=slots(busy(1, 3)))
    assert missed_note(counted) == ("2 requests ended between two readings of /slots: their last tokens are "
                                    "not counted")
    assert generation_note(sample) == ("figures from /slots: --metrics adds waiting, decode time and totals"
                                       f" · {missed_note(counted)}")
    metrics = EngineReading("llamacpp", generation_tokens_total=10.0)
    off = EngineSample("e", "http://e", 1.0, 1.0, "up", reading=metrics,
                       slots=SlotsReading(error="/slots is off: start llama-server without --no-slots"))
    assert counter_only(off) and generation_note(off) == COUNTER_ONLY
    read = EngineSample("e", "http://e", 1.0, 1.0, "up", reading=metrics, slots=slots(busy(1, 3)))
    assert not counter_only(read) and generation_note(read) is None


def test_tokens_per_busy_second_leave_out_the_tokens_counted_ahead_of_llama_cpps_counter():
    """llama.cpp's busy seconds move only when a request ends: the running requests' tokens, counted ahead,
    are not divided by seconds that do not hold them yet."""
    from tui.sources.rates import derive

    before = EngineReading("llamacpp", generation_tokens_total=150.0, generation_seconds_total=10.0,
                           generation_in_progress=50.0)
    after = EngineReading("llamacpp", generation_tokens_total=400.0, generation_seconds_total=12.5,
                          generation_in_progress=150.0)
    stats = derive(before, 0.0, after, 5.0)
    assert stats.gen_tps == 50.0  # every token generated in the window, running or ended
    # the counter's own (100 -> 250): the ended requests' tokens over their 2.5 s, not 250 over them
    assert stats.decode_tps_busy == (250.0 - 100.0) / 2.5


class _Stand:
    """llama-server without --metrics as enginetop reads it, on a real loopback socket, its answers set by the
    test: /health, /v1/models, /metrics (501, as llama-server answers without --metrics), /slots, /props."""

    def __init__(self, port: int = 0) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stand = self
        self.slots: list[dict] = [{"id": 0, "n_ctx": 4096, "is_processing": False}]
        self.build = "b7000-aaaa"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                status, body = 200, {"status": "ok"}
                if path == "/v1/models":
                    body = {"object": "list", "data": [{"id": "m.gguf", "object": "model"}]}
                elif path == "/metrics":
                    status, body = 501, {"error": {"code": 501, "message": "This server does not support "
                                                   "metrics endpoint.", "type": "not_supported_error"}}
                elif path == "/slots":
                    body = stand.slots
                elif path == "/props":
                    body = {"build_info": stand.build, "model_path": "/m/m.gguf", "total_slots": 1,
                            "default_generation_settings": {"n_ctx": 4096}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def busy(self, task: int, decoded: int) -> None:
        self.slots = [{"id": 0, "n_ctx": 4096, "is_processing": True, "id_task": task,
                       "n_prompt_tokens": 20 + decoded, "n_prompt_tokens_processed": 20,
                       "n_prompt_tokens_cache": 0, "next_token": [{"n_decoded": decoded, "n_remain": -1}]}]


def test_a_port_that_refused_or_another_build_starts_the_slots_counters_again(monkeypatch):
    """What the slots alone cannot show (the new run's task ids already past the old ones): nothing listened
    on the port between two readings, or /props names another build when the configuration is read again."""
    import asyncio

    from tui.model.targets import EngineTarget
    from tui.net.keepalive import Transports
    from tui.sources import engine_source
    from tui.sources.engine_source import EngineSource

    monkeypatch.setattr(engine_source, "CONFIG_REFRESH_S", 0.0)  # /props read at every poll

    async def run() -> list[float | None]:
        stand = _Stand()
        transports = Transports()
        source = EngineSource(EngineTarget("s", f"http://127.0.0.1:{stand.port}"), transports)
        totals: list[float | None] = []

        async def poll() -> None:
            await asyncio.sleep(0.3)  # a poll a while after the engine's state changed: the watch read it
            [sample] = await source.read()
            totals.append(sample.reading.generation_tokens_total if sample.reading else None)

        try:
            stand.busy(100, 5)
            await poll()
            stand.busy(100, 30)
            await poll()  # 25 counted
            port = stand.port
            stand.close()  # killed: nothing listens
            await poll()
            stand = _Stand(port)  # a new run whose task (200) is past the old one's id
            stand.busy(200, 7)
            await poll()  # a new run: counted from 0, its 7 tokens its own
            stand.busy(200, 9)
            await poll()
            stand.build = "b7001-bbbb"  # the same port, another build (a restart between two polls)
            stand.busy(300, 4)
            await poll()  # /props is read after the counting: the next reading starts again
            await poll()  # from there (task 300's 4 tokens were counted as the old run's already)
            stand.busy(300, 10)
            await poll()
            stand.close()
        finally:
            await source.aclose()
            await transports.aclose()
        return totals

    totals = asyncio.run(run())
    assert totals == [0.0, 25.0, None, 7.0, 9.0, 9.0 + 4.0, 0.0, 6.0]


def test_a_request_seen_one_token_from_its_cap_ended_with_that_token():
    """Under a queue the next request takes the slot at once and the ended state is never seen; one seen with
    a token left to its max_tokens (n_remain 1) generated that token (EOS or not) and is not missed."""
    counters = SlotCounters()
    last = SlotState(0, 4096, True, task=7, prompt_tokens=59, prompt_processed=20, prompt_cached=0,
                     decoded=39, remaining=1)
    counters.add(slots(busy(7, 30)))
    counters.add(SlotsReading((last,)))
    made = counters.add(slots(busy(9, 2)))
    assert made is not None and made.generation_tokens_total == (39 - 30) + 1 + 2
    assert made.slots_uncounted_total == 0 and made.requests_finished_total == 1
    # two tokens left when last seen: it may have stopped at either, so it is said as missed
    counters = SlotCounters()
    counters.add(SlotsReading((dataclasses.replace(last, decoded=38, remaining=2),)))
    made = counters.add(slots(busy(9, 2)))
    assert made is not None and made.generation_tokens_total == 2 and made.slots_uncounted_total == 1
