"""How full a capacity is, as the share (0 to 1) a bar draws: a GPU's utilisation and memory, the host's CPU
and RAM, an engine's running requests against its slots and its KV cache (tui.live.shares). None: the used
part or the whole is not known, and the bar is left blank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuShares:
    util: float | None  # the GPU's utilisation
    memory: float | None  # VRAM used of its total (the unified memory's where the GPU says it)


@dataclass(frozen=True, slots=True)
class HostShares:
    cpu: float | None
    ram: float | None


@dataclass(frozen=True, slots=True)
class EngineShares:
    running: float | None  # requests running of the engine's slots (None: its slots are not known)
    kv: float | None  # the KV cache in use: the engine's own figure, else the estimate from its /slots
