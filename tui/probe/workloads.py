"""Named, parameterised probe workloads: seeded, deterministic text behind a per-run nonce.

Every request starts its user message with a tag hashed from (nonce, seed, request index): the nonce is
random per WorkloadParams (so per run, per process), the index differs per request, and a hash differs
from its first character on, so no prompt cache (llama.cpp keeps the last prompt of each slot, vLLM and
SGLang share prefixes) can serve an earlier request's prompt and make TTFT lie; only the chat template's
own tokens before the user text can match. The text after the tag is seeded and deterministic. A fixed
nonce (`--nonce`) makes two runs send identical prompts when that is wanted.

The `agent` workload is the opposite on purpose: it grows one conversation within a run, so the cache
*should* hit from its second turn on; its first turn starts with the nonce like any other request.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from tui.base.defaults import WORKLOADS
from tui.model.samples import PromptProgress
from tui.probe.client import ProbeClient, ProbeTarget
from tui.probe.results import ProbeResult

# Common English words; most are one token with a leading space in the usual BPE/SentencePiece
# vocabularies, so N words are roughly N tokens. The server's usage says exactly how many.
_VOCAB_TEXT = (
    "the of and to in is was for on that with as by at from his her they this had are but not "
    "one all were when we there can an which their said if do will each about how up out them then "
    "she many some so these would other into has more two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after "
    "called just where most know get through back much before go good new write our used me man too "
    "any day same right look think also around another came come work three word must because does "
    "part even place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air line set "
    "own under read last never us left end along while might next sound below saw something thought "
    "both few those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life enough took "
    "sometimes four head above kind began almost live page got earth need far hand high year mother "
    "light parts country father let night following picture being study second eyes soon times story"
)
_VOCAB = _VOCAB_TEXT.split()

_TOPICS = (
    "a lighthouse keeper who finds a map", "a city that moves at night", "a river that forgets its source",
    "two clocks that disagree", "a garden on a ship", "a letter that arrives a century late",
    "a mountain village and its last bell", "a robot learning to paint", "a library with no doors",
)

SHORT_MAX_TOKENS = 128
AGENT_MAX_TOKENS = 64


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    max_tokens: int | None = None  # None: the workload's own default
    prompt_tokens: int = 8192  # long-prefill: approximate prompt length (the demo server has 4096 ctx)
    seed: int = 0
    ignore_eos: bool = True  # llama.cpp, vLLM and SGLang honour it; it keeps the output length fixed
    model: str | None = None  # sent only when given (llama.cpp ignores it; vLLM defaults to its model)
    agent_context_tokens: int = 600  # agent: size of the first message (like a system prompt with tools)
    agent_turn_tokens: int = 60  # agent: size of each new user message
    # Hashed into every prompt's first word; drawn anew for every WorkloadParams (see the module docstring).
    nonce: str = field(default_factory=lambda: secrets.token_hex(4))


def seeded_words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(max(0, n)))


def prompt_tag(params: WorkloadParams, index: int) -> str:
    """The first word of request `index`'s user message: unique per run, seed and request (module doc)."""
    key = f"{params.nonce}/{params.seed}/{index}".encode()
    return f"[{hashlib.blake2s(key, digest_size=6).hexdigest()}]"


def _base(params: WorkloadParams, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.model:
        body["model"] = params.model
    return body


def short_body(params: WorkloadParams, index: int) -> dict[str, Any]:
    seed = params.seed * 1_000_003 + index
    topic = _TOPICS[random.Random(seed).randrange(len(_TOPICS))]
    prompt = f"{prompt_tag(params, index)} Write a long story about {topic}. Do not stop early."
    return _base(params, [{"role": "user", "content": prompt}], params.max_tokens or SHORT_MAX_TOKENS)


def thinking_off_body(params: WorkloadParams, index: int) -> dict[str, Any]:
    body = short_body(params, index)
    body["chat_template_kwargs"] = {"enable_thinking": False}
    return body


def long_prefill_body(params: WorkloadParams, index: int) -> dict[str, Any]:
    seed = params.seed * 1_000_003 + index
    # Leave room for the template and the question; the server's usage reports the real count.
    filler = seeded_words(seed, params.prompt_tokens - 24)
    prompt = f"{prompt_tag(params, index)} {filler}\n\nAnswer with one word: what is the first word above?"
    body = _base(params, [{"role": "user", "content": prompt}], params.max_tokens or 1)
    body["return_progress"] = True  # llama-server streams its prefill progress; other engines ignore it
    return body


class AgentConversation:
    """A chat that grows like an agent loop: each turn appends the reply and a new user message."""

    def __init__(self, params: WorkloadParams) -> None:
        self.params = params
        context = seeded_words(params.seed * 7919 + 1, params.agent_context_tokens)
        tag = prompt_tag(params, 0)
        self.messages: list[dict[str, str]] = [
            {"role": "user", "content": f"{tag} You are a careful agent. Notes: {context}"},
            {"role": "assistant", "content": "Understood. Send the first task."},
        ]
        self.turn = 0
        self._pending: dict[str, str] | None = None

    def next_body(self) -> dict[str, Any]:
        self.turn += 1
        words = seeded_words(self.params.seed * 7919 + 1 + self.turn, self.params.agent_turn_tokens)
        task = f"Step {self.turn}. Tool output: {words}. Summarise it and say what to do next."
        self._pending = {"role": "user", "content": task}
        return _base(self.params, [*self.messages, self._pending], self.params.max_tokens or AGENT_MAX_TOKENS)

    def observe(self, result: ProbeResult) -> None:
        # A failed turn is dropped: the next turn re-asks from the last good state, as an agent would.
        if result.ok and self._pending is not None:
            self.messages += [self._pending, {"role": "assistant", "content": result.text}]


def request_body(workload: str, params: WorkloadParams, index: int) -> dict[str, Any]:
    """The body of request `index` of a stateless workload."""
    if workload == "short":
        return short_body(params, index)
    if workload == "thinking-off":
        return thinking_off_body(params, index)
    if workload == "long-prefill":
        return long_prefill_body(params, index)
    if workload == "agent":
        raise ValueError("the agent workload is stateful: use AgentConversation or run_workload")
    raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")


async def run_workload(
    client: ProbeClient, target: ProbeTarget, workload: str, params: WorkloadParams, repeat: int = 1,
    on_progress: Callable[[PromptProgress], None] | None = None,
) -> AsyncGenerator[ProbeResult, None]:
    """Send `repeat` requests one after another (agent: `repeat` turns), yielding each result; `on_progress`
    sees the prompt progress a long-prefill request streams (llama-server)."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    conversation = AgentConversation(params) if workload == "agent" else None
    for index in range(repeat):
        if conversation is not None:
            body = conversation.next_body()
            result = await client.chat(target, body, workload=workload, index=index, turn=conversation.turn,
                                       on_progress=on_progress)
            conversation.observe(result)
        else:
            body = request_body(workload, params, index)
            result = await client.chat(target, body, workload=workload, index=index, on_progress=on_progress)
        yield result
