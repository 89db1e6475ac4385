"""Ollama: what enginetop knows of it (no Ollama runs here; read from its source, github.com/ollama/ollama:
envconfig/config.go for its settings, llm/llama_server.go for how `ollama serve` starts a runner per loaded
model, api/types.go for its API). It is set up through its environment (OLLAMA_*), not a command line:
`ollama serve` takes no options, and each runner it starts carries the model's settings in llama-server's
names (since 0.3x the runner is llama.cpp's own llama-server; before, `ollama runner --model … --ctx-size …
--batch-size … --n-gpu-layers … --threads … --parallel … --port …`).
What its API answers is read by tui.sources.native_servers; its settings by tui.sources.config."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tui.base.secrets import mask_urls, says_secret
from tui.engines.argv import ONE, SWITCH, Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name

# the runner's flags (runner/llamarunner): llama-server's names, one value each but the switches
OPTIONS = Options(
    engine="Ollama",
    nargs={**dict.fromkeys(("--model", "--ctx-size", "--batch-size", "--n-gpu-layers", "--main-gpu",
                            "--threads", "--parallel", "--port", "--lora", "--tensor-split",
                            "--kv-cache-type", "--cache-type-k", "--cache-type-v", "--mmproj"), ONE),
           **dict.fromkeys(("--flash-attn", "--no-mmap", "--mlock", "--multiuser-cache", "--verbose",
                            "--ollama-engine", "--embedding"), SWITCH)},
    secret=frozenset(),
)


def is_ollama(argv: Sequence[str]) -> bool:
    """`ollama serve` (the server) or `ollama runner` (one model's process it starts); not `ollama run` and
    the other commands of its client."""
    if not argv or program_name(argv).removesuffix(".exe").lower() != "ollama":
        return False
    return any(arg in ("serve", "runner") for arg in argv[1:4])


def settings(environ: Mapping[str, str], secrets: Sequence[str] = ()) -> tuple[tuple[str, str], ...]:
    """Its OLLAMA_* settings (envconfig/config.go) as the environment gives them: a value whose name says
    secret masked, a URL's credentials masked, and `secrets` (the key enginetop was given) wherever they
    appear."""
    out = []
    for k in sorted(environ):
        if not k.startswith("OLLAMA_"):
            continue
        value = "***" if says_secret(k) else mask_urls(environ[k])
        for secret in secrets:
            value = value.replace(secret, "***") if secret else value
        out.append((k, value))
    return tuple(out)


def _no_spec(depth: int, now: int | None, kind: str | None = None) -> str:
    return "Ollama has no speculative decoding"


def _no_draft(kind: str | None) -> DraftKind:
    return "unknown"


ENGINE = EngineKnowledge(
    dialect="ollama", name="Ollama", program="Ollama", options=OPTIONS, is_engine=is_ollama,
    # server/routes.go: a prompt over the context is truncated unless "truncate": false, then refused so
    refusal_words=re.compile(r"input length exceeds the context length", re.IGNORECASE),
    prefix_cache_on="Ollama keeps each slot's prompt cache by itself (OLLAMA_MULTIUSER_CACHE shares it "
                    "between users)",
    spec_depth=_no_spec,
    spec_off="Ollama has no speculative decoding",
    context_option="num_ctx (a request's option) or OLLAMA_CONTEXT_LENGTH",
    slots_option="OLLAMA_NUM_PARALLEL",
    memory_options="a smaller num_ctx, OLLAMA_KV_CACHE_TYPE=q8_0 (with OLLAMA_FLASH_ATTENTION=1)",
    draft_kind=_no_draft,
)
