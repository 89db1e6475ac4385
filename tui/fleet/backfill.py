"""An engine opened from the fleet table gets the last 30 minutes of its plots from `query_range`, so its
view starts full instead of empty: the same expressions the table uses, narrowed to the engine, and its
node's throttle spans from dcgm field 112 (either name, either host label)."""

from __future__ import annotations

import time

from tui.fleet.prometheus import PrometheusClient
from tui.fleet.queries import FleetQueries, escape
from tui.live.engine_state import EngineState
from tui.live.series import Series
from tui.live.store import ENGINE_SERIES

BACKFILL_S = 1800.0
REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"


def to_monotonic(wall: float) -> float:
    return wall - (time.time() - time.monotonic())


def merged(series: Series, older: list[tuple[float, float]]) -> Series:
    """A copy of `series` with `older` points (time.monotonic()) placed before its first point."""
    out = Series(series.horizon_s, round(series.horizon_s / series.bucket_s), peak=series.peak)
    first = series.points[0][0] if series.points else float("inf")
    for t, v in older:
        if t < first:
            out.add(t, v)
    for t, v in series.points:
        out.add(t, v)
    return out


def throttle_expr(host: str, pod: tuple[str, str] | None = None) -> str:
    """1 while a GPU of the engine reports a real throttle reason: the GPUs labelled with its (namespace, pod)
    where some are, else its host's (tui.fleet.match); `or` keeps the pod's answer wherever it has one."""
    # per GPU first: one exporting both field names would otherwise give two series of the same labels
    one = 'max(floor(max by (gpu, UUID) ({{__name__=~"{r}", {m}}}) / 4) % 64 > bool 0)'
    by_host = [one.format(r=REASONS, m=f'{label}="{escape(host)}"') for label in ("Hostname", "hostname")]
    by_pod = [one.format(r=REASONS, m=f'{ns}="{escape(pod[0])}", {name}="{escape(pod[1])}"')
              for ns, name in (("namespace", "pod"), ("exported_namespace", "exported_pod"))] if pod else []
    return " or ".join(by_pod + by_host)


async def backfill_engine(client: PrometheusClient, queries: FleetQueries, labels: dict[str, str],
                          state: EngineState, seconds: float = BACKFILL_S, step: float = 10.0) -> int:
    """Fill the engine's plotted series from Prometheus; returns the number of points added."""
    end = time.time()
    added = 0
    for key in ENGINE_SERIES:
        result = await client.query_range(queries.engine_range(key, labels), end - seconds, end, step)
        points = [(to_monotonic(t), v) for _, values in result[:1] for t, v in values if v is not None]
        state.series[key] = merged(state.series[key], points)
        added += len(points)
    return added


async def backfill_throttle(client: PrometheusClient, host: str, series: Series,
                            seconds: float = BACKFILL_S, step: float = 10.0,
                            pod: tuple[str, str] | None = None) -> Series:
    """`pod`: tui.fleet.match.engine_pod(sample), so the spans are those of the GPUs gpus_of finds."""
    end = time.time()
    result = await client.query_range(throttle_expr(host, pod), end - seconds, end, step)
    points = [(to_monotonic(t), v) for _, values in result[:1] for t, v in values if v is not None]
    return merged(series, points)
