"""Since when each finding holds: a finding keeps the wall time it first held while it goes on holding, and is
forgotten the first time it does not (it clears)."""

from __future__ import annotations

from dataclasses import replace

from tui.model.findings import Finding


class Since:
    def __init__(self) -> None:
        self._first: dict[str, float] = {}  # finding id -> wall time it began to hold

    def update(self, found: list[Finding], wall: float) -> tuple[Finding, ...]:
        first = {f.id: self._first.get(f.id, wall) for f in found}
        self._first = first
        return tuple(replace(f, since_wall=first[f.id]) for f in found)
