"""The dashboard: its options (`enginetop web` serves the same ones), starting it, and what it leaves."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from tui.base.defaults import WORKLOADS
from tui.cli.options import EXIT_BAD_INPUT, add_discover, add_fleet, add_retention, add_targets, fleet_options
from tui.cli.proxy import add_proxy_trace_args, proxy_options
from tui.cli.setup import build_demo_engine
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR

DEMO_PROFILES = {"llama": ["demo-cpu-threads2"], "both": ["demo-cpu-threads2", "demo-vllm-gemma"]}


def add_dashboard_args(parser: argparse.ArgumentParser) -> None:
    """The dashboard's options; `enginetop web` takes the same ones and hands them to each tab's dashboard."""
    add_targets(parser, profiles=True)
    parser.add_argument("--demo", choices=sorted(DEMO_PROFILES), default=None, nargs="?", const="llama",
                        help="start the bundled demo: llama (llama.cpp only, the default) or both (llama.cpp "
                             "and vLLM on the same Gemma 270M)")
    add_discover(parser)
    parser.add_argument("--keep-engines", action="store_true",
                        help="leave the engines enginetop started running when it quits")
    parser.add_argument("--interval", type=float, default=1.0, help="engine poll interval, seconds")
    parser.add_argument("--horizon", type=float, default=None,
                        help="seconds of history on the plots (default 300; 1800 in the fleet view)")
    add_fleet(parser)
    parser.add_argument("--probe-every", type=float, default=None, metavar="SECONDS",
                        help="probe every watched engine this often (default: only on key f; engines "
                             "enginetop starts are probed every 10 s)")
    parser.add_argument("--probe-workload", default="short",
                        choices=list(WORKLOADS))
    parser.add_argument("--probe-max-tokens", type=int, default=64)
    parser.add_argument("--ttft-gap-factor", type=float, default=DEFAULT_TTFT_GAP_FACTOR, metavar="X",
                        help="flag a probe whose client TTFT is over X times the engine's own "
                             f"(default {DEFAULT_TTFT_GAP_FACTOR:g})")
    parser.add_argument("--sweep-levels", default="1,2,4,8,16,32", help="concurrency levels for key c")
    parser.add_argument("--sweep-seconds", type=float, default=10.0, help="seconds per sweep level")
    parser.add_argument("--bandwidth", metavar="RATE",
                        help="memory bandwidth for the roofline when NVML cannot give it, e.g. 1.79TB/s")
    parser.add_argument("--model-bytes", metavar="SIZE",
                        help="weight bytes read per token for the roofline, e.g. 14GB (default: model file)")
    parser.add_argument("--screenshots", type=Path, default=Path("screenshots"),
                        help="where key `s` saves SVG screenshots")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="level of enginetop.log (in the runs folder; rotated at 1 MB, 3 kept)")
    parser.add_argument("--log-http", action="store_true",
                        help="also log every HTTP request to the engines, a line each (off by default)")
    parser.add_argument("--record", type=Path, metavar="PATH",
                        help="record this session to PATH (default: a new file per session in "
                             "~/.local/share/enginetop/recordings)")
    parser.add_argument("--no-record", action="store_true", help="do not record this session")
    parser.add_argument("--proxy-listen", action="append", metavar="[NAME=]HOST:PORT",
                        help="run a traffic proxy for engine NAME here and show its traffic (one per proxied "
                             "engine; point your app at it instead of the engine)")
    add_proxy_trace_args(parser, prefix="proxy-")
    parser.add_argument("--traffic", action="append", metavar="URL",
                        help="show the traffic a separate `enginetop proxy` measures, e.g. "
                             "http://127.0.0.1:8081 (repeatable)")
    add_retention(parser)


def cmd_dashboard(args: argparse.Namespace) -> int:
    # imported when the command runs, so --help and the other commands never pay for it
    import logging

    from tui.base.paths import runs_dir
    from tui.compare.roofline import parse_bandwidth, parse_bytes
    from tui.lifecycle.profile_files import load_profiles
    from tui.lifecycle.profiles import ProfileError
    from tui.probe.sweep import SweepConfig, parse_levels
    from tui.run.targets import build_targets, keys_by_name
    from tui.ui.app import EnginetopApp
    from tui.ui.config import AppConfig

    fleet = fleet_options(args)
    fleet_table = fleet is not None and fleet.prometheus is not None
    if fleet_table:  # the keys name engines of the fleet (or "*"), for probes of an engine opened from it
        assert fleet is not None
        targets = build_targets(args.engine)
        fleet.engine_keys = keys_by_name(args.api_key_file, args.api_key_env)
    else:
        targets = build_targets(args.engine, args.api_key_file, args.api_key_env,
                                discovering=not (args.engine or args.profile or args.demo or fleet))
    names = list(args.profile or [])
    if fleet_table and (targets or names or args.demo):
        print("enginetop: --prometheus shows the fleet table; watch single engines without it",
              file=sys.stderr)
        return 2
    if args.horizon is None:
        args.horizon = 1800.0 if fleet_table else 300.0
    notes: list[str] = []
    if args.demo:
        names += DEMO_PROFILES[args.demo]
    elif not (targets or names or fleet):
        try:
            targets, notes = _discovered(args.no_discover, args.api_key_file, args.api_key_env)
        except ValueError as exc:  # a bad ENGINETOP_DISCOVER_PORTS, a key for no engine found
            print(f"enginetop: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    loaded = load_profiles()
    try:
        profiles = [loaded.get(name) for name in names]
    except ProfileError as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    if args.demo and (failed := build_demo_engine()) is not None:  # from a wheel: llama-server, said first
        return failed
    for problem in _cannot_start(profiles):  # said here too: the profile's column says it while the app runs
        print(f"enginetop: {problem}", file=sys.stderr)
    try:
        if args.horizon <= 0 or args.interval <= 0:
            raise ValueError("--horizon and --interval must be positive numbers of seconds")
        if not args.ttft_gap_factor > 0:
            raise ValueError(f"--ttft-gap-factor must be positive, got {args.ttft_gap_factor}")
        sweep = SweepConfig(levels=parse_levels(args.sweep_levels, "--sweep-levels"),
                            duration_s=args.sweep_seconds)
        bandwidth = parse_bandwidth(args.bandwidth) if args.bandwidth else None
        model_bytes = parse_bytes(args.model_bytes) if args.model_bytes else None
        proxy = None
        if args.proxy_listen:
            names = [t.name for t in targets] + [p.name for p in profiles]
            proxied = [spec.partition("=")[0] for spec in args.proxy_listen if "=" in spec] or names[:1]
            proxy = proxy_options(args.proxy_listen, [n for n in names if n in proxied], False,
                                  args.proxy_trace, args.proxy_block_size, args.proxy_capture_content,
                                  flag="--proxy-listen")
        elif args.proxy_trace or args.proxy_capture_content:
            raise ValueError("--proxy-trace and --proxy-capture-content need --proxy-listen")
        for url in args.traffic or ():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--traffic: expected the proxy's http(s) URL, got {url!r}")
    except (ValueError, OSError) as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    log_to_file(runs_dir() / "enginetop.log", getattr(logging, args.log_level), http=args.log_http)
    log = logging.getLogger("tui.cli")
    config = AppConfig(
        targets=targets, profiles=profiles,
        switchable=[p for p in loaded.profiles.values() if not p.attach or p.router_model],
        probe_every_s=args.probe_every, probe_every_managed_s=args.probe_every or 10.0,
        probe_workload=args.probe_workload, probe_max_tokens=args.probe_max_tokens, sweep=sweep,
        ttft_gap_factor=args.ttft_gap_factor,
        poll_interval_s=args.interval, horizon_s=args.horizon, screenshot_dir=args.screenshots,
        bandwidth_bps=bandwidth, model_bytes=model_bytes, fleet=fleet, proxy=proxy,
        traffic=list(args.traffic or ()), notes=notes)
    if not args.no_record:
        from tui.cli.record import fleet_meta, open_recorder
        from tui.run.targets import profile_target

        try:
            config.recorder = open_recorder(
                args.record, [*targets, *(profile_target(p) for p in profiles)], args, log.warning,
                fleet_meta(fleet),
                secrets=tuple(fleet.engine_keys.values()) if fleet is not None else ())
        except Exception as exc:  # sqlite3.Error or OSError: say why, and watch without recording
            print(f"enginetop: not recording: cannot write {args.record or 'the recording'}: {exc}",
                  file=sys.stderr)
    app = EnginetopApp(config)
    try:
        app.run()
    finally:
        _after_dashboard(app, keep=args.keep_engines)
        if config.recorder is not None:
            config.recorder.close()
    return 0


def _discovered(off: bool, key_files: list[str] | None = None,
                key_envs: list[str] | None = None) -> tuple[list[Any], list[str]]:
    """The engines running on this machine as targets, with the keys the key flags give them by the names
    found, and what to say of them (also said on stderr now)."""
    from tui.run.discovery import discover, start_hints
    from tui.run.targets import discovered_targets
    from tui.sources.discover_keys import check_unnamed_keys

    found = None if off else discover()
    notes = found.report() if found is not None else [
        "no engine given, and --no-discover: nothing to watch", *start_hints()]
    for line in notes:  # before a key flag naming none of them is refused: the names it could give
        print(f"enginetop: {line}", file=sys.stderr, flush=True)
    # a key that names no engine goes only to the one found that is this user's own (UnnamedKeyError, a
    # ValueError: said by the caller, which exits with EXIT_BAD_INPUT)
    check_unnamed_keys(found.engines if found is not None else [], key_files, key_envs)
    return discovered_targets(found.engines if found is not None else [], key_files, key_envs), notes


def _cannot_start(profiles: list[Any]) -> list[str]:
    """Why each profile cannot start, found before anything is started (a missing engine or model, a variable
    not set): the app still runs, and the profile's column says the same."""
    from tui.lifecycle.profile_resolve import resolve
    from tui.lifecycle.profiles import ProfileError

    problems = []
    for profile in profiles:
        try:
            resolve(profile)
        except ProfileError as exc:
            problems.append(str(exc))
    return problems


