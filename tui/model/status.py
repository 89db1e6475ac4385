"""Where an engine stands, as the lifecycle reports it: its run state and each step of a start or switch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from tui.model.findings import StartMemory

StepStatus = Literal["running", "ok", "failed", "skipped", "cancelled"]

# idle: nothing started yet; failed: the last start or switch failed (the message says why) and nothing runs;
# crashed: an engine that was ready exited on its own.
RunState = Literal["idle", "switching", "ready", "crashed", "failed", "stopped"]


@dataclass(frozen=True, slots=True)
class StepEvent:
    name: str  # one of STEPS
    status: StepStatus  # "running" events repeat while a step waits, with what it waits for
    elapsed_s: float  # since this step began
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "elapsed_s": round(self.elapsed_s, 3),
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """What the UI shows once a second. `log_tail` is filled for a crash (and on request)."""

    state: RunState
    profile: str | None = None
    pid: int | None = None
    url: str | None = None
    attached: bool = False
    exit_code: int | None = None
    cold_start_s: float | None = None
    step: str | None = None  # the running step while switching
    log_path: Path | None = None
    log_tail: tuple[str, ...] = ()
    message: str = ""
    start_memory: StartMemory | None = None  # what its start cost the host, and how a kill ended it

    def event_data(self) -> dict[str, Any]:
        """What an "engine-state" event records of it (the dashboard's and `enginetop record`'s alike)."""
        out: dict[str, Any] = {"state": self.state, "message": self.message, "exit_code": self.exit_code,
                               "log_tail": list(self.log_tail[-20:])}
        if self.start_memory is not None:
            out["start_memory"] = asdict(self.start_memory)
        return out

