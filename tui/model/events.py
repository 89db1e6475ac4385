"""What happened rather than was sampled: probe results as the store keeps them, and recorded events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["information", "warning", "error"]  # of a notice, as Textual's notify takes it


@dataclass(frozen=True, slots=True)
class ProbeEvent:
    """A probe result as the store's listeners see it: which engine, and when it was kept."""

    engine: str
    t: float
    result: Any  # tui.probe.results.ProbeResult


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened rather than was sampled: a switch step, a crash, an alert, an A/B verdict."""

    kind: str  # e.g. "switch", "engine-state", "alert", "ab", "sweep"
    source: str | None
    t: float
    wall: float
    data: dict[str, Any]
