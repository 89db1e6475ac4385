"""A non-editable install (a wheel) carries the bundled profiles, so the console script finds them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_PROFILES = {"demo-cpu-threads1", "demo-cpu-threads2", "demo-vllm-gemma", "demo-vllm-tiny"}


def test_every_package_is_listed_in_pyproject() -> None:
    """pyproject lists its packages (the profiles mapping rules out `find`): a new subpackage must be
    added there or a wheel silently lacks it."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("tui", "widgets")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert listed == on_disk | {"tui.bundled_profiles"}


def test_wheel_install_loads_the_bundled_profiles(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("tui", "widgets", "profiles"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp_path / "dist").glob("enginetop-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    probe = (
        "import json, tui\n"
        "from tui.lifecycle.profile_files import load_profiles\n"
        "loaded = load_profiles()\n"
        "print(json.dumps({'tui': tui.__file__, 'issues': [str(i) for i in loaded.issues],\n"
        "                  'profiles': {n: str(p.path) for n, p in loaded.profiles.items()}}))\n"
    )
    elsewhere = tmp_path / "elsewhere"  # not the checkout, so nothing is found next to the cwd
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert Path(found["tui"]).is_relative_to(target)  # the wheel's copy, not the checkout's
    assert set(found["profiles"]) >= DEMO_PROFILES
    assert not [issue for issue in found["issues"] if "/demo-" in issue]  # (examples need ${VARS} set)
    bundled = target / "tui" / "bundled_profiles"
    assert all(Path(path).parent == bundled for path in found["profiles"].values())
