"""Servers' JSON answers: asking for one (a path that fails says so in the reader's list of what it lacks),
and reading its fields, each reader's name saying how much it accepts: a field as JSON has it (`strict_int`,
`json_object`, `nonempty_str`), or a number that may be given as its text too (`lenient_int`,
`lenient_float`: a label's value, a command line's option, a server that quotes its numbers)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]  # GET path -> (status, body); raises ValueError


def parse_json(body: bytes) -> Any:
    """The body's JSON value; None where it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return None


async def fetch_json(fetch: Fetch, path: str, lacks: list[str]) -> Any:
    """GET `path`'s JSON value; None, with why appended to `lacks`, where it fails, answers other than 200
    or is not JSON."""
    try:
        status, body = await fetch(path)
    except ValueError as exc:
        lacks.append(f"{path}: {exc}")
        return None
    if status != 200:
        lacks.append(f"{path} answered HTTP {status}")
        return None
    try:
        return json.loads(body)
    except ValueError:
        lacks.append(f"{path} is not JSON")
        return None


def json_object(value: Any) -> dict[str, Any]:
    """A JSON object as it is; an empty one for anything else (missing, null, a list)."""
    return value if isinstance(value, dict) else {}


def strict_int(value: Any) -> int | None:
    """A JSON integer as it is; None for anything else (true, 1.5, "8")."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def nonempty_str(value: Any) -> str | None:
    """A JSON string with something in it; None for "" and anything else."""
    return value if isinstance(value, str) and value else None


def lenient_int(value: Any) -> int | None:
    """An integer, given as one or as its text ("8192", " 4 "); None for true/false, 1.5, "1.5" and anything
    else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def lenient_float(value: Any) -> float | None:
    """A number, given as one or as its text ("0.9"); None for true/false and anything else."""
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
