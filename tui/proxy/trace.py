"""The replayable trace the proxy keeps: one JSON line per finished request in the Mooncake form that AIPerf's
`mooncake_trace` loader reads (timestamp ms from the trace start, input_length and output_length from the
engine's usage, hash_ids, session_id, delay), and beside it, in FILE.meta.json, what a replay needs to know
about the lines (block size, whose tokenizer made the ids, the engines, the hash key's id).

hash_ids are chained, keyed hashes (blake2b with the trace key) of blocks of the prompt's tokens, as the
engine itself tokenises the prompt with its chat template applied, remapped to consecutive integers on first
sight: equal prefixes give equal ids, and nobody without the key can test a guessed text against them. The
prompt is
tokenised off the request's path, after the reply has been relayed. Prompt text is written only with
`capture_content`, and then to FILE.content.jsonl, never into the trace's lines.

Sessions: a request whose messages extend an earlier request's messages plus that request's reply continues
its session (an agent loop); `delay` is the time from that reply's end to this request. A client's own
session header (X-Session-ID, X-Correlation-ID) wins when present.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tui.base.defaults import BLOCK_SIZE
from tui.model.traffic import RequestRecord

SESSION_HEADERS = ("x-session-id", "x-correlation-id")
KEY_FILE_NAME = "trace-key"


def load_key(path: Path) -> bytes:
    """The trace hash key, made once (0600) so traces written later share ids with earlier ones."""
    if path.exists():
        return bytes.fromhex(path.read_text().strip())
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex())
    return key


def key_id(key: bytes) -> str:
    """A name for the key that does not reveal it: which traces' ids can be compared with which."""
    return hashlib.blake2b(b"enginetop trace key id", key=key, digest_size=8).hexdigest()


def _digest(key: bytes, parent: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(parent + data, key=key, digest_size=16).digest()


def message_text(message: Any) -> str:
    """A chat message as sessions compare it: its role, its text, and any tool calls' names and arguments
    (as the proxy reads them back from a streamed reply)."""
    if not isinstance(message, dict):
        return str(message)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    calls = "".join(str((c.get("function") or {}).get("name") or "") + str((c.get("function") or {}).get(
        "arguments") or "") for c in message.get("tool_calls") or () if isinstance(c, dict))
    return f"{message.get('role')}\x00{content or ''}{calls}"


class HashIds:
    """Block hashes to consecutive integers, shared by every request of one trace."""

    def __init__(self, key: bytes, block_size: int = BLOCK_SIZE) -> None:
        self.key = key
        self.block_size = block_size
        self._ids: dict[bytes, int] = {}

    def ids(self, tokens: list[int], input_length: int) -> list[int]:
        """ceil(input_length / block) ids: the format's rule, whatever the tokeniser said. Tokens beyond
        input_length are not hashed; blocks the tokens do not reach are hashed as this request's own."""
        count = math.ceil(input_length / self.block_size)
        tokens = tokens[:input_length]
        parent = b""
        out = []
        for i in range(count):
            block = tokens[i * self.block_size:(i + 1) * self.block_size]
            data = array("q", block).tobytes() if block else b"missing" + os.urandom(8)
            parent = _digest(self.key, parent, data)
            out.append(self._ids.setdefault(parent, len(self._ids)))
        return out


class Sessions:
    """Which earlier turn a request continues. Keeps the last `max_kept` turns."""

    def __init__(self, key: bytes, max_kept: int = 10_000) -> None:
        self.key = key
        self.max_kept = max_kept
        self._turns: OrderedDict[bytes, tuple[str, float]] = OrderedDict()  # conversation -> (session, end)
        self._count = 0

    def _prefixes(self, messages: list[Any]) -> list[bytes]:
        out, parent = [], b""
        for message in messages:
            parent = _digest(self.key, parent, message_text(message).encode())
            out.append(parent)
        return out

    def assign(self, messages: list[Any], header: str | None,
               started_wall: float) -> tuple[str, float | None]:
        """(session id, delay in ms since the turn it continues ended, or None for a first turn)."""
        for digest in reversed(self._prefixes(messages)):
            found = self._turns.get(digest)
            if found is not None:
                session, ended = found
                return header or session, max(0.0, (started_wall - ended) * 1000.0)
        if header:
            return header, None
        self._count += 1
        return f"s{self._count}", None

    def finished(self, session: str, messages: list[Any], reply: str, ended_wall: float) -> None:
        conversation = [*messages, {"role": "assistant", "content": reply}]
        self._turns[self._prefixes(conversation)[-1]] = (session, ended_wall)
        while len(self._turns) > self.max_kept:
            self._turns.popitem(last=False)


@dataclass
class TraceItem:
    """A finished request, as the trace writer needs it. `auth` is used for the engine's tokenize call
    only, and never written."""

    record: RequestRecord
    upstream: str
    path: str
    request: dict[str, Any]
    session: str | None
    delay_ms: float | None
    auth: str | None = None
    reply: str = ""  # kept only with capture_content
    seq: int = 0  # the request's number in its engine's book (TrafficBook.add), for its shared prefix


@dataclass(frozen=True)
class TraceMeta:
    block_size: int
    tokenizer: str
    engines: dict[str, str]  # name -> URL
    key_id: str
    started_wall: float
    format: str = "mooncake_trace"
    hash: str = "blake2b-128 keyed, chained over blocks of the engine's prompt tokens"

    def write(self, path: Path) -> None:
        path.write_bytes(orjson.dumps(self.__dict__, option=orjson.OPT_INDENT_2))


def meta_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".meta.json")


