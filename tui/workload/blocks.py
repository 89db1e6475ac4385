"""A/B blocks made of a workload's requests (`enginetop ab P Q --workload FILE`): the interleaved comparison
of tui.compare.ab, its blocks replaying the user's own requests instead of a probe workload.

The block at one place in the schedule (instance i, block b) gets the same requests on every arm: the
workload's requests from (i x blocks + b) x n on, n of them, wrapping around. They go one after another (one
in flight, as a probe block's do), each asking for its recorded output length, exactly; a session's turns
within the block carry the replies this engine gave. Prompts made from hash ids are made in each engine's own
tokens (tui.workload.prompts); fresh text (lengths without ids) never repeats from one block to the next.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tui.model.targets import EngineTarget
from tui.model.workload import Workload
from tui.probe.client import ProbeLimits, ProbeTarget
from tui.probe.results import ProbeResult
from tui.workload.bench import DEFAULT_OUTPUT, Bench
from tui.workload.prompts import Tokens
from tui.workload.schedule import plan

FRESH_PER_BLOCK = 1_000_000  # fresh-text numbers each block may use before the next block's begin


class WorkloadBlocks:
    def __init__(self, workload: Workload, blocks_per_instance: int, *, model: str | None = None,
                 limits: ProbeLimits | None = None, tokenizer: Tokens | None = None) -> None:
        if not workload.requests:
            raise ValueError(f"{workload.path} has no requests")
        self.workload = workload
        self.blocks_per_instance = blocks_per_instance
        self.model = model
        self.limits = limits
        self.tokenizer = tokenizer
        self.prompt_notes: dict[str, str] = {}  # engine URL -> why its prompts are approximate

    def chosen(self, position: int, n: int) -> Workload:
        reqs = self.workload.requests
        start = position * n
        # one after another with no think time between turns: a block measures the engine, not the user
        picked = tuple(replace(reqs[(start + i) % len(reqs)], delay_ms=None) for i in range(n))
        return Workload(self.workload.path, self.workload.kind, picked, block_size=self.workload.block_size,
                        tokenizer=self.workload.tokenizer)

    async def requests(self, target: ProbeTarget, instance: int, block: int, n: int) -> list[ProbeResult]:
        position = instance * self.blocks_per_instance + block
        engine = EngineTarget(target.name, target.url, target.api_key, getattr(target, "basic_auth", None),
                              model=target.model)
        bench = Bench(engine, plan(self.chosen(position, n), "concurrency"), concurrency=1, model=self.model,
                      block_size=self.workload.block_size, limits=self.limits,
                      fresh_from=position * FRESH_PER_BLOCK, prompt_seed=self.workload.prompt_seed,
                      tokenizer=self.tokenizer)
        run = await bench.go()
        if run.prompt_note:
            self.prompt_notes[target.url] = run.prompt_note
        return [r for _, r in sorted(run.results, key=lambda x: x[0].index)]

    def facts(self) -> dict[str, Any]:
        """What a block's requests are, for the report's Method."""
        first = self.workload.requests[0]
        text = first.prompt or next((m.get("content") for m in reversed(first.messages or ())
                                     if isinstance(m.get("content"), str)), None)
        return {
            "workload": f"{self.workload.path} ({self.workload.kind})",
            "replay": True,
            "workload_requests": len(self.workload.requests),
            "max_tokens": first.output_length or DEFAULT_OUTPUT,
            "ignore_eos": True,
            "first_prompt_start": (text or f"{first.input_length} tokens made from hash ids")[:60],
            "tokenizer": str(self.tokenizer.url) if self.tokenizer is not None else "each engine's own",
            "prompt_notes": dict(self.prompt_notes),
        }
