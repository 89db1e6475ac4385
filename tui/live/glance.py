"""Small figures the engine's column, its detail and its line in a long list all show, computed here once from
what the store keeps (the widgets only lay them out): the model's short name, the slots busy, each slot's
phase, the finish reasons' shares."""

from __future__ import annotations

from typing import Literal

from tui.model.slots import SlotsReading, SlotState

SlotPhase = Literal["idle", "prefill", "decode"]


def model_name(model: str | None) -> str | None:
    """The model as people tell models apart: llama-server names it by its file path, so the file's name."""
    return model.rsplit("/", 1)[-1] if model else None


def busy_slots(slots: SlotsReading) -> int:
    """How many of llama-server's slots are processing a request."""
    return sum(s.processing for s in slots.slots)


def slot_phase(slot: SlotState) -> SlotPhase:
    """Idle, prefilling its prompt (nothing decoded yet), or decoding."""
    if not slot.processing:
        return "idle"
    return "prefill" if not slot.decoded and slot.prompt_tokens else "decode"


def finish_shares(counts: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
    """Each finish reason's share of the requests that ended (reason, fraction), in the counts' order; none
    when none ended."""
    total = sum(n for _, n in counts)
    return tuple((reason, n / total) for reason, n in counts) if total else ()
