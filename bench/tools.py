"""The peers the benches measure beside enginetop (AIPerf, LiteLLM), each installed on first use into its own
venv under the cache dir, never into enginetop's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def ensure_tool(venv: Path, requirement: str, exe_name: str, size: str = "a few minutes") -> Path:
    """venv/bin/exe_name, pip-installing `requirement` into venv the first time (idempotent)."""
    exe = venv / "bin" / exe_name
    if exe.exists():
        return exe
    if not (venv / "bin" / "python").exists():
        print(f"creating {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"installing {requirement} into {venv} ({size}) ...", flush=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", requirement], check=True)
    if not exe.exists():
        raise SystemExit(f"pip installed {requirement} but {exe} is missing")
    return exe
