"""The evidence of many requests, summed up for the judges: RequestFacts -> TrafficFacts."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tui.engines.known import REFUSAL_WORDS
from tui.model.counters import spec_window
from tui.model.findings import RequestFacts, SpecFacts, TrafficFacts
from tui.model.samples import EngineReading

# llama.cpp: "request (1524 tokens) exceeds"; vLLM: "your prompt contains at least 2049 input tokens" (it
# stops counting there: a lower bound), older vLLM "you requested 40000 tokens"
_PROMPT_TOKENS = re.compile(r"request \((\d+) tokens\)|(\d+) tokens in the (?:messages|prompt|input)|"
                            r"you requested (\d+) tokens|input \((\d+) tokens\)|contains (?:at least )?(\d+) "
                            r"input tokens", re.IGNORECASE)


def refused_for_length(status: int | None, words: str | None) -> str | None:
    """The engine's words when a 4xx answer refused a request for its length (in any engine's words: the proxy
    may not know which engine answered); None otherwise."""
    if status is None or not 400 <= status < 500 or not words or not REFUSAL_WORDS.search(words):
        return None
    return words.strip()[:300]


def refused_tokens(words: str | None, n_prompt: object = None) -> int | None:
    """How long the refused prompt was, from the engine's answer (llama.cpp's n_prompt_tokens, or its
    words)."""
    if isinstance(n_prompt, int) and not isinstance(n_prompt, bool):
        return n_prompt
    match = _PROMPT_TOKENS.search(words or "")
    return int(next(g for g in match.groups() if g)) if match else None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summarize(facts: Iterable[RequestFacts], max_in_flight: int | None = None) -> TrafficFacts:
    items = list(facts)
    ok = [f for f in items if f.ok]
    known = [f for f in ok if f.shared_tokens is not None and f.prompt_tokens is not None]
    cached = None
    if known and all(f.cached_tokens is not None for f in known):
        cached = sum(f.cached_tokens or 0 for f in known)
    prefill, source = None, None
    if known and all(f.engine_prompt_s is not None for f in known):
        prefill, source = sum(f.engine_prompt_s or 0.0 for f in known), "engine timings"
    elif known and all(f.ttft_s is not None for f in known):
        prefill, source = sum(f.ttft_s or 0.0 for f in known), "TTFT"
    lengths = [(f.prompt_tokens or 0) + (f.completion_tokens or 0) for f in ok if f.prompt_tokens is not None]
    refused = [f for f in items if f.refused_for_length]
    refused_lengths = [f.refused_prompt_tokens for f in refused if f.refused_prompt_tokens is not None]
    timed = [f for f in ok if f.ttft_s is not None and f.engine_prompt_s is not None]
    return TrafficFacts(
        requests=len(ok), shared_known=len(known),
        prompt_tokens=sum(f.prompt_tokens or 0 for f in known),
        shared_tokens=sum(f.shared_tokens or 0 for f in known),
        cached_tokens=cached, prefill_s=prefill, prefill_source=source,
        longest_tokens=max(lengths) if lengths else None,
        refused_for_length=len(refused), refused_words=refused[-1].refused_for_length if refused else None,
        refused_prompt_tokens=max(refused_lengths) if refused_lengths else None,
        ttft_p50_s=_median([f.ttft_s for f in timed if f.ttft_s is not None]),
        engine_prompt_p50_s=_median([f.engine_prompt_s for f in timed if f.engine_prompt_s is not None]),
        timed_requests=len(timed), max_in_flight=max_in_flight)


def spec_between(before: EngineReading | None, after: EngineReading | None) -> SpecFacts | None:
    """Speculative decoding between two readings of one engine: drafts, drafted and accepted tokens, accepted
    tokens per draft position. None where the engine does not draft (or does not say), where a reading is
    missing, or where the engine restarted between them (tui.model.counters)."""
    if before is None:
        return None
    return spec_window(before, after)
