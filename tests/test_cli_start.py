"""`enginetop --version` answers without importing any command: neither Textual, httpx nor the engines'
tables; `enginetop --help` and every command's --help import only argparse, the stdlib and light modules of
the project (issue 51's start-up; its time is measured by bench/, never here)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tui.cli.main import COMMAND_MODULES, build_parser

# What a command imports when it runs, never for the parser: the packages (and any module in them) and the
# engines' option tables
HEAVY = ("textual", "httpx", "rich", "prometheus_client", "orjson", "psutil", "numpy", "plotext", "aiohttp",
         "tui.engines.options_llamacpp", "tui.engines.options_vllm", "tui.engines.known",
         "statistics", "tui.compare.stats")  # statistics brings decimal and fractions: ~0.5 MB


def _imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """`python -X importtime -m tui ARGS`, and the names of the modules it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tui", *args], capture_output=True,
                          text=True, timeout=60)
    return done, {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}


def test_version_imports_no_command() -> None:
    done, imported = _imported("--version")
    assert done.returncode == 0 and done.stdout.startswith("enginetop "), done.stderr[-2000:]
    for heavy in ("textual", "httpx", "tui.engines.known", "tui.cli.dashboard", "tui.cli.bench", "psutil"):
        assert heavy not in imported, heavy


def test_help_of_every_command_imports_nothing_heavy() -> None:
    """`enginetop --help` and `enginetop COMMAND --help` of every command of every module in COMMAND_MODULES:
    one process each, a few at once."""
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(sub.choices) >= len(COMMAND_MODULES)  # each module registers at least one command
    argvs = [["--help"], *([command, "--help"] for command in sub.choices)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda argv: _imported(*argv), argvs))
    inside = tuple(f"{heavy}." for heavy in HEAVY)
    for argv, (done, imported) in zip(argvs, runs, strict=True):
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert done.stdout.startswith(" ".join(["usage: enginetop", *argv[:-1]])), (argv, done.stdout[:200])
        assert len(imported) > 50, (argv, done.stderr[-2000:])  # -X importtime's lines were read
        heavy = sorted(name for name in imported if name in HEAVY or name.startswith(inside))
        assert not heavy, (argv, heavy)


def test_version_after_other_options_is_the_parsers_and_imports_nothing_heavy() -> None:
    """`--version` among other options goes through the parser (its version action), still without Textual."""
    done, imported = _imported("--no-discover", "--version")
    assert done.returncode == 0 and done.stdout.startswith("enginetop "), done.stderr[-2000:]
    inside = tuple(f"{heavy}." for heavy in HEAVY)
    assert not sorted(name for name in imported if name in HEAVY or name.startswith(inside))
