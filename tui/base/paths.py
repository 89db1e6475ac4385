"""Where enginetop keeps what outlives one clone: built engines, the demo model, logs."""

from __future__ import annotations

import os
from pathlib import Path


def safe_name(text: str) -> str:
    """`text` as a file name: letters, digits, - _ . kept, anything else (a / or a space) becomes _."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def cache_dir() -> Path:
    """Shared by every clone on the machine, so the ~8 min llama-server build happens once."""
    root = os.environ.get("ENGINETOP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "enginetop"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    root = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(root) / "enginetop"


def runs_dir() -> Path:
    """Per-instance logs and recordings of engines that enginetop launched."""
    path = cache_dir() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def live_dir() -> Path:
    """Where bench and capacity runs write their live figures for any dashboard to read
    (ENGINETOP_LIVE_DIR moves it: separate test runs, or separate users on one machine)."""
    path = Path(os.environ.get("ENGINETOP_LIVE_DIR") or runs_dir() / "live")
    path.mkdir(parents=True, exist_ok=True)
    return path


def sysfs_root() -> Path:
    """Where the kernel's sysfs is read from: /sys, or ENGINETOP_SYSFS_ROOT (a container with the host's /sys
    mounted elsewhere, a test's tree in the kernel's layout). Read at each use, so a test may move it."""
    return Path(os.environ.get("ENGINETOP_SYSFS_ROOT") or "/sys")
