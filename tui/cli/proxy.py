"""`enginetop proxy`: put a measuring proxy in front of engines, headless, until SIGTERM/SIGINT/SIGHUP.

Exit status: 0 after a signal, 2 for bad input (an engine spec, a --listen address that is taken or not
loopback without --allow-remote, an unwritable trace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tui.base.defaults import BLOCK_SIZE, CONNECT_TIMEOUT_S, MAX_BODY_BYTES, METRICS_PATH, TRAFFIC_PATH
from tui.cli.options import EXIT_BAD_INPUT

if TYPE_CHECKING:
    from tui.model.traffic import RequestRecord
    from tui.proxy.options import ProxyOptions


def add_proxy_trace_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The trace flags, shared by `enginetop proxy` and the dashboard (there under --proxy-...)."""
    parser.add_argument(f"--{prefix}trace", type=Path, metavar="FILE",
                        help="write a replayable trace of every finished request to FILE (Mooncake JSONL, "
                             "as AIPerf's mooncake_trace reads it; what a replay needs beside it in "
                             "FILE.meta.json)")
    parser.add_argument(f"--{prefix}block-size", type=int, default=BLOCK_SIZE, metavar="TOKENS",
                        help=f"tokens per hash_ids block in the trace (default {BLOCK_SIZE})")
    parser.add_argument(f"--{prefix}capture-content", action="store_true",
                        help="also keep prompts and replies, in FILE.content.jsonl (never headers or keys)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "proxy", help="measure your own traffic: a proxy in front of engines, with a replayable trace",
        description="Point your app or agent at the proxy instead of the engine. Every path and method is "
                    "forwarded unchanged; each generation request is measured (TTFT, inter-token gaps, "
                    "tokens and cached tokens as the engine counted them) and served at "
                    f"http://LISTEN{METRICS_PATH} (Prometheus) and {TRAFFIC_PATH} (what the dashboard "
                    "reads: enginetop --engine NAME=URL --traffic http://LISTEN).")
    p.add_argument("--engine", action="append", metavar="NAME=URL", required=True,
                   help="an engine to put the proxy in front of (repeatable)")
    p.add_argument("--listen", action="append", metavar="[NAME=]HOST:PORT", required=True,
                   help="where the proxy for engine NAME listens (one per engine; NAME= optional with one)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen (the proxy adds no authentication of its own)")
    add_proxy_trace_args(p)
    p.add_argument("--max-body", type=float, default=MAX_BODY_BYTES / 2**20, metavar="MIB",
                   help="refuse request bodies over this many MiB with 413 (default %(default)g)")
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="SECONDS",
                   help="give up connecting to the engine after this long (there is no total timeout: a "
                        f"long generation is never cut; default {CONNECT_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_proxy)


def proxy_options(listens: list[str], names: list[str], allow_remote: bool, trace: Path | None,
                  block_size: int, capture_content: bool, flag: str = "--listen",
                  **limits: Any) -> ProxyOptions:
    """Checked before anything starts: addresses (free, loopback unless allowed), block size, trace file."""
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.net.listen import check_free
    from tui.proxy.options import ProxyOptions, parse_listens

    if block_size < 1:
        raise ValueError(f"--block-size must be at least 1, got {block_size}")
    if capture_content and trace is None:
        raise ValueError("--capture-content needs a trace file (--trace FILE)")
    parsed = parse_listens(listens, names, allow_remote, flag)
    for listen in parsed.values():
        check_free(listen, flag)
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        with trace.open("ab"):  # unwritable: say so now, not after the first request
            pass
    return ProxyOptions(parsed, trace, block_size, capture_content, **limits)


def cmd_proxy(args: argparse.Namespace) -> int:
    from tui.net.listen import ListenError
    from tui.net.loop import run_loop
    from tui.proxy.options import build_proxy
    from tui.run.targets import build_targets

    try:
        targets = build_targets(args.engine)
        if args.max_body <= 0 or args.connect_timeout <= 0:
            raise ValueError("--max-body and --connect-timeout must be positive")
        options = proxy_options(args.listen, [t.name for t in targets], args.allow_remote, args.trace,
                                args.block_size, args.capture_content,
                                max_body_bytes=int(args.max_body * 2**20),
                                connect_timeout_s=args.connect_timeout)
        proxy = build_proxy(options, targets)
    except (ListenError, ValueError, OSError) as exc:
        print(f"enginetop proxy: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_loop(_serve(proxy, options))


def _say_failure(record: RequestRecord) -> None:
    if record.outcome == "error" and record.status is None:  # the engine never answered: worth a line
        print(f"enginetop proxy: {record.engine} {record.path}: {record.error}", file=sys.stderr, flush=True)


async def _serve(proxy: Any, options: ProxyOptions) -> int:
    import asyncio
    import signal

    from tui.net.listen import ListenError
    from tui.proxy.trace import content_path, meta_path

    try:
        await proxy.start()
    except ListenError as exc:
        print(f"enginetop proxy: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    proxy.listeners.append(_say_failure)
    for route in proxy.routes:
        print(f"enginetop proxy: {route.engine} ({route.upstream}) on {route.proxy_url}; its figures at "
              f"{route.proxy_url}{METRICS_PATH}", file=sys.stderr, flush=True)
    if options.trace is not None:
        extra = f" and {content_path(options.trace)}" if options.capture_content else ""
        print(f"enginetop proxy: tracing to {options.trace} ({meta_path(options.trace)}{extra})",
              file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proxy.stop()
    total = sum(book.total for book in proxy.books.values())
    traced = f", {proxy.trace.written} traced" if proxy.trace is not None else ""
    print(f"enginetop proxy: stopped after {total} requests{traced}", file=sys.stderr, flush=True)
    if proxy.trace is not None and proxy.trace.failures:
        print(f"enginetop proxy: {len(proxy.trace.failures)} requests not traced; last: "
              f"{proxy.trace.failures[-1]}", file=sys.stderr)
    return 0
