"""Each engine's knowledge (tui.engines.knowledge.EngineKnowledge), by the dialect /metrics names
("llamacpp") or by the name a configuration gives ("llama.cpp")."""

from __future__ import annotations

import re

from tui.engines import llamacpp, sglang, vllm
from tui.engines.knowledge import EngineKnowledge

ENGINES: tuple[EngineKnowledge, ...] = (llamacpp.ENGINE, vllm.ENGINE, sglang.ENGINE)

# Every engine's words for a prompt longer than a request may hold: a refusal is read the same whichever
# engine said it (the proxy may not know which engine answered).
REFUSAL_WORDS = re.compile("|".join(f"(?:{e.refusal_words.pattern})" for e in ENGINES), re.IGNORECASE)


def by_dialect(dialect: str | None) -> EngineKnowledge | None:
    return next((e for e in ENGINES if e.dialect == dialect), None)


def by_name(name: str | None) -> EngineKnowledge | None:
    return next((e for e in ENGINES if e.name == name or e.dialect == name), None)