def _after_dashboard(app: Any, keep: bool) -> None:
    """Stop what the dashboard started (unless --keep-engines) and say so, on stderr and in the log."""
    import logging

    log = logging.getLogger("tui.cli")

    def say(message: str) -> None:
        log.warning(message)
        with contextlib.suppress(OSError):  # after SIGHUP there may be no terminal left to write to
            print(f"enginetop: {message}", file=sys.stderr, flush=True)

    why = "quit" if app.quit_reason == "q" else f"{app.quit_reason} received"
    if app.ab_running:
        say(f"{why} during the A/B run: it was interrupted and nothing of it was saved")
    # (a column whose start failed with nothing running has nothing to stop)
    managed = [slot for slot in app.slots if slot.manager is not None and slot.given_up is None]
    if not managed:
        return
    if keep:
        names = ", ".join(slot.target.name for slot in managed)
        say(f"{why}: --keep-engines: leaving running: {names}")
        return
    say(f"{why}: stopping the engines enginetop started")
    for result in app.stop_managed():
        what = result.from_profile or "engine"
        say(f"{what}: {result.message}" if result.ok else f"stopping {what} failed: {result.message}")


LOG_MAX_BYTES = 1_000_000
LOG_BACKUPS = 3  # so at most ~4 MB of log, ever


def log_to_file(path: Path, level: int, http: bool = False, max_bytes: int = LOG_MAX_BYTES) -> None:
    """Warnings must not land on the dashboard's screen: they go to a rotating file beside the engine logs.

    A line per HTTP request (the poller's, and httpx's for the rest) is thousands of lines an hour that
    say nothing at four engines a second: they are kept out unless `http` asks for them (--log-http).
    """
    import logging
    from logging.handlers import RotatingFileHandler

    handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=LOG_BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG if http else logging.WARNING)
    logging.getLogger("tui.http").setLevel(logging.INFO if http else logging.WARNING)


