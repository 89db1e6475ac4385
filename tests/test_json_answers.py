"""Servers' JSON answers read one way everywhere (tui.sources.json_answers): each field reader accepts what
its name says and nothing more, and a path asked for says why it gave nothing."""

from __future__ import annotations

import asyncio

from tui.sources.json_answers import (
    fetch_json,
    json_object,
    lenient_float,
    lenient_int,
    nonempty_str,
    parse_json,
    strict_int,
)


def test_strict_readers_take_a_field_as_json_has_it() -> None:
    assert strict_int(8192) == 8192 and strict_int(0) == 0
    assert [strict_int(v) for v in (True, 1.5, "8", None, [1])] == [None] * 5
    assert json_object({"a": 1}) == {"a": 1}
    assert [json_object(v) for v in (None, [1], "x", 3)] == [{}] * 4
    assert nonempty_str("q4_K_M") == "q4_K_M"
    assert [nonempty_str(v) for v in ("", None, 7, b"x")] == [None] * 4


def test_lenient_readers_take_a_number_or_its_text() -> None:
    assert [lenient_int(v) for v in (8192, "8192", " 4 ", "-1")] == [8192, 8192, 4, -1]
    assert [lenient_int(v) for v in (True, False, 1.5, "1.5", "", None, "auto", [2])] == [None] * 8
    assert [lenient_float(v) for v in (0.9, "0.9", 2, "1e3")] == [0.9, 0.9, 2.0, 1000.0]
    assert [lenient_float(v) for v in (True, None, "", "high", {"a": 1})] == [None] * 5


def test_parse_json() -> None:
    assert parse_json(b'{"method": "ngram"}') == {"method": "ngram"}
    assert parse_json(b"<html>") is None and parse_json(b"") is None


def test_fetch_json_says_why_a_path_gave_nothing() -> None:
    answers: dict[str, tuple[int, bytes] | Exception] = {
        "/props": (200, b'{"total_slots": 4}'), "/v1/models": (404, b"not found"),
        "/version": (200, b"<html>"), "/health": ValueError("connection refused"),
    }

    async def fetch(path: str) -> tuple[int, bytes]:
        answer = answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def ask() -> tuple[list[object], list[str]]:
        lacks: list[str] = []
        got = [await fetch_json(fetch, path, lacks) for path in answers]
        return got, lacks

    got, lacks = asyncio.run(ask())
    assert got == [{"total_slots": 4}, None, None, None]
    assert lacks == ["/v1/models answered HTTP 404", "/version is not JSON", "/health: connection refused"]
