"""A probe's energy: the joules the readings over its span hold (its GPUs', or the CPU package's), once a
reading after its end has come, with how they were measured and whose they are, or why there are none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tui.sources.energy import MIN_SPAN_S, TOO_SHORT, Track

PROBE_ENERGY_WAIT_S = 15.0  # a probe whose span no reading has passed since is given up on


def probe_energy_fields(result: Any, now: float, scope_of: Callable[[], tuple[list[Track], str] | str]
                    ) -> dict[str, Any] | None:
    """A probe's energy fields (`result` has sent_at and ended_at), or None while the readings have not
    passed its end yet. `scope_of`: the energy tracks its engine runs on and whose they are, or why none."""
    t0, t1 = result.sent_at, result.ended_at
    if t1 - t0 < MIN_SPAN_S:
        return {"energy_note": f"{TOO_SHORT} ({t1 - t0:.2f} s; the counter moves every 20-100 ms)"}
    scope = scope_of()
    if isinstance(scope, str):
        return {"energy_note": scope}
    tracks, words = scope
    if not tracks:
        return {"energy_note": "no energy reading"}
    if any(not tr.points or tr.points[-1].t <= t1 for tr in tracks):
        if now - t1 < PROBE_ENERGY_WAIT_S:
            return None
        return {"energy_note": "no energy reading after the probe ended"}
    joules = 0.0
    sources = set()
    for track in tracks:
        got = track.between(t0, t1)
        if isinstance(got, str):
            return {"energy_note": got}
        joules += got[0]
        sources.add(got[1])
    source = sources.pop() if len(sources) == 1 else "counter + power × time"
    return {"energy_j": joules, "energy_source": source, "energy_scope": words}
