"""A bench or capacity run as the dashboard sees it while it goes: per engine, its progress and the live
figures of its requests (tui.workload.live writes them, a source reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RunState = Literal["preparing", "running", "done", "failed"]


@dataclass(frozen=True, slots=True)
class BenchProgress:
    command: str  # "bench" or "capacity"
    pid: int
    workload: str
    state: RunState
    planned: int = 0  # requests of the plan (capacity: of the current level)
    sent: int = 0
    done: int = 0
    ok: int = 0
    errors: int = 0
    in_flight: int = 0
    window_s: float = 30.0  # the live figures: requests that ended in the last window_s
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    slo: str | None = None
    slo_ttft_s: float | None = None  # the SLO's TTFT limit, drawn on the TTFT plot
    attainment: float | None = None  # of the requests done so far (capacity: in the current level)
    level: int | None = None  # capacity: levels run so far, the current one included
    level_rate: float | None = None  # capacity: the current level's arrival rate
    capacity_rps: float | None = None  # capacity: the highest rate that passed so far
    error: str | None = None
    note: str | None = None  # e.g. prompts made without the engine's tokens: lengths approximate


@dataclass(frozen=True, slots=True)
class BenchSample:
    name: str  # the engine, as the dashboard names it (matched by URL)
    url: str
    t: float  # time.monotonic() when read
    wall: float
    progress: BenchProgress
    updated_wall: float  # when the run last wrote its figures
