"""The proxy's pure parts: events split as they arrive, the usage it asked for taken back, hash ids and
sessions."""

from __future__ import annotations

import orjson

from tui.proxy.stream import StreamReading, StreamRelay, event_json, generated_text, split_events
from tui.proxy.trace import HashIds, Sessions


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
