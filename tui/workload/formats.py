"""Workload files, in the formats users already have, recognised from their content (or named, `kind:PATH`):

  enginetop      the proxy's trace (tui.proxy.trace): Mooncake lines, with FILE.meta.json beside them
  mooncake       Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids), and AIPerf's
                 `mooncake_trace`, its superset (text_input or messages instead of lengths, delay,
                 session_id, extra)
  aiperf-single  AIPerf `single_turn` JSONL: text or texts, timestamp or delay, output_length, session_id
  aiperf-multi   AIPerf `multi_turn` JSONL: session_id and turns, each like a single_turn line
  azure          Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens
  burstgpt       BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens (0: failed, skipped)...
  sharegpt       ShareGPT JSON: a list of {"id", "conversations": [{"from", "value"}, ...]}
  vllm-custom    vLLM's custom JSONL: {"prompt", "output_tokens"}

A file that is none of these, or a line that is malformed, raises WorkloadError naming the file, the line and
the field. The facts behind each format are in ../shared/reference/workload.md.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from tui.model.workload import Workload, WorkloadRequest
from tui.proxy.trace import meta_path  # where the proxy puts a trace's metadata

MOONCAKE_BLOCK = 512  # the convention AIPerf, GuideLLM and vLLM assume for Mooncake hash ids
KINDS = ("enginetop", "mooncake", "aiperf-single", "aiperf-multi", "azure", "burstgpt", "sharegpt",
         "vllm-custom")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


class WorkloadError(ValueError):
    """A workload file that cannot be read: the message names the file, line and field."""


def load_workload(spec: str | Path) -> Workload:
    """`PATH` (the format recognised from the content) or `KIND:PATH`."""
    text = str(spec)
    kind, sep, rest = text.partition(":")
    if sep and kind in KINDS:
        path, named = Path(rest), kind
    else:
        path, named = Path(text), None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read the workload: {exc.strerror or exc}") from None
    kind = named or detect(path, data)
    return READERS[kind](path, data)


def detect(path: Path, data: bytes) -> str:
    head = data.lstrip()[:1]
    if head == b"[":
        return "sharegpt"
    if head == b"{":
        first = _first_json(path, data)
        keys = set(first)
        if "turns" in keys:
            return "aiperf-multi"
        if keys & {"text", "texts"}:
            return "aiperf-single"
        if "prompt" in keys:
            return "vllm-custom"
        if keys & {"input_length", "text_input", "messages", "hash_ids"}:
            return "enginetop" if meta_path(path).exists() else "mooncake"
        raise WorkloadError(f"{path}:1: a JSON line with fields {sorted(keys)}, which no workload format "
                            f"enginetop reads has; {_formats()}")
    header = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    columns = {c.strip() for c in header.split(",")}
    if set(AZURE_COLUMNS) <= columns:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= columns:
        return "burstgpt"
    raise WorkloadError(f"{path}: not a workload format enginetop reads; {_formats()}")


def _formats() -> str:
    return ("expected an enginetop or Mooncake trace, AIPerf single_turn / multi_turn / mooncake_trace "
            "JSONL, an Azure or BurstGPT CSV, ShareGPT JSON or vLLM custom JSONL (or name it: KIND:PATH, "
            f"KIND one of {', '.join(KINDS)})")


# --- JSON lines ---------------------------------------------------------------------------------------------
def _lines(path: Path, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def _first_json(path: Path, data: bytes) -> dict[str, Any]:
    for _, obj in _lines(path, data):
        return obj
    raise WorkloadError(f"{path}: empty")


class _Line:
    """One record's fields, each checked as it is read, errors naming where."""

    def __init__(self, path: Path, n: int, obj: dict[str, Any]) -> None:
        self.path, self.n, self.obj = path, n, obj

    def fail(self, field: str, why: str) -> WorkloadError:
        return WorkloadError(f"{self.path}:{self.n}: field {field!r}: {why}")

    def count(self, field: str, *, required: bool = False, minimum: int = 0) -> int | None:
        value = self.obj.get(field)
        if value is None:
            if required:
                raise self.fail(field, "missing")
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise self.fail(field, f"expected a whole number, got {value!r}")
        if value < minimum:
            raise self.fail(field, f"expected at least {minimum}, got {value}")
        return int(value)

    def ms(self, field: str) -> float | None:
        value = self.obj.get(field)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < 0:
            raise self.fail(field, f"expected milliseconds (a number >= 0), got {value!r}")
        return float(value)

    def text(self, field: str) -> str | None:
        value = self.obj.get(field)
        if value is not None and not isinstance(value, str):
            raise self.fail(field, f"expected text, got {type(value).__name__}")
        return value

    def session(self) -> str | None:
        value = self.obj.get("session_id")
        return None if value is None else str(value)

    def extra(self) -> dict[str, Any]:
        value = self.obj.get("extra") or {}
        if not isinstance(value, dict):
            raise self.fail("extra", "expected an object (merged into the request body)")
        return value


