"""Each engine's knowledge (tui.engines.knowledge.EngineKnowledge), by the dialect /metrics names
("llamacpp") or by the name a configuration gives ("llama.cpp")."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tui.engines import llamacpp, ollama, sglang, vllm
from tui.engines.knowledge import EngineKnowledge, program_name

ENGINES: tuple[EngineKnowledge, ...] = (llamacpp.ENGINE, vllm.ENGINE, sglang.ENGINE, ollama.ENGINE)

# Every engine's words for a prompt longer than a request may hold: a refusal is read the same whichever
# engine said it (the proxy may not know which engine answered).
REFUSAL_WORDS = re.compile("|".join(f"(?:{e.refusal_words.pattern})" for e in ENGINES), re.IGNORECASE)


def by_dialect(dialect: str | None) -> EngineKnowledge | None:
    return next((e for e in ENGINES if e.dialect == dialect), None)


def by_name(name: str | None) -> EngineKnowledge | None:
    return next((e for e in ENGINES if e.name == name or e.dialect == name), None)


def is_llama_swap(argv: Sequence[str]) -> bool:
    """llama-swap: a router in front of llama-servers it starts itself (tui.lifecycle.router reads it)."""
    return bool(argv) and program_name(argv).removesuffix(".exe") == "llama-swap"


def serving_program(argv: Sequence[str]) -> str | None:
    """What a command line serves, as a user names it: an engine's program ("llama-server", "vLLM",
    "SGLang"), or "llama-swap"; None for any other process (a proxy, a tunnel, a container's port-forward)."""
    if is_llama_swap(argv):
        return "llama-swap"
    return next((e.program for e in ENGINES if e.is_engine(argv)), None)
