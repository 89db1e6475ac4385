"""`enginetop record`, `enginetop replay`, `enginetop export`; the dashboard's --record flags are in
tui.cli.dashboard.
(`enginetop report` takes a recording too: tui.cli.compare hands it to tui.record.report.)"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tui.cli.options import add_fleet, add_output, add_retention, add_targets, fleet_options

if TYPE_CHECKING:
    from tui.record.writer import Recorder


def register(sub: argparse._SubParsersAction) -> None:
    rec = sub.add_parser("record", help="record engines, GPU and host headless (no terminal needed) "
                                        "until SIGTERM/SIGINT")
    add_targets(rec, profiles=True)
    rec.add_argument("--keep-engines", action="store_true", help="leave the engines started here running")
    add_fleet(rec)
    add_output(rec, output="the recording (default: a new file in the data dir)")
    rec.add_argument("--interval", type=float, default=1.0, help="engine poll interval, seconds")
    rec.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    rec.add_argument("--status-every", type=float, default=60.0, metavar="SECONDS",
                     help="a line on stderr this often saying what was written (default 60)")
    rec.add_argument("--traffic", action="append", metavar="URL",
                     help="also record the traffic a separate `enginetop proxy` measures (repeatable)")
    add_retention(rec)
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
    add_output(exp, output="output file (default: stdout)")
    exp.add_argument("--job", default="enginetop", help="the job label (default enginetop)")
    exp.set_defaults(func=cmd_export)


def fleet_meta(fleet) -> dict[str, str]:
    """What a recording says of the fleet it holds (tui.fleet.options.FleetOptions or None): `fleet` names
    the Prometheus read, and `enginetop replay` shows such a recording as the fleet table."""
    from tui.net.policy import public_url

    if fleet is None or fleet.prometheus is None:
        return {}
    return {"fleet": f"Prometheus {public_url(fleet.prometheus)}"}


def open_recorder(path: Path | None, targets: list, retention: argparse.Namespace, say,
                  meta: dict[str, str] | None = None, secrets: tuple[str, ...] = ()) -> Recorder:
    """The recorder for a session: `path`, or a new file in the data dir (after pruning old ones).
    `secrets`: keys beyond the targets' own (the fleet's engine keys) that nothing written may hold."""
    from tui.record.retention import Retention, default_path, prune, recordings_dir
    from tui.record.writer import Recorder
    from tui.run.record import secrets_of

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
    # imported when the command runs, so --help and the other commands never pay for it
    import asyncio

    from tui.run.record import record
    from tui.run.sources import RunOptions
    from tui.run.targets import build_targets, profile_target

    def say(line: str) -> None:
        print(f"enginetop record: {line}", file=sys.stderr, flush=True)

    from tui.lifecycle.profile_files import load_profiles
    from tui.lifecycle.profiles import ProfileError
    from tui.run.targets import TargetError

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
        recorder = open_recorder(args.output, [*targets, *(profile_target(p) for p in profiles)], args, say,
                                 fleet_meta(fleet_opts))
    except (OSError, Exception) as exc:  # sqlite3.Error included: a path that cannot be a database
        say(f"cannot record to {args.output}: {exc}")
        return 2
    managers: list = []
    launched = []
    try:
        for profile in profiles:
            target, manager = start_profile(profile, recorder, say)
            managers.append(manager)
            if target is None:
                return 1
            launched.append(target)
        options = RunOptions(watched=targets, launched=launched, fleet=fleet_opts,
                             poll_interval_s=args.interval, traffic=list(args.traffic or ()))
        why = asyncio.run(record(options, recorder, say=say, duration_s=args.duration,
                                 line_every_s=args.status_every, managers=managers))
    finally:
        for manager in managers:
            if not args.keep_engines:
                result = manager.shutdown()
                say(result.message if result.ok else f"stopping failed: {result.message}")
        recorder.close()
    error = recorder.error
    say(f"{why}: {recorder.rows} rows in {recorder.path}, closed"
        + (f" ({error})" if error else ""))
    return 1 if error else 0


def start_profile(profile, recorder, say):  # -> (EngineTarget | None, EngineManager)
    """Start the profile's engine (or adopt the one `enginetop up` left), its steps recorded as events."""
    from tui.lifecycle.switch import EngineManager
    from tui.run.targets import profile_target
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
    return profile_target(profile), manager


def cmd_replay(args: argparse.Namespace) -> int:
    from tui.record.reader import Recording
    from tui.record.replay import parse_goto
    from tui.record.schema import RecordingError
    from tui.ui.config import AppConfig
    from tui.ui.replay import ReplayApp

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
    from tui.record.schema import RecordingError

    try:
        rec = Recording(args.file)
    except RecordingError as exc:
        print(f"enginetop export: {exc}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    out = open(args.output, "w", encoding="utf-8", newline="") if args.output else sys.stdout  # noqa: SIM115
    try:
        write = write_openmetrics if args.format == "openmetrics" else write_csv
        lines = write(rec, out, job=args.job)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if args.output:
            out.close()
    if rec.damage:
        print(f"enginetop export: {rec.damage}", file=sys.stderr)
    if args.output:
        print(f"enginetop export: {lines} lines to {args.output} in {time.perf_counter() - began:.1f}s",
              file=sys.stderr)
    return 0
