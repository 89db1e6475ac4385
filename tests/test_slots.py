"""llama-server's slots: parsed from the real shapes (this build's, and an older server's without the prompt
counts), polled beside /metrics on the real llama-server while it generates and not asked again while it
stays idle, drawn in the engine's column with the KV estimate named as one, recorded and replayed like every
other sample; --no-slots says so."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_llama
from tests.screen import screen_text
from tests.test_dashboard import make_app, wait_for
from tests.waiting import until_async
from tui.base.process import stop_group
from tui.live.store import Store
from tui.model.samples import EngineSample
from tui.model.slots import SlotsReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.record.codec import decode, encode
from tui.sources import engine_source
from tui.sources.engine import poll_engine
from tui.sources.engine_source import EngineSource
from tui.sources.slots import parse_slots
from widgets.engine_panel import render_engine

DATA = Path(__file__).parent / "data" / "slots"

SLOTS_OFF = "/slots is off: start llama-server without --no-slots to see each slot"


def test_the_slots_of_this_build_and_of_an_older_server():
    now = parse_slots(200, (DATA / "llamacpp_2026.json").read_bytes())
    busy, idle = now.slots
    got = (busy.id, busy.processing, busy.prompt_tokens, busy.prompt_cached, busy.decoded, busy.remaining)
    assert got == (0, True, 100, 1, 12, 52)
    assert (idle.processing, idle.prompt_tokens, idle.decoded) == (False, 25, 1)
    # n_prompt_tokens already counts the decoded tokens (llama-server 2026): held = n_prompt_tokens
    assert now.kv_estimate == pytest.approx((100 + 25) / (2 * 4096))
    old = parse_slots(200, (DATA / "llamacpp_2025.json").read_bytes())
    first = old.slots[0]
    assert first.decoded == 12 and first.prompt_tokens is None and first.prompt_cached is None
    assert old.kv_estimate is None  # no prompt counts: no estimate, rather than a wrong one
    refused = b'{"error":{"code":501,"message":"This server does not support slots endpoint."}}'
    assert parse_slots(501, refused).error == SLOTS_OFF
    assert "not JSON" in (parse_slots(200, b"<html>").error or "")


def test_slots_are_drawn_with_the_kv_estimate_named_and_recorded_whole():
    reading = parse_slots(200, (DATA / "llamacpp_2026.json").read_bytes())
    sample = EngineSample("llama", "http://x", 1.0, 2.0, "up", model="gemma", slots=reading)
    assert decode(EngineSample, encode(sample)) == sample  # a recording keeps them, a replay shows them
    store = Store()
    store.add(sample)
    text = render_engine(store.engines["llama"]).plain
    assert "slot 0" in text and "slot 1" in text and "KV (estimate)" in text
    assert "prefill" not in text and "decoding 12, 52 left" in text and "1 cached" in text
    off = EngineSample("llama", "http://x", 1.0, 2.0, "up", slots=SlotsReading(error="slots are off"))
    store.add(off)
    assert "slots are off" in render_engine(store.engines["llama"]).plain


@pytest.mark.engine
async def test_the_real_llama_servers_slots_while_it_generates(llama_server, tmp_path):
    target = EngineTarget("llama", llama_server.url)
    transports = Transports()
    body = {"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 400,
            "ignore_eos": True}
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            url = llama_server.url + "/v1/chat/completions"
            generating = asyncio.ensure_future(client.post(url, json=body))

            async def busy() -> SlotsReading | None:
                sample = await poll_engine(transports.for_url(target.url), target)
                slots = sample.slots
                working = slots is not None and any(x.processing and (x.decoded or 0) > 2
                                                    for x in slots.slots)
                return slots if working else None

            found = None
            for _ in range(100):
                if (found := await busy()) is not None:
                    break
                await asyncio.sleep(0.1)
            assert found is not None and len(found.slots) == 4  # --parallel 4
            slot = next(s for s in found.slots if s.processing)
            assert slot.prompt_tokens and slot.remaining is not None and slot.n_ctx
            assert found.kv_estimate is not None and 0 < found.kv_estimate < 1
            app = make_app([target], tmp_path)
            async with app.run_test(size=(180, 60)) as pilot:
                await wait_for(pilot, lambda: "slot 3" in screen_text(app), what="the slot rows")
            generating.cancel()
    finally:
        await transports.aclose()


async def test_an_idle_servers_slots_are_not_asked_again_until_a_request_runs_or_a_while_passes(
        llama_server, monkeypatch, caplog):
    """The slots of an idle llama-server cannot change while its /metrics reads the same (no request ran), but
    for an erased or restored slot cache, which moves no counter: given again, asked at least every few s."""
    source = EngineSource(EngineTarget("llama", llama_server.url), Transports())
    asked: list[str] = []

    async def poll() -> tuple[EngineSample, bool]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tui.http"):  # the poller's log of every GET it sends
            [sample] = await source.read()
        # "GET http://host:port/path: HTTP 200"
        asked[:] = [r.getMessage().split()[1].removeprefix(llama_server.url)[:-1] for r in caplog.records]
        return sample, "/slots" in asked

    try:
        async def idle() -> tuple[EngineSample, bool] | None:
            sample, read = await poll()
            return (sample, read) if not any(s.processing for s in sample.slots.slots) else None

        # the engine is shared: an earlier test's abandoned generation may still be running
        first, read = await until_async(idle, "the llama-server idle", timeout=60, every=0.2)
        assert read  # the slots that found it idle were read
        again, read = await poll()
        assert not read and again.slots is first.slots and again.reading == first.reading
        assert asked == ["/metrics"]  # a healthy idle llama-server: one request a poll

        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(llama_server.url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 3})
            assert r.status_code == 200
        after, read = await poll()  # a request ran: the counters moved, the slots are read at once
        assert read and after.reading != first.reading
        tasks = lambda sample: {s.task for s in sample.slots.slots}  # noqa: E731
        assert tasks(after) != tasks(first)  # the slot that served it shows its new task

        async with httpx.AsyncClient(timeout=120) as client:  # a slot processing: read every poll
            generating = asyncio.ensure_future(client.post(llama_server.url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 150,
                "ignore_eos": True}))

            async def processing() -> bool:
                busy, read = await poll()
                return read and any(s.processing for s in busy.slots.slots)

            await until_async(processing, "a poll that reads a slot processing")
            assert await processing()  # and the next poll reads the slots again
            assert (await generating).status_code == 200
        done, read = await poll()  # the request ended since: read once more, every slot idle
        assert read and not any(s.processing for s in done.slots.slots)
        still, read = await poll()
        assert not read and still.slots is done.slots  # idle again: given again...
        monkeypatch.setattr(engine_source, "IDLE_SLOTS_REFRESH_S", 0.3)
        await asyncio.sleep(0.4)
        _, read = await poll()
        assert read  # ...but asked again once the refresh interval has passed
    finally:
        await source.aclose()
        await source.transports.aclose()


@pytest.mark.engine
async def test_a_server_without_slots_says_so_and_the_rest_is_shown(tmp_path):
    engine = start_llama("noslots", "--no-slots")
    try:
        target = EngineTarget("noslots", engine.url)
        transports = Transports()
        sample = await poll_engine(transports.for_url(target.url), target)
        await transports.aclose()
        assert sample.health == "up" and sample.reading is not None
        assert sample.slots == SlotsReading(error=SLOTS_OFF)
    finally:
        stop_group(engine.launched)
