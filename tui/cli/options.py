"""Option groups every command shares, so a flag means the same thing wherever it appears, and the one
table of exit codes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tui.base.defaults import DEFAULT_PORTS, KEEP_BYTES, KEEP_DAYS, PORTS_ENV

# The exit codes of every command (`enginetop --help` prints this table; so does the README).
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and what it did failed: every probe failed, a switch failed, a write failed
EXIT_BAD_INPUT = 2  # nothing was done: a bad flag, spec, profile, file or address (the message says which)
EXIT_ENGINE_DOWN = 3  # snapshot: an engine was down
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "the command ran and failed (every probe failed, a switch or a write failed)",
    EXIT_BAD_INPUT: "bad input, nothing done (flag, engine spec, profile, file, listen address)",
    EXIT_ENGINE_DOWN: "snapshot: at least one engine is down",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_code_table() -> str:
    return "exit codes:\n" + "\n".join(f"  {code:<4} {words}" for code, words in EXIT_CODES.items())


def add_targets(parser: argparse.ArgumentParser, *, profiles: bool = False) -> None:
    """--engine NAME=URL (repeatable) and its keys; `profiles`: --profile NAME too."""
    parser.add_argument("--engine", action="append", metavar="NAME=URL",
                        help="an engine, e.g. llama=http://127.0.0.1:8080 (repeatable; NAME= optional)")
    parser.add_argument("--api-key-file", action="append", metavar="NAME=PATH",
                        help="read engine NAME's API key from PATH (sent as a Bearer header, never shown; "
                             "NAME= may be left out with one engine); with no --engine, NAME as discovery "
                             "names a found engine (NAME= left out: only when the one engine found runs "
                             "as this user); with --prometheus, NAME as the fleet table shows it, "
                             "or * for every engine")
    parser.add_argument("--api-key-env", action="append", metavar="NAME=VAR",
                        help="read engine NAME's API key from environment variable VAR")
    if profiles:
        parser.add_argument("--profile", action="append", metavar="NAME",
                            help="start (or attach to) the engine of this profile (repeatable); "
                                 "`enginetop profiles` lists them")


def add_discover(parser: argparse.ArgumentParser) -> None:
    ports = ",".join(str(p) for p in DEFAULT_PORTS)
    parser.add_argument("--no-discover", action="store_true",
                        help="with no --engine, --profile or --prometheus, do not look for the engines "
                             "running on this machine (by default: listening processes recognised from their "
                             f"command line, and OpenAI-compatible servers on loopback ports {ports}, or "
                             f"those {PORTS_ENV} lists)")


def add_fleet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", metavar="URL",
                        help="read every engine (vLLM, SGLang, llama.cpp) and dcgm-exporter GPU that this "
                             "Prometheus scrapes, e.g. http://prom:9090: the fleet view")
    parser.add_argument("--match", metavar="SELECTOR",
                        help="only the engines these label matchers select, e.g. '{job=~\"vllm.*\"}'")
    parser.add_argument("--prometheus-key-file", metavar="PATH",
                        help="bearer token for a protected Prometheus, read from PATH (never shown)")
    parser.add_argument("--dcgm", action="append", metavar="URL",
                        help="read GPUs straight from this dcgm-exporter, e.g. http://node:9400/metrics "
                             "(repeatable; no Prometheus needed; this machine's NVML is then not read)")
    parser.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                        help="how often Prometheus / dcgm-exporter are read (default 5)")


def add_output(parser: argparse.ArgumentParser, *, output: str | None = None, required: bool = False,
               json: str | None = None) -> None:
    """-o/--output FILE (with `output` as its help) and --json (with `json` as its help). `--out` is still
    read, for scripts written before the flags were made one."""
    if output is not None:
        parser.add_argument("-o", "--output", "--out", dest="output", type=Path, metavar="FILE",
                            required=required, help=output)
    if json is not None:
        parser.add_argument("--json", action="store_true", help=json)


def add_retention(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep-days", type=float, default=KEEP_DAYS,
                        help=f"delete recordings in the data dir older than this (default {KEEP_DAYS:g})")
    parser.add_argument("--keep-gb", type=float, default=KEEP_BYTES / 2**30,
                        help=f"and the oldest past this total size, GiB (default {KEEP_BYTES / 2**30:g})")


def fleet_options(args: argparse.Namespace) -> Any:
    """FleetOptions from --prometheus/--dcgm (None when neither is given); the key file is read here."""
    from tui.run.targets import TargetError

    if not (args.prometheus or args.dcgm):
        if args.match or args.prometheus_key_file:
            raise TargetError("--match and --prometheus-key-file need --prometheus URL")
        return None
    from tui.base.secrets import read_api_key
    from tui.fleet.options import DEFAULT_REFRESH_S, FleetOptions  # the fleet's clients: only for a fleet
    for url in [args.prometheus or "http://x", *(args.dcgm or [])]:
        if not url.startswith(("http://", "https://")):
            raise TargetError(f"expected an http(s) URL, got {url!r}")
    refresh = getattr(args, "refresh", None) or DEFAULT_REFRESH_S
    if refresh <= 0:
        raise TargetError("--refresh must be a positive number of seconds")
    return FleetOptions(prometheus=args.prometheus, match=args.match, refresh_s=refresh,
                        token=read_api_key(args.prometheus_key_file) if args.prometheus_key_file else None,
                        dcgm=list(args.dcgm or []), timeout_s=min(5.0, max(1.0, refresh)))