def _mooncake_line(line: _Line, block: int) -> WorkloadRequest:
    obj = line.obj
    modes = [k for k in ("input_length", "text_input", "messages") if obj.get(k) is not None]
    if len(modes) != 1:
        raise line.fail("input_length", "exactly one of input_length, text_input, messages is needed, got "
                        + (", ".join(modes) or "none"))
    input_length = line.count("input_length", minimum=1)
    hash_ids = obj.get("hash_ids")
    if hash_ids is not None:
        if input_length is None:
            raise line.fail("hash_ids", "hash ids need input_length (AIPerf's rule)")
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                      for h in hash_ids):
            raise line.fail("hash_ids", "expected a list of integers")
        last = input_length - (len(hash_ids) - 1) * block
        if not 0 < last <= block:
            raise line.fail("hash_ids", f"{len(hash_ids)} ids of {block}-token blocks cannot hold "
                            f"{input_length} tokens (need ceil({input_length}/{block}) = "
                            f"{math.ceil(input_length / block)})")
    messages = obj.get("messages")
    if messages is not None and (not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and "role" in m for m in messages)):
        raise line.fail("messages", "expected a non-empty list of chat messages, each with a role")
    timestamp, delay = line.ms("timestamp"), line.ms("delay")
    return WorkloadRequest(
        line=line.n, timestamp_ms=timestamp, delay_ms=delay, session_id=line.session(),
        input_length=input_length, output_length=line.count("output_length", minimum=1),
        hash_ids=tuple(hash_ids) if hash_ids is not None else None, prompt=line.text("text_input"),
        messages=tuple(messages) if messages is not None else None, extra=line.extra())


def read_mooncake(path: Path, data: bytes, block: int = MOONCAKE_BLOCK, kind: str = "mooncake",
                  tokenizer: str | None = None) -> Workload:
    requests = tuple(_mooncake_line(_Line(path, n, obj), block) for n, obj in _lines(path, data))
    return _checked(Workload(str(path), kind, requests, block_size=block, tokenizer=tokenizer))


