"""Alerts that catch what dashboards miss, in the app (AlertTracker) and as Prometheus rules (rule_group).

- stalled: requests running and no token generated for 60 s (vLLM issue 51663: /health still says 200)
- KV cache above 90 % for 5 min
- a growing queue: waiting requests rising over 5 min, at least 5 waiting
- a throttled GPU under an engine whose tok/s fell below 70 % of its last 10 minutes' mean

The rules reuse the fleet's own expressions (tui.fleet.queries), so the app and the user's Prometheus judge
the same figures. The app's tracker sees only what it has read since it started, so it needs the stated
time before an alert shows (as `for:` does in Prometheus).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tui.fleet.queries import BY, FleetQueries
from tui.model.samples import REAL_THROTTLE_MASK, EngineReading, EngineStats

STALL_S = 60.0
KV_FULL = 0.90
KV_FULL_S = 300.0
QUEUE_WINDOW_S = 300.0
QUEUE_MIN_WAITING = 5.0
DROP_WINDOW_S = 600.0
DROP_FRACTION = 0.7

STALLED = "stalled: requests running, no tokens for 60 s"
KV_SATURATED = "KV cache above 90% for 5 min"
QUEUE_GROWING = "queue growing for 5 min"
THROTTLED_DROP = "GPU throttled and tok/s dropped"


@dataclass
class _Track:
    stalled_since: float | None = None
    kv_since: float | None = None
    waiting: deque[tuple[float, float]] = field(default_factory=deque)
    gen: deque[tuple[float, float]] = field(default_factory=deque)


def _since(start: float | None, now: float, condition: bool) -> float | None:
    if not condition:
        return None
    return now if start is None else start


def _slope(points: deque[tuple[float, float]]) -> float:
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


class AlertTracker:
    def __init__(self) -> None:
        self._tracks: dict[str, _Track] = {}

    def update(self, name: str, now: float, health: str, reading: EngineReading, stats: EngineStats,
               node_throttled: bool) -> tuple[str, ...]:
        tr = self._tracks.setdefault(name, _Track())
        if health != "up":
            self._tracks[name] = _Track()
            return ()
        alerts = []
        running, gen = reading.running, stats.gen_tps
        tr.stalled_since = _since(tr.stalled_since, now, bool(running) and gen == 0)
        if tr.stalled_since is not None and now - tr.stalled_since >= STALL_S:
            alerts.append(STALLED)
        kv = reading.kv_cache_usage
        tr.kv_since = _since(tr.kv_since, now, kv is not None and kv > KV_FULL)
        if tr.kv_since is not None and now - tr.kv_since >= KV_FULL_S:
            alerts.append(KV_SATURATED)
        if reading.waiting is not None:
            tr.waiting.append((now, reading.waiting))
        while tr.waiting and now - tr.waiting[0][0] > QUEUE_WINDOW_S:
            tr.waiting.popleft()
        if (tr.waiting and now - tr.waiting[0][0] >= QUEUE_WINDOW_S * 0.95 and len(tr.waiting) >= 3
                and tr.waiting[-1][1] >= QUEUE_MIN_WAITING and _slope(tr.waiting) > 0):
            alerts.append(QUEUE_GROWING)
        if gen is not None:
            tr.gen.append((now, gen))
        while tr.gen and now - tr.gen[0][0] > DROP_WINDOW_S:
            tr.gen.popleft()
        if node_throttled and gen is not None and len(tr.gen) >= 3:
            mean = sum(v for _, v in tr.gen) / len(tr.gen)
            if mean > 0 and gen < DROP_FRACTION * mean:
                alerts.append(THROTTLED_DROP)
        return tuple(alerts)


REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS|DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
# Subqueries' resolution: a typical scrape interval. Coarser (1m) left the first points of a new engine's
# history up to a minute apart, so the tok/s-drop and queue rules needed minutes before they could judge.
STEP = "15s"


def _throttled(by: str, gpus: str) -> str:
    """1 per `by` group with a GPU reporting a real throttle reason (bits 0x4..0x80 of field 112, either
    name). The per-GPU max first merges a GPU's old- and new-named series (same labels once the name goes)."""
    assert REAL_THROTTLE_MASK == 0xFC  # bits 2..7: floor(x / 4) % 64 keeps exactly those
    return f"max by ({by}) (floor(max by ({by}, gpu, UUID) ({gpus}) / 4) % 64 > 0)"


def _node_gpus() -> str:
    """Every GPU's reasons with its node (`Hostname`, or `hostname` since the late-2026 rename) as `node`."""
    return f'label_replace(label_replace({{__name__=~"{REASONS}"}}, "node", "$1", "Hostname", "(.+)"), ' \
           '"node", "$1", "hostname", "(.+)")'


def _pod_gpus() -> str:
    """The GPUs dcgm-exporter labels with the pod using them. Scraped without honor_labels, the exporter's
    pod is in exported_pod / exported_namespace (tui.fleet.dcgm.pod_of): copied over `pod` / `namespace`."""
    pod = f'{{__name__=~"{REASONS}", pod!=""}}'
    return f'label_replace(label_replace({pod}, "pod", "$1", "exported_pod", "(.+)"), ' \
           '"namespace", "$1", "exported_namespace", "(.+)")'


def rule_group(match: str | None = None) -> dict:
    """The same alerts as one Prometheus rule group, for `enginetop rules -o FILE`."""
    q = FleetQueries(match)
    f = q.figures()
    gen, running, waiting, kv = f"({f['gen_tps']})", f"({f['running']})", f"({f['waiting']})", \
        f"({f['kv_cache_usage']})"
    on = f"on ({BY})"
    drop = f"{gen} < {DROP_FRACTION} * avg_over_time({gen}[10m:{STEP}])"
    drop = f'label_replace({drop}, "node", "$1", "instance", "(.+):[0-9]+")'
    # An engine's GPUs, as tui.fleet.match.gpus_of finds them: the ones labelled with its pod where some
    # are, else those of its node (the host part of its instance)
    by_pod = f"({drop} and on (namespace, pod) {_throttled('namespace, pod', _pod_gpus())})"
    by_node = f"(({drop} unless on (namespace, pod) group by (namespace, pod) ({_pod_gpus()})) " \
              f"and on (node) {_throttled('node', _node_gpus())})"
    labels = {"source": "enginetop"}

    def rule(alert: str, expr: str, for_: str, severity: str, summary: str) -> dict:
        return {"alert": alert, "expr": expr, "for": for_, "labels": {**labels, "severity": severity},
                "annotations": {"summary": summary,
                                "description": "{{ $labels.job }} {{ $labels.instance }} "
                                               "{{ $labels.model_name }}: " + summary}}

    return {"name": "enginetop-fleet", "rules": [
        rule("EngineStalled", f"{running} > 0 and {on} {gen} == 0", "1m", "critical",
             "requests are running but no token was generated for a minute (health checks may still pass)"),
        rule("EngineKVCacheFull", f"{kv} > {KV_FULL}", "5m", "warning", "KV cache above 90% for 5 minutes"),
        rule("EngineQueueGrowing",
             f"{waiting} >= {QUEUE_MIN_WAITING:g} and {on} deriv({waiting}[5m:{STEP}]) > 0", "5m", "warning",
             "the queue of waiting requests keeps growing"),
        rule("EngineThrottledGpuSlow", f"{by_pod} or {by_node}", "2m", "warning",
             "a GPU on this node is throttled and the engine's tok/s fell below 70% of its 10-minute mean"),
    ]}
