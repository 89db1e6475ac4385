"""The command line: the dashboard (no command), and every command, each registered by its own module."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from tui.base.secrets import SecretError
from tui.cli import (
    bench,
    compare,
    dashboard,
    exporter,
    lifecycle,
    probe,
    proxy,
    record,
    rules,
    setup,
    snapshot,
    web,
)
from tui.cli.options import EXIT_BAD_INPUT, EXIT_INTERRUPTED, exit_code_table
from tui.run.targets import TargetError

# In the order `enginetop --help` lists them.
COMMANDS = (snapshot, probe, lifecycle, compare, bench, record, proxy, exporter, rules, web, setup)


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
    dashboard.add_dashboard_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", dashboard.cmd_dashboard)
    try:
        return int(func(args) or 0)
    except (TargetError, SecretError) as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
