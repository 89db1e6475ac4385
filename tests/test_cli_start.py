"""`enginetop --version` answers without importing any command: neither Textual, httpx nor the engines'
tables (issue 51's start-up; its time is measured by bench/, never here)."""

from __future__ import annotations

import subprocess
import sys


def test_version_imports_no_command() -> None:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tui", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("enginetop "), done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    for heavy in ("textual", "httpx", "tui.engines.known", "tui.cli.dashboard", "tui.cli.bench", "psutil"):
        assert heavy not in imported, heavy