def read_enginetop(path: Path, data: bytes) -> Workload:
    meta_file = meta_path(path)
    try:
        meta = orjson.loads(meta_file.read_bytes())
        block = int(meta["block_size"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{meta_file}: the trace's metadata cannot be read ({exc}); without it the "
                            f"block size is unknown (read the trace as mooncake:{path} for 512)") from None
    return read_mooncake(path, data, block, "enginetop", meta.get("tokenizer"))


def _turn(line: _Line, session: str | None) -> list[WorkloadRequest]:
    texts = line.obj.get("texts")
    if texts is not None:
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise line.fail("texts", "expected a non-empty list of texts")
    else:
        text = line.text("text")
        if text is None:
            raise line.fail("text", "missing (a turn needs text or texts)")
        texts = [text]
    timestamp, delay = line.ms("timestamp"), line.ms("delay")
    if timestamp is not None and delay is not None:
        raise line.fail("delay", "timestamp and delay cannot both be set (AIPerf's rule)")
    role = line.text("role") or "user"
    return [WorkloadRequest(line=line.n, timestamp_ms=timestamp, delay_ms=delay, session_id=session,
                            output_length=line.count("output_length", minimum=1), prompt=text,
                            messages=({"role": role, "content": text},), extra=line.extra())
            for text in texts]


def read_aiperf_single(path: Path, data: bytes) -> Workload:
    requests: list[WorkloadRequest] = []
    for n, obj in _lines(path, data):
        line = _Line(path, n, obj)
        requests += _turn(line, line.session())
    return _checked(Workload(str(path), "aiperf-single", tuple(requests)))


def read_aiperf_multi(path: Path, data: bytes) -> Workload:
    requests: list[WorkloadRequest] = []
    for n, obj in _lines(path, data):
        line = _Line(path, n, obj)
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns:
            raise line.fail("turns", "expected a non-empty list of turns")
        session = line.session() or f"line-{n}"
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise line.fail(f"turns[{i}]", "expected an object")
            requests += _turn(_Line(path, n, turn), session)
    return _checked(Workload(str(path), "aiperf-multi", tuple(requests)))


def read_vllm_custom(path: Path, data: bytes) -> Workload:
    requests = []
    for n, obj in _lines(path, data):
        line = _Line(path, n, obj)
        prompt = line.text("prompt")
        if not prompt:
            raise line.fail("prompt", "missing or empty")
        requests.append(WorkloadRequest(line=n, prompt=prompt,
                                        output_length=line.count("output_tokens", required=True, minimum=1)))
    return _checked(Workload(str(path), "vllm-custom", tuple(requests)))


def read_sharegpt(path: Path, data: bytes) -> Workload:
    try:
        conversations = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WorkloadError(f"{path}: not JSON ({exc})") from None
    if not isinstance(conversations, list):
        raise WorkloadError(f"{path}: expected a JSON list of conversations")
    requests = []
    for i, conv in enumerate(conversations):
        where = f"{path}: conversation {i}"
        if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
            raise WorkloadError(f"{where}: field 'conversations': expected a list of turns")
        session = str(conv.get("id", i))
        for j, turn in enumerate(conv["conversations"]):
            if not isinstance(turn, dict) or turn.get("from") not in ("human", "gpt", "system", "user",
                                                                       "assistant", "tool", "function"):
                raise WorkloadError(f"{where}: field 'conversations[{j}].from': expected human or gpt")
            if not isinstance(turn.get("value"), str):
                raise WorkloadError(f"{where}: field 'conversations[{j}].value': expected text")
            if turn["from"] in ("human", "user"):
                requests.append(WorkloadRequest(line=i + 1, session_id=session, prompt=turn["value"],
                                                messages=({"role": "user", "content": turn["value"]},)))
    return _checked(Workload(str(path), "sharegpt", tuple(requests)))


# --- CSV ----------------------------------------------------------------------------------------------------
def _rows(path: Path, data: bytes, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig", "replace")))
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise WorkloadError(f"{path}:1: missing column(s) {', '.join(missing)}")
    for row in reader:
        yield reader.line_num, {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}


def _number(path: Path, n: int, row: dict[str, str], column: str, whole: bool = True) -> float:
    try:
        value = float(row[column])
    except (KeyError, ValueError):
        got = row.get(column)
        raise WorkloadError(f"{path}:{n}: field {column!r}: expected a number, got {got!r}") from None
    if not math.isfinite(value) or value < 0 or (whole and value != int(value)):
        raise WorkloadError(f"{path}:{n}: field {column!r}: expected a "
                            f"{'whole ' if whole else ''}number >= 0, got {row[column]!r}")
    return value


def _azure_time(path: Path, n: int, text: str) -> float:
    """`2023-11-16 18:15:46.6805900`: seven fractional digits, more than datetime parses."""
    base, _, fraction = text.partition(".")
    try:
        seconds = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").timestamp()
        return seconds + (float(f"0.{fraction}") if fraction else 0.0)
    except ValueError:
        raise WorkloadError(f"{path}:{n}: field 'TIMESTAMP': expected e.g. 2023-11-16 18:15:46.6805900, "
                            f"got {text!r}") from None


def read_azure(path: Path, data: bytes) -> Workload:
    rows = []
    for n, row in _rows(path, data, AZURE_COLUMNS):
        t = _azure_time(path, n, row["TIMESTAMP"])
        rows.append((n, t, int(_number(path, n, row, "ContextTokens")),
                     int(_number(path, n, row, "GeneratedTokens"))))
    t0 = min((t for _, t, _, _ in rows), default=0.0)
    requests = tuple(WorkloadRequest(line=n, timestamp_ms=(t - t0) * 1000.0, input_length=i or None,
                                     output_length=o or None) for n, t, i, o in rows)
    return _checked(Workload(str(path), "azure", requests))


def read_burstgpt(path: Path, data: bytes) -> Workload:
    requests, skipped = [], 0
    t0: float | None = None
    for n, row in _rows(path, data, BURSTGPT_COLUMNS):
        t = _number(path, n, row, "Timestamp", whole=False)
        t0 = t if t0 is None else min(t0, t)
        out = int(_number(path, n, row, "Response tokens"))
        if out == 0:  # a failed request in the original service
            skipped += 1
            continue
        requests.append((n, t, int(_number(path, n, row, "Request tokens")), out))
    return _checked(Workload(str(path), "burstgpt", tuple(
        WorkloadRequest(line=n, timestamp_ms=(t - (t0 or 0.0)) * 1000.0, input_length=i or None,
                        output_length=o) for n, t, i, o in requests), skipped=skipped))


def _checked(workload: Workload) -> Workload:
    if not workload.requests:
        raise WorkloadError(f"{workload.path}: no requests in it")
    return workload


READERS: dict[str, Callable[[Path, bytes], Workload]] = {
    "enginetop": read_enginetop, "mooncake": read_mooncake, "aiperf-single": read_aiperf_single,
    "aiperf-multi": read_aiperf_multi, "azure": read_azure, "burstgpt": read_burstgpt,
    "sharegpt": read_sharegpt, "vllm-custom": read_vllm_custom,
}
