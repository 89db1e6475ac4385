"""`make engine`'s check starts the built llama-server once and asks it for a token: a build that installs
but dies at its first matrix multiply (an instruction the CPU or VM refuses) is caught there, in words."""

from __future__ import annotations

import sys

import pytest

from tui.engines import install_llamacpp
from tui.lifecycle import check

pytestmark = pytest.mark.engine


def test_the_built_engine_answers_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main(["--check"]) == 0
    assert "llama-server answered a request" in capsys.readouterr().out


def test_an_engine_killed_by_an_illegal_instruction_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    dies = tmp_path / "llama-server"
    dies.write_text(f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    dies.chmod(0o755)
    monkeypatch.setattr(install_llamacpp, "llama_server_binary", lambda: dies)
    assert check.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "llama-server died (exit code -4 (killed by SIGILL)) before its first answer" in err
    assert "delete the cached wheel" in err and "`make engine`" in err  # in a checkout (tui.base.install)
