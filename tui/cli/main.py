"""The command line: the dashboard (no command), and every command, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from tui.base.secrets import SecretError
from tui.cli.options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, exit_code_table

# The commands' modules, in the order `enginetop --help` lists them: imported only to build the parser, so
# that `enginetop --version` imports none of them. Each imports at its top only what building its arguments
# needs; what a command runs is imported when it runs, so that `--help` and every other command never import
# it (nor Textual, httpx or the engines' tables): tests/test_cli_start.py holds them to it.
COMMAND_MODULES = ("snapshot", "probe", "lifecycle", "compare", "bench", "record", "proxy", "exporter",
                   "rules", "web", "setup")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # ~40 ms: only when the version is asked

    try:
        return version("enginetop")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse._VersionAction):
    """argparse's --version, its text read only when it is given (not for every parse, nor for --help)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        self.version = f"enginetop {_version()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginetop", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=exit_code_table(),
        description="Watch LLM inference engines and the GPU under them. With no --engine, --profile or "
                    "--prometheus, finds the engines running on this machine and watches them (unless "
                    "--no-discover); --demo starts the bundled demo (a real llama-server with Gemma 3 270M).")
    parser.add_argument("--version", action=_VersionAction)
    dashboard = importlib.import_module("tui.cli.dashboard")
    dashboard.add_dashboard_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"tui.cli.{name}").register(sub)
    return parser


def _target_error() -> type[Exception]:
    """tui.run.targets.TargetError, imported only once a command raised something: that module imports httpx
    and the engines' tables, which `--help` and most commands never need (a command that raised it has
    imported it already)."""
    from tui.run.targets import TargetError

    return TargetError


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(f"enginetop {_version()}")  # at once: nothing of the commands is imported for it
        return 0
    from tui.cli.dashboard import cmd_dashboard

    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", cmd_dashboard)
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (_target_error(), SecretError) as exc:  # _target_error() runs only when an exception gets here
        print(f"enginetop: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
