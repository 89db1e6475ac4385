"""The event loop of the headless commands that move requests (`enginetop probe`, `sweep`, `bench`, A/B
runs, `proxy`): uvloop where it is installed (a dependency everywhere but Windows), asyncio's own elsewhere.

Why: a probe is a read per token, and uvloop runs each read in C. Measured (bench/bench_probe.py, 10
streamed requests of 128 tokens on llama-server, the median of 3 rounds): the ProbeClient's CPU 0.80x a
bare blocking client's on uvloop, 1.12x on asyncio's loop. The proxy's accept and first read are loop
turns too: its added TTFT p50 1.50/1.58 ms on uvloop against 1.68/1.73 ms on asyncio's loop (two runs of
80 interleaved triples, direct and both proxies, on the real llama-server). The dashboard's probes keep
Textual's loop (there the redraw, not the network, is most of the cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:  # Windows: no uvloop
        return asyncio.run(main)
    return uvloop.run(main)
