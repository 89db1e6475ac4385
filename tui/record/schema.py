"""The recording file: one SQLite database per session, readable by any SQLite client.

    meta(key TEXT PRIMARY KEY, value TEXT)
        schema_version  this file's schema (SCHEMA_VERSION); a reader refuses a newer one
        created_wall    time.time() when recording began; mono_to_wall: add it to a row's t to get wall time
        host, enginetop, engines (JSON {name: public url}), closed_wall (set on a clean close)
    dicts(id INTEGER PRIMARY KEY, data BLOB)
        zstd dictionaries trained on this file's own first rows
    rows(id INTEGER PRIMARY KEY, t REAL, wall REAL, kind TEXT, source TEXT, dict INTEGER, data BLOB)
        t      the sample's time.monotonic() in the recording process (what the store's windows use)
        wall   time.time() of the same instant
        kind   engine | gpu | host | probe | event | traffic (the proxy's figures for an engine; readers
               before it skip the rows)
        source the engine's name (engine, probe, traffic, most events); NULL for gpu and host
        dict   the dicts.id that compresses `data`; NULL: a plain zstd frame
        data   zstd-compressed JSON: the dataclass's fields (tui.record.codec), an event's dict; since
               schema 2, infinities and NaN are the strings "+Inf", "-Inf", "NaN" (as Prometheus writes
               them), so the JSON is standard; schema 1 files (Python's `Infinity`) are still read
    indexes: rows_t (t); rows_probe and rows_event (source, t) over probe and event rows only: a seek
    finds the last probes and an engine's last state fast however far back they are

Why zstd with a trained dictionary: each row stays its own frame, so seeking reads only the rows it
needs, and a dictionary trained on the session's first rows (field names, model names, bucket bounds)
shrinks a 0.5-1.5 kB JSON row to tens of bytes, where zlib per row gets 3-4x at best (bench_record.py).
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 2  # 2: +Inf, -Inf and NaN written as strings (1: Python's `Infinity`), read by orjson
SUFFIX = ".enginetop.sqlite"

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS dicts (id INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY, t REAL NOT NULL, wall REAL NOT NULL, kind TEXT NOT NULL, source TEXT,
    dict INTEGER, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS rows_t ON rows (t);
CREATE INDEX IF NOT EXISTS rows_probe ON rows (source, t) WHERE kind = 'probe';
CREATE INDEX IF NOT EXISTS rows_event ON rows (source, t) WHERE kind = 'event';
"""


class RecordingError(Exception):
    """A file that cannot be read as a recording, said in words a user can act on."""


def check_version(db: sqlite3.Connection, path: object) -> int:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise RecordingError(f"{path} is not an enginetop recording ({exc})") from None
    if row is None:
        raise RecordingError(f"{path} is not an enginetop recording (no schema version)")
    version = int(row[0])
    if version > SCHEMA_VERSION:
        raise RecordingError(f"{path} was written with recording schema {version}, newer than this "
                             f"enginetop reads ({SCHEMA_VERSION}): upgrade enginetop to open it")
    return version
