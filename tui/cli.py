"""Command line: the dashboard (default), `snapshot`, and the subcommands of probe, lifecycle, compare."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path

from tui.targets import TargetError, build_targets

# Each area adds its own subcommands with a `register(subparsers)` function.
SUBCOMMAND_MODULES = ("tui.probe.cli", "tui.lifecycle.cli", "tui.compare.cli")


def _add_target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME=URL",
                        help="engine to watch, e.g. llama=http://127.0.0.1:8080 (repeatable)")
    parser.add_argument("--api-key-file", action="append", metavar="NAME=PATH",
                        help="read engine NAME's API key from PATH (sent as a Bearer header, never shown)")
    parser.add_argument("--api-key-env", action="append", metavar="NAME=VAR",
                        help="read engine NAME's API key from environment variable VAR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginetop",
        description="Watch LLM inference engines and the GPU under them. With no --engine, starts the "
                    "bundled demo (a real llama-server with Gemma 3 270M) and watches it.")
    _add_target_args(parser)
    parser.add_argument("--interval", type=float, default=1.0, help="engine poll interval, seconds")
    parser.add_argument("--horizon", type=float, default=300.0, help="seconds of history on the plots")
    parser.add_argument("--demo", choices=["llama", "both"], default=None,
                        help="start the bundled demo engines (default when no --engine is given: llama)")
    parser.add_argument("--screenshots", type=Path, default=Path("screenshots"),
                        help="where key `s` saves SVG screenshots")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    snap = sub.add_parser("snapshot", help="two readings of every source as one JSON object")
    _add_target_args(snap)
    snap.add_argument("--interval", type=float, default=1.0, help="seconds between the two readings")
    snap.add_argument("--timeout", type=float, default=2.0, help="per-request timeout, seconds")
    snap.add_argument("--json", action="store_true", help="print JSON (the only format for now)")
    snap.set_defaults(func=cmd_snapshot)

    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(sub)
    return parser


def cmd_snapshot(args: argparse.Namespace) -> int:
    from tui.snapshot import EXIT_ENGINE_DOWN, any_engine_down, take_snapshot

    if not args.engine:
        print("enginetop snapshot: give at least one --engine NAME=URL", file=sys.stderr)
        return 2
    targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
    snapshot = asyncio.run(take_snapshot(targets, interval=args.interval, timeout=args.timeout))
    print(json.dumps(snapshot, indent=2))
    return EXIT_ENGINE_DOWN if any_engine_down(snapshot) else 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tui.app import AppConfig, EnginetopApp

    targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
    demo = None
    if args.demo or not targets:
        from tui.demo import Demo

        demo = Demo(kind=args.demo or "llama")
        targets = targets + demo.start()
    try:
        config = AppConfig(targets=targets, poll_interval_s=args.interval, horizon_s=args.horizon,
                           screenshot_dir=args.screenshots,
                           launched_pids=demo.pids() if demo else {})
        EnginetopApp(config).run()
    finally:
        if demo is not None:
            demo.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", cmd_dashboard)
    try:
        return int(func(args) or 0)
    except TargetError as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
