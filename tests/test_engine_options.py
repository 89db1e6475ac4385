"""The option tables enginetop ships (tui/engines/options_*.py) are the installed engines' own: read again
from llama-server's --help and from `vllm serve`'s argparse parser, they must be the same. A table gone stale
with an engine upgrade would mask what it should not, or miss a secret's new spelling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_option_tables_are_the_engines_own() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "engine_options.py"), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the shipped option tables match the engines" in out.stdout
