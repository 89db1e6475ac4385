"""When each request of a workload is sent: the same plan for every engine.

- `trace`: open loop at the recorded times (`speed` scales them). A session's later turns wait for the turn
  before them: `session` (default) sends a turn its recorded delay after the previous turn's reply ended;
  `timestamp` sends it at its recorded time, held only while the previous turn still runs.
- `rate`: requests in file order at an arrival rate, constant, Poisson, or gamma with a chosen coefficient of
  variation (the burstiness of vLLM's bench and AIPerf: shape k = 1 / CV^2); session turns still in order.
- `concurrency`: closed loop, N requests in flight, each sent when one ends (turns still in order).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from tui.model.workload import Workload, WorkloadRequest

Mode = Literal["trace", "rate", "concurrency"]
Turns = Literal["session", "timestamp"]


@dataclass(frozen=True)
class Planned:
    index: int
    request: WorkloadRequest
    at_s: float | None  # offset from the run's start; None: as soon as `after` allows (closed loop)
    after: int | None = None  # the index of the session's previous turn, which must end first
    delay_s: float = 0.0  # after `after` ended


class ScheduleError(ValueError):
    pass


def parse_arrival(text: str) -> tuple[str, float]:
    """poisson | constant | gamma:CV -> (kind, coefficient of variation)."""
    kind, _, cv = text.partition(":")
    if kind == "poisson" and not cv:
        return kind, 1.0
    if kind == "constant" and not cv:
        return kind, 0.0
    if kind == "gamma":
        try:
            value = float(cv)
        except ValueError:
            raise ScheduleError(f"--arrival {text!r}: gamma needs its coefficient of variation, e.g. "
                                "gamma:2") from None
        if not value > 0:
            raise ScheduleError(f"--arrival {text!r}: the coefficient of variation must be positive")
        return kind, value
    raise ScheduleError(f"--arrival {text!r}: expected poisson, constant or gamma:CV")


def gaps(rate: float, kind: str, cv: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    if kind == "constant":
        return [1.0 / rate] * n
    shape = 1.0 / (cv * cv)  # Poisson: cv 1, shape 1, exponential gaps
    return [rng.gammavariate(shape, 1.0 / (rate * shape)) for _ in range(n)]


def plan(workload: Workload, mode: Mode, *, speed: float = 1.0, turns: Turns = "session",
         rate: float | None = None, arrival: str = "poisson", seed: int = 0,
         limit: int | None = None) -> list[Planned]:
    requests = list(workload.requests[:limit] if limit else workload.requests)
    if speed <= 0:
        raise ScheduleError("--speed must be positive")
    previous: dict[str, tuple[int, WorkloadRequest]] = {}  # session -> its last turn so far
    out: list[Planned] = []
    if mode == "rate":
        if rate is None or not rate > 0:
            raise ScheduleError("--rate must be a positive number of requests per second")
        kind, cv = parse_arrival(arrival)
        t, arrivals = 0.0, []
        for gap in gaps(rate, kind, cv, len(requests), seed):
            arrivals.append(t)
            t += gap
    elif mode == "trace" and all(r.timestamp_ms is None and r.delay_ms is None for r in requests):
        raise ScheduleError(f"{workload.path} has no request times ({workload.kind}): give --rate R or "
                            "--concurrency N")
    for i, req in enumerate(requests):
        prev = previous.get(req.session_id) if req.session_id is not None else None
        if req.session_id is not None:
            previous[req.session_id] = (i, req)
        after = prev[0] if prev is not None else None
        if mode == "concurrency":
            out.append(Planned(i, req, None, after, (req.delay_ms or 0.0) / 1000.0))
        elif mode == "rate":
            out.append(Planned(i, req, arrivals[i], after, (req.delay_ms or 0.0) / 1000.0 if after is not None
                               else 0.0))
        else:
            out.append(_trace_turn(i, req, prev, turns, speed))
    return out


def _trace_turn(i: int, req: WorkloadRequest, prev: tuple[int, WorkloadRequest] | None, turns: Turns,
                speed: float) -> Planned:
    at = req.timestamp_ms / 1000.0 / speed if req.timestamp_ms is not None else None
    if prev is None:
        return Planned(i, req, at if at is not None else 0.0)
    if turns == "timestamp" and at is not None:
        return Planned(i, req, at, prev[0], 0.0)
    delay_ms = req.delay_ms
    if delay_ms is None and req.timestamp_ms is not None and prev[1].timestamp_ms is not None:
        delay_ms = max(0.0, req.timestamp_ms - prev[1].timestamp_ms)  # no think time recorded: the gap
    return Planned(i, req, None, prev[0], (delay_ms or 0.0) / 1000.0 / speed)
