"""The command line: the dashboard (no command), and every command, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from tui.base.secrets import SecretError
from tui.cli.options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, exit_code_table

# The commands' modules, in the order `enginetop --help` lists them: imported only to build the parser, so
# that `enginetop --version` imports none of them (nor Textual, httpx or the engines' tables they import)
COMMAND_MODULES = ("snapshot", "probe", "lifecycle", "compare", "bench", "record", "proxy", "exporter",
                   "rules", "web", "setup")


def _version() -> str:
    try:
        return version("enginetop")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginetop", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=exit_code_table(),
        description="Watch LLM inference engines and the GPU under them. With no --engine, --profile or "
                    "--prometheus, finds the engines running on this machine and watches them (unless "
                    "--no-discover); --demo starts the bundled demo (a real llama-server with Gemma 3 270M).")
    parser.add_argument("--version", action="version", version=f"enginetop {_version()}")
    dashboard = importlib.import_module("tui.cli.dashboard")
    dashboard.add_dashboard_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"tui.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(f"enginetop {_version()}")  # at once: nothing of the commands is imported for it
        return 0
    from tui.cli.dashboard import cmd_dashboard
    from tui.run.targets import TargetError

    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", cmd_dashboard)
    try:
        return int(func(args) or 0)
    except (TargetError, SecretError) as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
