"""`enginetop record`, `enginetop replay`, `enginetop export`; the dashboard's --record flags are in tui.cli.
(`enginetop report` takes a recording too: tui.compare.cli hands it to tui.record.report.)"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from tui.record.schema import RecordingError


def register(sub: argparse._SubParsersAction) -> None:
    from tui.cli import _add_fleet_args, _add_target_args

    rec = sub.add_parser("record", help="record engines, GPU and host headless (no terminal needed) "
                                        "until SIGTERM/SIGINT")
    _add_target_args(rec)
    rec.add_argument("--profile", action="append", metavar="NAME",
                     help="start (or attach to) this profile's engine, record it, stop it at the end "
                          "(repeatable)")
    rec.add_argument("--keep-engines", action="store_true", help="leave the engines started here running")
    _add_fleet_args(rec)
    rec.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                     help="how often Prometheus / dcgm-exporter are read (default 5)")
    rec.add_argument("-o", "--out", type=Path, help="the recording (default: a new file in the data dir)")
    rec.add_argument("--interval", type=float, default=1.0, help="engine poll interval, seconds")
    rec.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    rec.add_argument("--status-every", type=float, default=60.0, metavar="SECONDS",
                     help="a line on stderr this often saying what was written (default 60)")
    add_retention_args(rec)
    rec.set_defaults(func=cmd_record)

    rep = sub.add_parser("replay", help="the dashboard, driven by a recording")
    rep.add_argument("file", type=Path)
    rep.add_argument("--horizon", type=float, default=300.0, help="seconds of history on the plots")
    rep.add_argument("--at", default=None, help="start here: HH:MM:SS or -5m from the end (default: start)")
    rep.set_defaults(func=cmd_replay)

    exp = sub.add_parser("export", help="a recording as OpenMetrics (for promtool tsdb "
                                        "create-blocks-from openmetrics) or CSV")
    exp.add_argument("file", type=Path)
    exp.add_argument("--format", choices=["openmetrics", "csv"], default="openmetrics")
    exp.add_argument("-o", "--out", type=Path, help="output file (default: stdout)")
    exp.add_argument("--job", default="enginetop", help="the job label (default enginetop)")
    exp.set_defaults(func=cmd_export)


def add_retention_args(parser: argparse.ArgumentParser) -> None:
    from tui.record.retention import KEEP_BYTES, KEEP_DAYS

    parser.add_argument("--keep-days", type=float, default=KEEP_DAYS,
                        help=f"delete recordings in the data dir older than this (default {KEEP_DAYS:g})")
    parser.add_argument("--keep-gb", type=float, default=KEEP_BYTES / 2**30,
                        help=f"and the oldest past this total size, GiB (default {KEEP_BYTES / 2**30:g})")


def fleet_meta(fleet) -> dict[str, str]:
    """What a recording says of the fleet it holds (tui.fleet.options.FleetOptions or None): `fleet` names
    the Prometheus read, and `enginetop replay` shows such a recording as the fleet table."""
    from tui.net import public_url

    if fleet is None or fleet.prometheus is None:
        return {}
    return {"fleet": f"Prometheus {public_url(fleet.prometheus)}"}


def open_recorder(path: Path | None, targets: list, retention: argparse.Namespace, say,
                  meta: dict[str, str] | None = None, secrets: tuple[str, ...] = ()) -> object:
    """The recorder for a session: `path`, or a new file in the data dir (after pruning old ones).
    `secrets`: keys beyond the targets' own (the fleet's engine keys) that nothing written may hold."""
    from tui.record.headless import secrets_of
    from tui.record.retention import Retention, default_path, prune, recordings_dir
    from tui.record.writer import Recorder

    keep = None
    if path is None:
        path = default_path()
        keep = Retention(recordings_dir(), retention.keep_days, int(retention.keep_gb * 2**30))
        for old in prune(keep.folder, keep.keep_days, keep.keep_bytes):
            say(f"deleted old recording {old} (--keep-days / --keep-gb)")
    # and again every hour while recording (a session can outlive --keep-days)
    return Recorder(path, {t.name: t.url for t in targets}, secrets_of(targets) + secrets, meta,
                    retention=keep,
                    on_delete=lambda old: say(f"deleted old recording {old} (--keep-days / --keep-gb)"))


def cmd_record(args: argparse.Namespace) -> int:
    from tui.record.headless import record
    from tui.targets import build_targets

    def say(line: str) -> None:
        print(f"enginetop record: {line}", file=sys.stderr, flush=True)

    from tui.cli import fleet_options
    from tui.lifecycle.profiles import ProfileError, load_profiles
    from tui.targets import TargetError

    try:
        targets = build_targets(args.engine, args.api_key_file, args.api_key_env)
        fleet_opts = fleet_options(args)
        profiles = [load_profiles().get(name) for name in args.profile or []]
    except (ProfileError, TargetError, OSError, ValueError) as exc:
        say(str(exc))
        return 2
    if not targets and not profiles and fleet_opts is None:
        say("give at least one --engine NAME=URL, --profile NAME or --prometheus URL")
        return 2
    try:
        recorder = open_recorder(args.out, [*targets, *profile_targets(profiles)], args, say,
                                 fleet_meta(fleet_opts))
    except (OSError, Exception) as exc:  # sqlite3.Error included: a path that cannot be a database
        say(f"cannot record to {args.out}: {exc}")
        return 2
    managers: list = []
    try:
        for profile in profiles:
            target, manager = start_profile(profile, recorder, say)
            managers.append(manager)
            if target is None:
                return 1
            targets.append(target)
        fleet = None
        if fleet_opts is not None:
            from tui.fleet.options import make_sources

            fleet = make_sources(fleet_opts, lambda: None)
        why = asyncio.run(record(targets, recorder, interval_s=args.interval, say=say,  # type: ignore[arg-type]
                                 duration_s=args.duration, line_every_s=args.status_every,
                                 managers=managers, fleet=fleet))
    finally:
        for manager in managers:
            if not args.keep_engines:
                result = manager.shutdown()
                say(result.message if result.ok else f"stopping failed: {result.message}")
        recorder.close()  # type: ignore[attr-defined]
    error = recorder.error  # type: ignore[attr-defined]
    say(f"{why}: {recorder.rows} rows in {recorder.path}, closed"  # type: ignore[attr-defined]
        + (f" ({error})" if error else ""))
    return 1 if error else 0


def profile_targets(profiles: list) -> list:
    from tui.sources.engine import EngineTarget

    return [EngineTarget(name=p.name, url=p.url) for p in profiles]


def start_profile(profile, recorder, say):  # -> (EngineTarget | None, EngineManager)
    """Start the profile's engine (or adopt the one `enginetop up` left), its steps recorded as events."""
    from tui.lifecycle.profiles import resolve
    from tui.lifecycle.switch import EngineManager
    from tui.sources.engine import EngineTarget
    from tui.sources.gpu import GpuSampler

    gpu = GpuSampler()
    manager = EngineManager(gpu=gpu.sample)

    def on_step(event) -> None:
        recorder.event("switch", profile.name, {"to": profile.name, **event.to_json()})

    say(f"starting {profile.name} ({profile.engine}, port {profile.port})")
    result = manager.adopt_recorded(profile, on_step=on_step) or manager.switch(profile, on_step=on_step)
    recorder.event("switch-result", profile.name, {
        "to": profile.name, "ok": result.ok, "failed_step": result.failed_step, "message": result.message})
    if not result.ok:
        say(f"{profile.name}: {result.failed_step} failed: {result.message}")
        return None, manager
    resolved = resolve(profile)
    return EngineTarget(name=profile.name, url=profile.url, api_key=resolved.api_key,
                        health_path=profile.health_path, metrics_path=profile.metrics_path), manager


