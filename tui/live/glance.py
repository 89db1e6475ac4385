"""Small figures the engine's column, its detail and its line in a long list all show, computed here once from
what the store keeps (the widgets only lay them out): the model's short name, the slots busy, each slot's
phase, the finish reasons' shares."""

from __future__ import annotations

from typing import Literal

from tui.model.samples import RoutedModel
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


def processor_words(size: int | None, vram: int | None) -> str | None:
    """Where a model Ollama loaded sits, as `ollama ps` says it (cmd/cmd.go): "100% GPU", "100% CPU", or
    "48%/52% CPU/GPU" when it is split; None when the server did not say."""
    if size is None or vram is None:
        return None
    if vram == 0:
        return "100% CPU"
    if vram == size:
        return "100% GPU"
    if vram > size or size == 0:
        return None
    cpu = int((size - vram) / size * 100 + 0.5)  # Go's math.Round: halves away from zero
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def keep_alive_words(expires_wall: float | None, now_wall: float) -> str | None:
    """Ollama's keep-alive countdown: "unloads in 4 min 12 s", "kept loaded" for a deadline years away
    (keep_alive -1), "unloading" once it passed."""
    if expires_wall is None:
        return None
    left = expires_wall - now_wall
    if left > 365 * 86400:
        return "kept loaded"
    if left <= 0:
        return "unloading"
    minutes, seconds = divmod(int(left), 60)
    return f"unloads in {minutes} min {seconds} s" if minutes else f"unloads in {seconds} s"


def native_model_facts(model: RoutedModel, now_wall: float | None) -> str:
    """What Ollama or LM Studio say of a model, in a line: "268.10M Q4_K_M · ctx 4,096 · 0.5 GiB · 100% CPU
    · unloads in 4 min 12 s"."""
    parts = [" ".join(p for p in (model.parameters, model.quantization) if p)]
    if model.context_tokens:
        parts.append(f"ctx {model.context_tokens:,}")
    if model.size_bytes:
        parts.append(f"{model.size_bytes / 2**30:.1f} GiB")
    parts.append(processor_words(model.size_bytes, model.vram_bytes) or "")
    if now_wall is not None:
        parts.append(keep_alive_words(model.expires_wall, now_wall) or "")
    return " · ".join(p for p in parts if p)
