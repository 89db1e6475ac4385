"""Reading a recording: rows in time order, decoded back into the samples the store takes.

A file cut short or damaged (a crash mid-write, a bad copy) still gives every row before the damage,
and `damage` says in words where reading stopped. A file from a newer schema is refused.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard

from tui.model.events import Event, ProbeEvent
from tui.record.codec import SAMPLE_TYPES, decode
from tui.record.schema import RecordingError, check_version

BATCH = 512
_JSON = json.JSONDecoder()


def _json_v1(raw: bytes) -> Any:
    return _JSON.decode(raw.decode())  # str: json.loads would sniff the encoding


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    t: float
    wall: float
    kind: str
    source: str | None
    item: Any  # EngineSample | GpuReport | HostSample | ProbeEvent | Event


class Recording:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise RecordingError(f"{path}: no such file")
        with open(self.path, "rb") as f:
            head = f.read(16)
        if head != b"SQLite format 3\x00":
            raise RecordingError(f"{path} is not an enginetop recording (not an SQLite file)")
        # Read-only and immutable-free: a recording still being written (WAL) reads up to its last commit.
        self.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                  check_same_thread=False)
        self.damage: str | None = None  # set when reading stopped early at a damaged part of the file
        self._decoders: dict[int | None, zstandard.ZstdDecompressor] = {}
        try:
            self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            # A file cut short says in its header that it has more pages than it has: SQLite refuses it
            # unless told to read what is there (pages past the end then read as damage, where they lie).
            self.db.execute("PRAGMA writable_schema = ON")
            self._damaged(exc, None)
        self.version = check_version(self.db, path)
        # Schema 1 wrote Python's JSON, with a non-standard `Infinity` for the +Inf bucket bound; orjson
        # reads the later files at twice the speed (a seek parses thousands of rows, bench_record.py).
        self._parse: Callable[[bytes], Any] = orjson.loads if self.version >= 2 else _json_v1
        try:
            self.meta = dict(self.db.execute("SELECT key, value FROM meta"))
            self._dicts = {i: zstandard.ZstdCompressionDict(d) for i, d in self.db.execute(
                "SELECT id, data FROM dicts")}
            self.start, self.end, self.count = self.db.execute(
                "SELECT min(t), max(t), count(*) FROM rows").fetchone()
        except sqlite3.DatabaseError as exc:
            self._damaged(exc, None)
            self.meta = getattr(self, "meta", {})
            self._dicts = getattr(self, "_dicts", {})
            self.start, self.end, self.count = self._scan_bounds()
        self.mono_to_wall = float(self.meta.get("mono_to_wall", "0"))
        self.engines: dict[str, str] = json.loads(self.meta.get("engines", "{}"))

    def close(self) -> None:
        self.db.close()

    @property
    def empty(self) -> bool:
        return self.start is None

    def wall(self, t: float) -> float:
        return t + self.mono_to_wall

    def rows(self, t0: float | None = None, t1: float | None = None, kinds: tuple[str, ...] = (),
             skip: Callable[[float, str], bool] | None = None) -> Iterator[Row]:
        """Rows with t0 <= t <= t1 (either open), in time order; stops at the first damaged page. Rows for
        which skip(t, kind) is true are not decoded (nor given)."""
        last_id = -1
        last_t = -float("inf") if t0 is None else t0
        t_end = float("inf") if t1 is None else t1
        where = "" if not kinds else f" AND kind IN ({','.join('?' * len(kinds))})"
        # Batches keyed on (t, id), so a damaged page ends the iteration where it lies, not before it.
        while True:
            try:
                batch = self.db.execute(
                    f"SELECT id, t, wall, kind, source, dict, data FROM rows INDEXED BY rows_t "
                    f"WHERE t >= ? AND t <= ? AND NOT (t = ? AND id <= ?){where} "
                    f"ORDER BY t, id LIMIT {BATCH}",
                    (last_t, t_end, last_t, last_id, *kinds)).fetchall()
            except sqlite3.DatabaseError as exc:
                self._damaged(exc, last_t)
                yield from self._rows_by_id(last_t, t_end, kinds)
                return
            if not (yield from self._decoded(row for row in batch
                                             if skip is None or not skip(row[1], row[3]))):
                return
            if len(batch) < BATCH:
                return
            last_t, last_id = batch[-1][1], batch[-1][0]

    def _rows_by_id(self, t0: float, t1: float, kinds: tuple[str, ...]) -> Iterator[Row]:
        """After the index is damaged: the table in rowid order (rows are appended in time order) up to
        the first unreadable page."""
        last_id = 0
        while True:
            try:
                batch = self.db.execute("SELECT id, t, wall, kind, source, dict, data FROM rows WHERE id > ? "
                                        f"ORDER BY id LIMIT {BATCH}", (last_id,)).fetchall()
            except sqlite3.DatabaseError:
                return
            if not (yield from self._decoded(row for row in batch
                                             if t0 < row[1] <= t1 and (not kinds or row[3] in kinds))):
                return
            if len(batch) < BATCH:
                return
            last_id = batch[-1][0]

    def _decoded(self, rows: Iterable[tuple[Any, ...]]) -> Generator[Row, None, bool]:
        """Each row decoded, in order; False once one cannot be (a damaged page: the rows end there)."""
        for row in rows:
            decoded = self._decode(row)
            if decoded is None:
                return False
            yield decoded
        return True

    def _decode(self, row: tuple[Any, ...]) -> Row | None:
        rid, t, wall, kind, source, dict_id, data = row
        try:
            dec = self._decoders.get(dict_id)
            if dec is None:
                dec = self._decoders[dict_id] = zstandard.ZstdDecompressor(
                    dict_data=self._dicts[dict_id]) if dict_id is not None else zstandard.ZstdDecompressor()
            payload = self._parse(dec.decompress(data))
            if kind == "event":
                item: Any = Event(payload.pop("kind", "?"), source, t, wall, payload)
            elif kind == "probe":
                item = ProbeEvent(source or "", t, decode(SAMPLE_TYPES["probe"], payload))
            elif kind in SAMPLE_TYPES:
                item = decode(SAMPLE_TYPES[kind], payload)
            else:
                return Row(rid, t, wall, kind, source, None)  # a kind from a later minor version: skipped
        except (zstandard.ZstdError, ValueError, KeyError, TypeError) as exc:  # orjson raises a ValueError
            self._damaged(exc, t)
            return None
        return Row(rid, t, wall, kind, source, item)

    def _damaged(self, exc: BaseException, t: float | None) -> None:
        if self.damage is None:
            where = "" if t is None else f" after {self.clock(t)}"
            self.damage = (f"{self.path} is damaged ({exc}): showing what was recorded before the "
                           f"damage{where}")

    def _scan_bounds(self) -> tuple[float | None, float | None, int]:
        """min/max t and the count, in rowid order up to the first unreadable page (the index may be lost)."""
        start = end = None
        count, last_id = 0, 0
        while True:
            try:
                batch = self.db.execute("SELECT id, t FROM rows WHERE id > ? ORDER BY id LIMIT 4096",
                                        (last_id,)).fetchall()
            except sqlite3.DatabaseError:
                break
            for _, t in batch:
                start = t if start is None else min(start, t)
                end = t if end is None else max(end, t)
            count += len(batch)
            if len(batch) < 4096:
                break
            last_id = batch[-1][0]
        return start, end, count

    def clock(self, t: float) -> str:
        import datetime

        return datetime.datetime.fromtimestamp(self.wall(t)).strftime("%Y-%m-%d %H:%M:%S")

    def sources(self, kind: str) -> list[str]:
        try:
            return [s for (s,) in self.db.execute("SELECT DISTINCT source FROM rows WHERE kind = ?", (kind,))
                    if s is not None]
        except sqlite3.DatabaseError:
            return list(self.engines)

    def newest_t(self, kind: str, t0: float, t1: float) -> float | None:
        """The time of the newest row of a kind within t0..t1, without decoding anything."""
        try:
            found = self.db.execute(
                "SELECT t FROM rows INDEXED BY rows_t WHERE t >= ? AND t <= ? AND kind = ? ORDER BY t DESC "
                "LIMIT 1", (t0, t1, kind)).fetchone()
        except sqlite3.DatabaseError:
            return None  # reading the rows says where the damage is
        return None if found is None else found[0]

    def last_before(self, kind: str, t: float, limit: int, source: str | None = None) -> list[Row]:
        """The newest `limit` rows of a kind before t, oldest first (e.g. the probes a panel lists)."""
        try:
            # The kind written out, not bound: so SQLite can use the partial index of probe rows.
            assert kind.isalpha()
            found = self.db.execute(
                f"SELECT id, t, wall, kind, source, dict, data FROM rows WHERE kind = '{kind}' AND t < ?"
                + (" AND source = ?" if source is not None else "") + " ORDER BY t DESC LIMIT ?",
                (t, *((source,) if source is not None else ()), limit)).fetchall()
        except sqlite3.DatabaseError as exc:
            self._damaged(exc, t)
            return []
        rows = [self._decode(r) for r in reversed(found)]
        return [r for r in rows if r is not None]

    def last_event(self, event_kind: str, t: float, source: str | None = None, page: int = 64) -> Row | None:
        """The newest event of `event_kind` (e.g. "engine-state") before t, however far back: events are
        read newest first, a page at a time, until one is of that kind."""
        while True:
            rows = self.last_before("event", t, page, source)
            for row in reversed(rows):
                if row.item is not None and row.item.kind == event_kind:
                    return row
            if len(rows) < page:
                return None
            t = rows[0].t
