"""The findings that hold for one engine now (tui.findings), judged from what the store keeps of it
(EngineState): its configuration, traffic, counters and peaks over its current run, what its start cost the
host, the models its router loaded and reloaded, and its container's limits."""

from __future__ import annotations

from tui.findings.container import container_findings
from tui.findings.judge import by_severity, judge
from tui.findings.models import reloaded, split_model
from tui.live.engine_state import EngineState
from tui.model.counters import spec_window
from tui.model.findings import Evidence


def judge_engine(state: EngineState, t: float, wall: float) -> None:
    """The findings that hold for the engine now (tui.findings), from what the store has of it. While it is
    not up, only what its start cost the host is judged: its configuration, traffic and counters are of a run
    that is over (or not begun), and nothing found on them holds."""
    sample = state.sample
    if sample is not None and sample.health != "up":
        evidence = Evidence(state.name, start=state.start)
    else:
        reading = sample.reading if sample is not None else None
        traffic = state.traffic.stats.facts if state.traffic is not None and state.traffic.error is None \
            else None
        evidence = Evidence(state.name, sample.config if sample is not None else None, traffic,
                            spec_window(None, reading), state.start, state.busy_max, state.waiting_max,
                            t - state.watched_t if state.watched_t is not None else 0.0,
                            state.stats.requests)
    found = judge(evidence)
    if sample is not None and sample.health == "up" and sample.models is not None:
        loads = [(r.workload, r.server.load_ms) for _, r in state.probes
                 if getattr(r, "server", None) is not None and r.server.load_ms is not None]
        found += [f for f in (split_model(state.name, sample.models), reloaded(state.name, loads))
                  if f is not None]
    if state.cgroup is not None or state.container is not None:
        found = by_severity([*container_findings(state.name, state.cgroup_use, state.cgroup,
                                                 state.rss_bytes, state.container,
                                                 sample.config if sample is not None else None), *found])
    state.findings = state.since.update(by_severity(found), wall)