def cmd_replay(args: argparse.Namespace) -> int:
    from tui.app import AppConfig
    from tui.record.reader import Recording
    from tui.record.replay import parse_goto
    from tui.replay_app import ReplayApp

    try:
        rec = Recording(args.file)
        start = parse_goto(args.at, rec) if args.at and not rec.empty else None
    except (RecordingError, ValueError) as exc:
        print(f"enginetop replay: {exc}", file=sys.stderr)
        return 2
    if rec.damage:
        print(f"enginetop replay: {rec.damage}", file=sys.stderr)
    ReplayApp(rec, AppConfig(horizon_s=args.horizon), start=start).run()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tui.record.export import write_csv, write_openmetrics
    from tui.record.reader import Recording

    try:
        rec = Recording(args.file)
    except RecordingError as exc:
        print(f"enginetop export: {exc}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    out = open(args.out, "w", encoding="utf-8", newline="") if args.out else sys.stdout  # noqa: SIM115
    try:
        write = write_openmetrics if args.format == "openmetrics" else write_csv
        lines = write(rec, out, job=args.job)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if args.out:
            out.close()
    if rec.damage:
        print(f"enginetop export: {rec.damage}", file=sys.stderr)
    if args.out:
        print(f"enginetop export: {lines} lines to {args.out} in {time.perf_counter() - began:.1f}s",
              file=sys.stderr)
    return 0