def content_path(trace: Path) -> Path:
    return trace.with_name(trace.name + ".content.jsonl")


class TraceWriter:
    """Writes a line per finished request, given its prompt's tokens (tui.proxy.prompts tokenises it, off the
    request's path)."""

    def __init__(self, path: Path, key: bytes, engines: dict[str, str], block_size: int = BLOCK_SIZE,
                 capture_content: bool = False) -> None:
        self.path = path
        self.key = key
        self.engines = engines
        self.block_size = block_size
        self.capture_content = capture_content
        self.hash_ids = HashIds(key, block_size)
        self.sessions = Sessions(key)
        self.started_wall: float | None = None
        self.written = 0
        self.failures: list[str] = []  # why a request could not be traced, newest last (bounded)
        self._file: Any = None
        self._content: Any = None

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._content = content_path(self.path).open("ab") if self.capture_content else None

    def session(self, request: dict[str, Any], header: str | None, started_wall: float, reply: str,
                ended_wall: float) -> tuple[str | None, float | None]:
        """The session a request that just ended belongs to, and its delay (ms) after the turn it continues;
        its reply is remembered so that the next turn is recognised. Cheap (a hash per message), so it is
        done as the request ends, and the record carries its session."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return header, None
        session, delay = self.sessions.assign(messages, header, started_wall)
        self.sessions.finished(session, messages, reply, ended_wall)
        return session, delay

    def submitted(self, item: TraceItem) -> None:
        """A request will be traced: the meta file is written with the first one."""
        if self.started_wall is None:
            self.started_wall = item.record.started_wall
            TraceMeta(self.block_size, self._tokenizer_name(), self.engines, key_id(self.key),
                      self.started_wall).write(meta_path(self.path))

    def _tokenizer_name(self) -> str:
        names = ", ".join(f"{n} ({u})" for n, u in self.engines.items())
        return f"the engine's own: /apply-template + /tokenize (llama.cpp) or /tokenize (vLLM) on {names}"

    def failed(self, why: str) -> None:
        self.failures = [*self.failures[-99:], why]

    def write(self, item: TraceItem, tokens: list[int] | None) -> None:
        """Its line, from the prompt's tokens as the engine made them (None: the engine did not say)."""
        record = item.record
        if record.prompt_tokens is None or record.completion_tokens is None:
            self.failed(f"{record.engine} {item.path}: the engine gave no usage, so no lengths to trace")
            return
        if tokens is None:
            self.failed(f"{record.engine} {item.path}: the engine could not tokenise the prompt")
            tokens = []
        assert self.started_wall is not None and self._file is not None
        line: dict[str, Any] = {
            "timestamp": round((record.started_wall - self.started_wall) * 1000.0),
            "input_length": record.prompt_tokens,
            "output_length": record.completion_tokens,
            "hash_ids": self.hash_ids.ids(tokens, record.prompt_tokens),
        }
        if item.session is not None:
            line["session_id"] = item.session
        if item.delay_ms is not None:
            line["delay"] = round(item.delay_ms)
        self._file.write(orjson.dumps(line) + b"\n")
        self._file.flush()
        if self._content is not None:
            content = {"line": self.written, "reply": item.reply}
            for key in ("messages", "prompt", "tools"):
                if key in item.request:
                    content[key] = item.request[key]
            self._content.write(orjson.dumps(content) + b"\n")
            self._content.flush()
        self.written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._content is not None:
            self._content.close()
        self._file = self._content = None
