"""Reading the kernel's files (sysfs, /proc): one way for every reader here (RAPL, the AMD and Intel
GPUs), and the function their tests replace to make a read fail as it does for a user who is not root."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str:
    """The file's whole text. sysfs files are read in one go: a value is only consistent within one read."""
    with open(path) as f:
        return f.read()
