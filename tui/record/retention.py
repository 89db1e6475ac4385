"""Where recordings go by default, and how many are kept: the oldest go first, past an age or a total size."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tui.base.defaults import KEEP_BYTES, KEEP_DAYS
from tui.record.schema import SUFFIX

EVERY_S = 3600.0  # while recording, old files are pruned again this often: a week-long session stays bounded


@dataclass(frozen=True)
class Retention:
    """Which recordings to keep, for a recorder to prune again while it writes (tui.record.writer)."""

    folder: Path
    keep_days: float = KEEP_DAYS
    keep_bytes: int = KEEP_BYTES
    every_s: float = EVERY_S


def recordings_dir() -> Path:
    root = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(root) / "enginetop" / "recordings"


def default_path(now: float | None = None) -> Path:
    stamp = datetime.fromtimestamp(time.time() if now is None else now).strftime("%Y%m%d-%H%M%S")
    return recordings_dir() / f"{stamp}-{os.getpid()}{SUFFIX}"


def prune(folder: Path, keep_days: float = KEEP_DAYS, keep_bytes: int = KEEP_BYTES,
          spare: Path | None = None, now: float | None = None) -> list[Path]:
    """Delete recordings older than keep_days, then the oldest until the rest fit in keep_bytes. Only
    files named like recordings are touched, and never `spare` (the one being written). Returns the
    deleted ones."""
    now = time.time() if now is None else now
    files = []
    for path in folder.glob(f"*{SUFFIX}"):
        try:
            st = path.stat()
        except OSError:
            continue
        if spare is None or path.resolve() != spare.resolve():
            files.append((st.st_mtime, _size(path, st.st_size), path))
    files.sort()
    total = sum(size for _, size, _ in files) + (_size(spare, 0) if spare and spare.exists() else 0)
    deleted = []
    for mtime, size, path in files:
        if now - mtime > keep_days * 86400 or total > keep_bytes:
            for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                part.unlink(missing_ok=True)
            deleted.append(path)
            total -= size
    return deleted


def _size(path: Path, main: int) -> int:
    wal = Path(f"{path}-wal")
    return (main or path.stat().st_size) + (wal.stat().st_size if wal.exists() else 0)
