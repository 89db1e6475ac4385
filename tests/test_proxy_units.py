"""The proxy's pure parts: events split as they arrive, the usage it asked for taken back, hash ids and
sessions; and what it keeps as the findings' evidence, forgotten when the engine restarts."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from tui.base.process import free_port
from tui.findings.prefix import SharedPrefixes
from tui.model.traffic import RequestRecord
from tui.net.listen import Listen
from tui.proxy.book import TrafficBook
from tui.proxy.prompts import PromptTokens
from tui.proxy.runs import GIVE_UP_AFTER, RunWatch
from tui.proxy.server import Route, TrafficProxy
from tui.proxy.stream import StreamReading, StreamRelay, event_json, generated_text, split_events
from tui.proxy.trace import HashIds, Sessions
from tui.sources.metrics import parse_reading


def ev(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(content=None, finish=None, **extra):
    delta = {} if content is None else {"content": content}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": "x", **extra}


TIMINGS = {"cache_n": 3, "prompt_n": 5, "predicted_n": 2}
USAGE = {"prompt_tokens": 8, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}}


def test_events_split_at_blank_lines_whatever_the_reads():
    stream = ev(chunk("a")) + b": ping\r\n\r\n" + ev(chunk("b")) + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        first, rest = split_events(stream[:cut])
        second, tail = split_events(rest + stream[cut:])
        assert b"".join(first + second) == stream and tail == b""
        assert len(first + second) == 4


def test_not_injected_every_event_passes_byte_for_byte():
    stream = ev(chunk("a")) + ev(chunk(None, "stop", timings=TIMINGS)) + b"data: [DONE]\n\n"
    reading = StreamReading(started=0.0)
    relay = StreamRelay(reading, injected=False)
    out = relay.feed(stream[:7], 1.0) + relay.feed(stream[7:], 2.0) + relay.close()
    assert b"".join(out) == stream
    assert reading.token_times == [2.0] and reading.timings == TIMINGS and reading.usage is None


def test_injected_usage_chunk_is_taken_back_and_timings_return_to_the_finish_chunk():
    # llama.cpp with include_usage puts `timings` on the usage chunk instead of the finish chunk
    engine = (ev(chunk("a")) + ev(chunk(None, "length"))
              + ev({"choices": [], "id": "x", "usage": USAGE, "timings": TIMINGS}) + b"data: [DONE]\n\n")
    reading = StreamReading(started=0.0)
    relay = StreamRelay(reading, injected=True)
    out = b"".join(relay.feed(engine, 1.0) + relay.close())
    expected = ev(chunk("a")) + ev(chunk(None, "length", timings=TIMINGS)) + b"data: [DONE]\n\n"
    assert out == expected
    assert reading.usage == USAGE and reading.timings == TIMINGS


def test_injected_vllm_usage_chunk_drops_its_metrics_and_returns_the_fingerprint():
    engine = (ev(chunk("a")) + ev(chunk(None, "stop"))
              + ev({"choices": [], "id": "x", "usage": USAGE, "system_fingerprint": "fp",
                    "metrics": {"a": 1}})
              + b"data: [DONE]\n\n")
    reading = StreamReading(started=0.0)
    out = StreamRelay(reading, injected=True).feed(engine, 1.0)
    assert [event_json(e) for e in out[:-1]] == [chunk("a"), chunk(None, "stop", system_fingerprint="fp")]
    assert out[-1] == b"data: [DONE]\n\n" and reading.metrics == {"a": 1}


def test_a_finish_chunk_without_a_usage_chunk_after_it_is_sent_unchanged():
    engine = ev(chunk(None, "stop")) + b"data: [DONE]\n\n"
    assert b"".join(StreamRelay(StreamReading(0.0), injected=True).feed(engine, 1.0)) == engine


def test_generated_text_counts_content_reasoning_tool_calls_and_llama_completion():
    assert generated_text(chunk("hi")) == "hi"
    assert generated_text(chunk("")) is None and generated_text(chunk(None, "stop")) is None
    assert generated_text({"choices": [{"delta": {"role": "assistant", "content": None}}]}) is None
    assert generated_text({"choices": [{"delta": {"reasoning_content": "hmm"}}]}) == "hmm"
    call = {"choices": [{"delta": {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}}]}
    assert generated_text(call) == "f{}"
    assert generated_text({"choices": [{"text": "t", "index": 0}]}) == "t"
    assert generated_text({"content": "x", "stop": False}) == "x"


def test_hash_ids_equal_prefixes_share_ids_and_length_follows_input_length():
    ids = HashIds(b"k" * 32, block_size=4)
    a = ids.ids(list(range(10)), 10)
    b = ids.ids([*range(8), 99, 98, 97], 11)
    assert a == [0, 1, 2] and b[:2] == [0, 1] and b[2] != a[2] and len(b) == 3
    assert len(ids.ids(list(range(3)), 9)) == 3  # fewer tokens than input_length: still ceil(9 / 4) ids
    other_key = HashIds(b"j" * 32, block_size=4)
    other_key.ids([5, 5, 5, 5], 4)
    assert other_key.ids(list(range(10)), 10) == [1, 2, 3]  # ids are per trace, handed out on first sight


def test_sessions_follow_a_conversation_and_honour_the_clients_header():
    s = Sessions(b"k" * 32)
    first = [{"role": "user", "content": "hi"}]
    sid, delay = s.assign(first, None, 100.0)
    assert delay is None
    s.finished(sid, first, "hello", 101.0)
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert s.assign(second, None, 103.5) == (sid, 2500.0)
    elsewhere = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "bye"}]
    other, _ = s.assign(elsewhere, None, 104)
    assert other != sid  # a different reply: another conversation
    assert s.assign(first, "client-7", 105.0) == ("client-7", None)


# --- a restart of the engine behind the proxy -------------------------------------------------------------
METRICS = Path(__file__).parent / "data" / "metrics"
RUNNING_BODY = (METRICS / "llamacpp.txt").read_text()  # a long-running llama-server
# a fresh one, after its readiness check
FRESH_BODY = orjson.loads((METRICS / "llamacpp_readiness_sequence.json").read_bytes())["bodies"][
    "after_readiness"]


def ok_record(engine: str = "e", prompt: int = 600) -> RequestRecord:
    return RequestRecord(engine, "/v1/chat/completions", True, 0.0, "ok", 200, prompt_tokens=prompt,
                         completion_tokens=10, cached_tokens=0)


def test_a_new_run_drops_the_books_evidence_and_starts_its_peak_again():
    book = TrafficBook("e")
    with book.flight(), book.flight(), book.flight():
        pass
    seq = book.add(ok_record())
    book.shared(seq, 512)
    assert book.holds_evidence and book.stats().facts.max_in_flight == 3
    with book.flight():
        book.new_run()
        assert book.max_in_flight == 1  # the request in flight now
    facts = book.stats().facts
    assert not book.holds_evidence and facts.requests == 0 and facts.shared_tokens == 0
    assert book.stats().total_requests == 1  # the proxy's own counts are not evidence: they stay
    watch = RunWatch()
    assert watch.unreachable() and not watch.unreachable()  # once: its run is over
    assert not watch.reading(parse_reading(FRESH_BODY))  # back up: its new run began while it was down
    assert not watch.reading(parse_reading(RUNNING_BODY))
    assert watch.reading(parse_reading(FRESH_BODY))  # counters went back: restarted between two reads


async def test_the_proxy_forgets_an_engines_evidence_when_its_counters_go_back_or_it_is_down():
    bodies = [RUNNING_BODY, RUNNING_BODY, FRESH_BODY]
    asked: list[str | None] = []

    def engine(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("Authorization"))
        return httpx.Response(200, text=bodies.pop(0)) if bodies else httpx.Response(404, text="no metrics")

    proxy = TrafficProxy([Route("e", "http://engine", Listen("127.0.0.1", free_port()))])
    proxy._tokens_http = httpx.AsyncClient(transport=httpx.MockTransport(engine))
    proxy.prompts = PromptTokens(_no_tokens, lambda *a: None)
    proxy.prompts.prefixes["e"] = SharedPrefixes()
    book = proxy.books["e"]
    route = proxy.routes[0]
    try:
        book.add(ok_record())
        await proxy.check_run(route)
        await proxy.check_run(route)
        assert book.holds_evidence  # the same run
        await proxy.check_run(route)  # restarted between two checks
        assert not book.holds_evidence and "e" not in proxy.prompts.prefixes
        assert proxy.prompts.run_from["e"] == book.total + 1
        for _ in range(GIVE_UP_AFTER):  # an engine whose /metrics is not readable is asked no more
            await proxy.check_run(route)
        await proxy.check_run(route)
        assert proxy.runs["e"].gave_up and len(asked) == 3 + GIVE_UP_AFTER
    finally:
        await proxy._tokens_http.aclose()
    # and a request it does not accept a connection for: it is down
    dead = TrafficProxy([Route("d", f"http://127.0.0.1:{free_port()}", Listen("127.0.0.1", free_port()))])
    await dead.start()
    try:
        dead.books["d"].add(ok_record("d"))
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(dead.routes[0].proxy_url + "/v1/chat/completions",
                                      json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
        assert reply.status_code == 502 and not dead.books["d"].holds_evidence
    finally:
        await dead.stop()


async def _no_tokens(item: object) -> None:
    return None


def test_how_each_request_ended_in_the_words_of_vllms_finished_reason() -> None:
    """OpenAI answers' finish_reason, llama.cpp's own /completion stop_type, and the proxy's own outcomes
    (a failure "error", a client that left "abort"), counted over the window and since the start."""
    reading = StreamReading(started=0.0)
    reading.take({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}, 1.0)
    assert reading.finish_reason is None
    reading.take({"choices": [{"delta": {}, "finish_reason": "length"}]}, 2.0)
    assert reading.finish_reason == "length"
    for stop_type, reason in (("eos", "stop"), ("word", "stop"), ("limit", "length"), ("none", None)):
        own = StreamReading(started=0.0)
        own.take({"content": "x", "stop": True, "stop_type": stop_type}, 1.0)
        assert own.finish_reason == reason, stop_type
    book = TrafficBook("e")
    base = {"engine": "e", "path": "/v1/chat/completions", "stream": True, "started_wall": 0.0}
    ends = [RequestRecord(**base, outcome="ok", finish_reason="stop", completion_tokens=10, e2e_s=1.0),
            RequestRecord(**base, outcome="ok", finish_reason="length", completion_tokens=30, e2e_s=3.0),
            RequestRecord(**base, outcome="error", status=500),
            RequestRecord(**base, outcome="abandoned", e2e_s=0.5),
            RequestRecord(**base, outcome="ok", completion_tokens=20, e2e_s=2.0),  # no reason given
            # "length" at the max_tokens the client asked: its own cap, not the context's
            RequestRecord(**base, outcome="ok", finish_reason="length", completion_tokens=16, max_tokens=16)]
    for record in ends:
        book.add(record)
    lives = book.stats().per_request
    assert lives is not None and lives.origin == "proxy" and lives.ended == 6
    assert dict(lives.finish_window) == {"stop": 1, "length": 2, "error": 1, "abort": 1, "unknown": 1}
    assert lives.length_unasked == 1  # the one without a max_tokens
    assert lives.gen_len == (19.0, 18.0, 27.0) and lives.e2e_s is not None and lives.e2e_s[0] == 2.0
    assert lives.prefill_s is None  # no engine timings were given: none made up
    book._ended.clear()  # the window emptied; the counts since the start stay
    lives = book.stats().per_request
    assert lives is not None and lives.ended == 0 and lives.finish_window == ()
    assert len(lives.finish_total) == 5
    assert TrafficBook("idle").stats().per_request is None
