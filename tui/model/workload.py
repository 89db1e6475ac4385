"""A workload as enginetop replays it: requests with their lengths, the prompt where the file has it, hash ids
of shared prefixes, their time or delay, and the session each belongs to. Read from any of the formats in
tui.workload.formats; None is "the file does not say"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    line: int  # where it came from in its file (1-based), for messages about it
    timestamp_ms: float | None = None  # from the trace's start
    delay_ms: float | None = None  # after its session's previous turn ended
    session_id: str | None = None
    input_length: int | None = None  # prompt tokens
    output_length: int | None = None  # tokens to generate
    hash_ids: tuple[int, ...] | None = None  # one per block of the prompt's tokens; equal ids, equal blocks
    prompt: str | None = None  # real text, a completion prompt or the user's turn
    messages: tuple[dict[str, Any], ...] | None = None  # real chat messages, as sent
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the request body (AIPerf `extra`)


@dataclass(frozen=True)
class Workload:
    path: str
    kind: str  # the format it was read as (tui.workload.formats.KINDS)
    requests: tuple[WorkloadRequest, ...]
    block_size: int | None = None  # tokens per hash id, where the format has ids
    tokenizer: str | None = None  # whose tokens the ids are of (an enginetop trace says)
    skipped: int = 0  # rows the format marks as failed (BurstGPT: 0 response tokens), left out

    @property
    def prompt_seed(self) -> str:
        """What prompts made from this workload's hash ids are drawn with: ids are numbered per trace, so
        another trace's id 0 must not make the same text (nor hit the same cache)."""
        return f"enginetop:{self.path}"

    @property
    def sessions(self) -> int:
        return len({r.session_id for r in self.requests if r.session_id is not None})
