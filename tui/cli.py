"""Command line: the dashboard (default), `snapshot`, and the subcommands of probe, lifecycle, compare."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR
from tui.secrets import SecretError
from tui.targets import TargetError, build_targets, keys_by_name

# Each area adds its own subcommands with a `register(subparsers)` function.
SUBCOMMAND_MODULES = ("tui.probe.cli", "tui.lifecycle.cli", "tui.compare.cli", "tui.recording_cli",
                      "tui.exporter.cli", "tui.rules", "tui.web")


def _add_target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", action="append", metavar="NAME=URL",
                        help="engine to watch, e.g. llama=http://127.0.0.1:8080 (repeatable)")
    parser.add_argument("--api-key-file", action="append", metavar="NAME=PATH",
                        help="read engine NAME's API key from PATH (sent as a Bearer header, never shown); "
                             "with --prometheus, NAME as the fleet table shows it, or * for every engine")
    parser.add_argument("--api-key-env", action="append", metavar="NAME=VAR",
                        help="read engine NAME's API key from environment variable VAR")


def _add_fleet_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", metavar="URL",
                        help="read every engine (vLLM, SGLang, llama.cpp) and dcgm-exporter GPU that this "
                             "Prometheus scrapes, e.g. http://prom:9090: the fleet view")
    parser.add_argument("--match", metavar="SELECTOR",
                        help="only the engines these label matchers select, e.g. '{job=~\"vllm.*\"}'")
    parser.add_argument("--prometheus-key-file", metavar="PATH",
                        help="bearer token for a protected Prometheus, read from PATH (never shown)")
    parser.add_argument("--dcgm", action="append", metavar="URL",
                        help="read GPUs straight from this dcgm-exporter, e.g. http://node:9400/metrics "
                             "(repeatable; no Prometheus needed)")


def fleet_options(args: argparse.Namespace):
    """FleetOptions from --prometheus/--dcgm (None when neither is given); the key file is read here."""
    from tui.fleet.options import DEFAULT_REFRESH_S, FleetOptions
    from tui.secrets import read_api_key

    if not (args.prometheus or args.dcgm):
        if args.match or args.prometheus_key_file:
            raise TargetError("--match and --prometheus-key-file need --prometheus URL")
        return None
    for url in [args.prometheus or "http://x", *(args.dcgm or [])]:
        if not url.startswith(("http://", "https://")):
            raise TargetError(f"expected an http(s) URL, got {url!r}")
    refresh = getattr(args, "refresh", None) or DEFAULT_REFRESH_S
    if refresh <= 0:
        raise TargetError("--refresh must be a positive number of seconds")
    return FleetOptions(prometheus=args.prometheus, match=args.match, refresh_s=refresh,
                        token=read_api_key(args.prometheus_key_file) if args.prometheus_key_file else None,
                        dcgm=list(args.dcgm or []), timeout_s=min(5.0, max(1.0, refresh)))


DEMO_PROFILES = {"llama": ["demo-cpu-threads2"], "both": ["demo-cpu-threads2", "demo-vllm-gemma"]}


def add_dashboard_args(parser: argparse.ArgumentParser) -> None:
    """The dashboard's options; `enginetop web` takes the same ones and hands them to each tab's dashboard."""
    _add_target_args(parser)
    parser.add_argument("--profile", action="append", metavar="NAME",
                        help="start (or attach to) the engine of this profile and watch it (repeatable); "
                             "`enginetop profiles` lists them")
    parser.add_argument("--demo", choices=sorted(DEMO_PROFILES), default=None,
                        help="start the bundled demo: llama (llama.cpp only, the default when nothing "
                             "else is given) or both (llama.cpp and vLLM on the same Gemma 270M)")
    parser.add_argument("--keep-engines", action="store_true",
                        help="leave the engines enginetop started running when it quits")
    parser.add_argument("--interval", type=float, default=1.0, help="engine poll interval, seconds")
    parser.add_argument("--horizon", type=float, default=None,
                        help="seconds of history on the plots (default 300; 1800 in the fleet view)")
    _add_fleet_args(parser)
    parser.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                        help="how often the fleet view asks Prometheus / dcgm-exporter (default 5)")
    parser.add_argument("--probe-every", type=float, default=None, metavar="SECONDS",
                        help="probe every watched engine this often (default: only on key f; engines "
                             "enginetop starts are probed every 10 s)")
    parser.add_argument("--probe-workload", default="short",
                        choices=["short", "long-prefill", "agent", "thinking-off"])
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
    from tui.recording_cli import add_retention_args

    add_retention_args(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="enginetop",
        description="Watch LLM inference engines and the GPU under them. With no --engine or --profile, "
                    "starts the bundled demo (a real llama-server with Gemma 3 270M) and watches it.")
    add_dashboard_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    snap = sub.add_parser("snapshot", help="two readings of every source as one JSON object")
    _add_target_args(snap)
    snap.add_argument("--interval", type=float, default=1.0, help="seconds between the two readings")
    snap.add_argument("--timeout", type=float, default=2.0, help="per-request timeout, seconds")
    snap.add_argument("--json", action="store_true", help="print JSON (the only format for now)")
    _add_fleet_args(snap)
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

    fleet = fleet_options(args)
    if not args.engine and fleet is None:
        print("enginetop snapshot: give at least one --engine NAME=URL, or --prometheus URL / --dcgm URL",
              file=sys.stderr)
        return 2
    targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
    if fleet is not None:
        from tui.fleet.snapshot import take_fleet_snapshot

        snapshot = asyncio.run(take_fleet_snapshot(fleet, targets, interval=args.interval,
                                                   timeout=args.timeout))
        print(json.dumps(snapshot, indent=2))
        if snapshot.get("error"):
            print(f"enginetop snapshot: {snapshot['error']}", file=sys.stderr)
            return 1
        return EXIT_ENGINE_DOWN if any_engine_down(snapshot) else 0
    snapshot = asyncio.run(take_snapshot(targets, interval=args.interval, timeout=args.timeout))
    print(json.dumps(snapshot, indent=2))
    return EXIT_ENGINE_DOWN if any_engine_down(snapshot) else 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import logging

    from tui.app import AppConfig, EnginetopApp
    from tui.compare.roofline import parse_bandwidth, parse_bytes
    from tui.lifecycle.profiles import ProfileError, load_profiles
    from tui.paths import runs_dir
    from tui.probe.sweep import SweepConfig, parse_levels

    fleet = fleet_options(args)
    fleet_table = fleet is not None and fleet.prometheus is not None
    if fleet_table:  # the keys name engines of the fleet (or "*"), for probes of an engine opened from it
        assert fleet is not None
        targets = build_targets(args.engine)
        fleet.engine_keys = keys_by_name(args.api_key_file, args.api_key_env)
    else:
        targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
    names = list(args.profile or [])
    if fleet_table and (targets or names or args.demo):
        print("enginetop: --prometheus shows the fleet table; watch single engines without it",
              file=sys.stderr)
        return 2
    if args.horizon is None:
        args.horizon = 1800.0 if fleet_table else 300.0
    if args.demo or not (targets or names or fleet):
        names += DEMO_PROFILES[args.demo or "llama"]
    loaded = load_profiles()
    try:
        profiles = [loaded.get(name) for name in names]
    except ProfileError as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    try:
        if args.horizon <= 0 or args.interval <= 0:
            raise ValueError("--horizon and --interval must be positive numbers of seconds")
        if not args.ttft_gap_factor > 0:
            raise ValueError(f"--ttft-gap-factor must be positive, got {args.ttft_gap_factor}")
        sweep = SweepConfig(levels=parse_levels(args.sweep_levels, "--sweep-levels"),
                            duration_s=args.sweep_seconds)
        bandwidth = parse_bandwidth(args.bandwidth) if args.bandwidth else None
        model_bytes = parse_bytes(args.model_bytes) if args.model_bytes else None
    except ValueError as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    log_to_file(runs_dir() / "enginetop.log", getattr(logging, args.log_level), http=args.log_http)
    log = logging.getLogger("tui.cli")
    config = AppConfig(
        targets=targets, profiles=profiles, switchable=[p for p in loaded.profiles.values() if not p.attach],
        probe_every_s=args.probe_every, probe_every_managed_s=args.probe_every or 10.0,
        probe_workload=args.probe_workload, probe_max_tokens=args.probe_max_tokens, sweep=sweep,
        ttft_gap_factor=args.ttft_gap_factor,
        poll_interval_s=args.interval, horizon_s=args.horizon, screenshot_dir=args.screenshots,
        bandwidth_bps=bandwidth, model_bytes=model_bytes, fleet=fleet)
    if not args.no_record:
        from tui.recording_cli import fleet_meta, open_recorder

        try:
            config.recorder = open_recorder(  # type: ignore[assignment]
                args.record, [*targets, *_profile_targets(profiles)], args, log.warning, fleet_meta(fleet),
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


def _profile_targets(profiles: list[Any]) -> list[Any]:
    """The profiles' engines as the recorder needs them: the URL, and the key it must keep out."""
    from tui.lifecycle.profiles import ProfileError, resolve
    from tui.sources.engine import EngineTarget

    targets = []
    for p in profiles:
        key = None
        with contextlib.suppress(ProfileError):  # the lifecycle's resolve step reports a bad key file
            key = resolve(p).api_key if p.api_key_file else None
        targets.append(EngineTarget(name=p.name, url=p.url, api_key=key))
    return targets


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
    managed = [slot for slot in app.slots if slot.manager is not None]
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", cmd_dashboard)
    try:
        return int(func(args) or 0)
    except (TargetError, SecretError) as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
