"""The recorder: a Store listener that hands every item to a writer thread, which commits in batches.

The listener only puts the (immutable) item on a queue, so the UI loop never waits for encoding, the
disk or a lock. The thread commits at least every FLUSH_S seconds in WAL mode: a `kill -9` loses at most
the items of the last batch, and the file opens afterwards. Any write failure (disk full, the file gone)
stops the recording and is kept in `error` for whoever shows it; the dashboard itself goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import zstandard

from tui.model.events import Event, ProbeEvent
from tui.record.codec import KIND_OF, encode, scrub
from tui.record.retention import Retention, prune
from tui.record.schema import DDL, SCHEMA_VERSION

log = logging.getLogger(__name__)

FLUSH_S = 1.0  # kill -9 loses at most this much, plus what is on its way to the disk
TRAIN_AT = (300, 3000)  # rows after which a dictionary is trained (again, if the first try failed)
DICT_BYTES = 16 * 1024
LEVEL = 3


class Recorder:
    def __init__(self, path: Path, engines: dict[str, str] | None = None, secrets: tuple[str, ...] = (),
                 meta: dict[str, str] | None = None, retention: Retention | None = None,
                 on_delete: Callable[[Path], None] | None = None) -> None:
        """retention: old recordings in its folder are pruned every `every_s` while this one is written
        (never this one), each deleted file told to on_delete (from the writer thread)."""
        self.path = Path(path)
        self.retention = retention
        self.on_delete = on_delete
        self.secrets = tuple(s for s in secrets if s)
        self.error: str | None = None  # why recording stopped, for the subtitle and stderr
        self.rows = 0  # committed
        self.last_wall: float | None = None  # of the newest committed row
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._stop = threading.Event()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Opened here so that a path that cannot be written is said at once, not in a thread.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(DDL)
        info = {"schema_version": str(SCHEMA_VERSION), "created_wall": repr(time.time()),
                "mono_to_wall": repr(time.time() - time.monotonic()), "host": socket.gethostname(),
                "engines": json.dumps({k: scrub(v, self.secrets) for k, v in (engines or {}).items()}),
                **(meta or {})}
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", info.items())
        self._db.execute("COMMIT")
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    # ---- the UI side: never blocks ----------------------------------------------------------
    def __call__(self, item: Any) -> None:
        if self.error is None and not self._closed:
            self._queue.put((item, time.time() - time.monotonic()))

    def event(self, kind: str, source: str | None, data: dict[str, Any], t: float | None = None) -> None:
        now = time.monotonic() if t is None else t
        self(Event(kind, source, now, time.time() - time.monotonic() + now, data))

    def close(self) -> None:
        """Write what is queued, mark the file closed, fold the WAL back into it (one file to copy)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join()
        if self.error is None:
            try:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('closed_wall', ?)",
                                 (repr(time.time()),))
                self._db.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error as exc:
                self.error = f"closing the recording failed: {exc}"
        self._db.close()

    # ---- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        self._zstd = zstandard.ZstdCompressor(level=LEVEL)
        self._dict_id: int | None = None
        self._training: list[bytes] = []
        # Woken once a batch, not once an item: a dashboard makes about six items a second, and a thread
        # switch for each is work that buys nothing (bench/bench_app.py, recording on).
        next_prune = time.monotonic() + (self.retention.every_s if self.retention else 0.0)
        while True:
            stopping = self._stop.wait(FLUSH_S)
            if self.retention is not None and not stopping and time.monotonic() >= next_prune:
                next_prune = time.monotonic() + self.retention.every_s
                self._prune()
            pending: list[tuple[Any, ...]] = []
            while True:
                try:
                    got = self._queue.get_nowait()
                except queue.Empty:
                    break
                if self.error is None:
                    try:
                        pending.append(self._row(*got))
                    except Exception as exc:  # a bug in encoding: lose this item, say so, keep recording
                        log.exception("recording an item failed: %r", exc)
            self._commit(pending)
            if stopping:
                return

    def _prune(self) -> None:
        """The periodic retention pass: here, off the UI loop, and never the file being written."""
        r = self.retention
        assert r is not None
        try:
            deleted = prune(r.folder, r.keep_days, r.keep_bytes, spare=self.path)
        except OSError as exc:  # a folder gone or unreadable: recording goes on, retention tries again later
            log.warning("pruning old recordings in %s failed: %s", r.folder, exc)
            return
        for path in deleted:
            log.info("deleted old recording %s (retention)", path)
            if self.on_delete is not None:
                self.on_delete(path)

    def _row(self, item: Any, offset: float) -> tuple[Any, ...]:
        source: str | None
        if isinstance(item, ProbeEvent):
            kind, source, t, payload = "probe", item.engine, item.t, encode(item.result, self.secrets)
            wall = offset + t
        elif isinstance(item, Event):
            kind, source, t, wall = "event", item.source, item.t, item.wall
            text = scrub(json.dumps(item.data, default=str), self.secrets)
            payload = {"kind": item.kind, **encode(json.loads(text))}
        else:
            kind = KIND_OF[type(item)]
            source = getattr(item, "name", None) if kind in ("engine", "traffic") else None
            t = item.t
            wall = getattr(item, "wall", None) or offset + t
            payload = encode(item, self.secrets)
        raw = orjson.dumps(payload)
        if self._dict_id is None and len(self._training) < TRAIN_AT[-1]:
            self._training.append(raw)
            if len(self._training) in TRAIN_AT:
                self._train()
        return (t, wall, kind, source, self._dict_id, self._zstd.compress(raw))

    def _train(self) -> None:
        try:
            trained = zstandard.train_dictionary(DICT_BYTES, self._training)
        except zstandard.ZstdError as exc:  # too few distinct rows yet: plain frames until the next try
            log.info("zstd dictionary not trained yet: %s", exc)
            return
        cur = self._db.execute("INSERT INTO dicts (data) VALUES (?)", (trained.as_bytes(),))
        self._dict_id = cur.lastrowid
        self._zstd = zstandard.ZstdCompressor(level=LEVEL, dict_data=trained)
        self._training = []

    def _commit(self, rows: list[tuple[Any, ...]]) -> None:
        if not rows or self.error is not None:
            return
        try:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO rows (t, wall, kind, source, dict, data) VALUES (?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            with_rollback(self._db)
            self.error = _words(exc, self.path)
            log.error("recording stopped: %s", self.error)
            return
        self.rows += len(rows)
        self.last_wall = rows[-1][1]


def with_rollback(db: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        db.execute("ROLLBACK")


def _words(exc: BaseException, path: Path) -> str:
    text = str(exc)
    if "full" in text or getattr(exc, "errno", None) == 28:
        return f"disk full: recording to {path} stopped (the dashboard goes on)"
    if not os.path.exists(path):
        return f"{path} disappeared: recording stopped"
    return f"writing {path} failed: {text}; recording stopped"
