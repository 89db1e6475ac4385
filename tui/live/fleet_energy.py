"""The fleet table's joules per generated token: each engine's GPUs (matched by pod, GPU labels or node in
tui.fleet.match) through the one attribution (tui.sources.attribution.on_gpus), the tokens counted over the
energy's own window from each engine's generated-tokens counter (generated_per_s: dcgm's counter moves every
30 s, so the window is a minute, not the 10 s of the gen tok/s column), never a rate over another window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tui.live.engine_state import EngineState, generated_per_s
from tui.model.samples import GpuSample
from tui.sources.attribution import on_gpus


def joules_per_token(engines: Mapping[str, EngineState],
                     gpus_of: Mapping[str, tuple[Sequence[GpuSample], bool]]) -> dict[str, float | None]:
    """Each engine of `gpus_of` (its GPUs, and whether they are its own: else they are its node's, which every
    engine matched to the same GPUs shares) -> the joules per token of its GPUs over the tokens of this engine
    alone, or, on a node's GPUs, of every engine on them."""
    sharing: dict[frozenset[int], list[str]] = {}
    for name, (gpus, _) in gpus_of.items():
        sharing.setdefault(frozenset(id(g) for g in gpus), []).append(name)

    def rate(engine: str, t0: float, t1: float) -> float | None:
        return generated_per_s(engines[engine], t0, t1)

    out = {}
    for name, (gpus, own) in gpus_of.items():
        on = [name] if own else sharing[frozenset(id(g) for g in gpus)]
        out[name] = on_gpus(gpus, on, rate).joules_per_token
    return out
