"""State files of engines enginetop started, so a later command (`down`, `switch`) can find them.

One JSON file per profile under runs_dir()/state (or ENGINETOP_STATE_DIR). It holds PIDs and paths only,
never the API key.
The PID's create time guards against a reused PID: a file whose process is gone is stale.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from tui.base.paths import runs_dir, safe_name
from tui.base.process import pid_alive
from tui.lifecycle.engine import EngineInstance
from tui.lifecycle.profile_resolve import ResolvedProfile


def state_dir() -> Path:
    """ENGINETOP_STATE_DIR moves it (each test has its own: a test's `enginetop down` then never finds the
    user's engines, nor the user's a test's)."""
    path = Path(os.environ.get("ENGINETOP_STATE_DIR") or runs_dir() / "state")
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_path(profile_name: str) -> Path:
    return state_dir() / f"{safe_name(profile_name)}.json"


def write_state(instance: EngineInstance) -> None:
    if instance.pid is None:
        return
    record = {
        "profile": instance.name,
        "profile_path": str(instance.profile.path),
        "pid": instance.pid,
        "pgid": instance.pgid,
        "create_time": instance.create_time,
        "host": instance.profile.host,
        "port": instance.profile.port,
        "url": instance.url,
        "log_path": str(instance.log_path) if instance.log_path else None,
        "started_wall": instance.started_wall,
        "cold_start_s": instance.cold_start_s,
        "pids_seen": [[pid, started] for pid, started in sorted(instance.pids_seen.items())],
        "launcher_pid": os.getpid(),
    }
    path = state_path(instance.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    tmp.replace(path)


def read_state(profile_name: str) -> dict[str, Any] | None:
    try:
        data = json.loads(state_path(profile_name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def remove_state(profile_name: str, pid: int | None = None) -> None:
    """Remove the file; with pid, only if it still describes that process (a newer start keeps its file)."""
    if pid is not None:
        data = read_state(profile_name)
        if data is not None and data.get("pid") != pid:
            return
    with contextlib.suppress(FileNotFoundError):
        state_path(profile_name).unlink()


def adopt(record: dict[str, Any], resolved: ResolvedProfile) -> EngineInstance | None:
    """An instance for a recorded engine that still runs, or None (the file is stale: removed)."""
    pid = record["pid"]
    if not pid_alive(pid, record.get("create_time")):
        remove_state(record.get("profile", ""), pid)
        return None
    instance = EngineInstance(
        resolved=resolved,
        pid=pid,
        pgid=record.get("pgid") or pid,
        create_time=record.get("create_time"),
        log_path=Path(record["log_path"]) if record.get("log_path") else None,
        started_wall=record.get("started_wall") or 0.0,
        cold_start_s=record.get("cold_start_s"),
        pids_seen=_pids_seen(record),
        adopted=True,
    )
    instance.tree_pids()
    return instance


def all_states() -> list[dict[str, Any]]:
    records = []
    for path in sorted(state_dir().glob("*.json")):
        data = read_state(path.stem)
        if data is not None:
            records.append(data)
    return records


def enginetop_owner(pid: int) -> str | None:
    """The profile whose recorded engine tree contains pid, if enginetop started it."""
    for record in all_states():
        ours = pid in _pids_seen(record) or pid == record.get("pid")
        if ours and pid_alive(record["pid"], record.get("create_time")):
            return str(record.get("profile"))
    return None


def _pids_seen(record: dict[str, Any]) -> dict[int, float]:
    pairs = record.get("pids_seen", [])
    return {int(p[0]): float(p[1]) for p in pairs if isinstance(p, list) and len(p) == 2}
