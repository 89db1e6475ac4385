"""`make engine`'s check starts the built llama-server once and asks it for a token: a build that installs
but dies at its first matrix multiply (an instruction the CPU or VM refuses) is caught there, in words."""

from __future__ import annotations

import sys

import pytest

from tui.engines import llamacpp


def test_the_built_engine_answers_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert llamacpp.main(["--check"]) == 0
    assert "llama-server answered a request" in capsys.readouterr().out


def test_an_engine_killed_by_an_illegal_instruction_is_reported(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    dies = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
    monkeypatch.setattr(llamacpp, "demo_argv", lambda port, *extra: dies)
    assert llamacpp.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "llama-server died (signal SIGILL) on its first request" in err
    assert "Delete the cached wheel" in err and "make engine" in err
