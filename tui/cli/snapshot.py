"""`enginetop snapshot`: two readings of every source, as JSON (--json) or a table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tui.cli.options import (
    EXIT_BAD_INPUT,
    EXIT_ENGINE_DOWN,
    EXIT_FAILED,
    EXIT_OK,
    add_discover,
    add_fleet,
    add_output,
    add_targets,
    fleet_options,
)


def register(sub: Any) -> None:
    snap = sub.add_parser("snapshot", help="two readings of every source, as JSON (--json) or a table")
    add_targets(snap)
    snap.add_argument("--interval", type=float, default=1.0, help="seconds between the two readings")
    snap.add_argument("--timeout", type=float, default=2.0, help="per-request timeout, seconds")
    add_output(snap, json="print one JSON object (default: a table)")
    snap.add_argument("--traffic", action="append", metavar="URL",
                      help="also read the traffic a separate `enginetop proxy` measures, e.g. "
                           "http://127.0.0.1:8081 (repeatable): findings then rest on the real requests too")
    add_fleet(snap)
    add_discover(snap)
    snap.set_defaults(func=cmd_snapshot)


def _na(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _window(fields: dict[str, Any] | None) -> str | None:
    """A GPU's or the CPU package's energy window from the snapshot's JSON, as the panels say it."""
    from tui.model.samples import EnergyWindow
    from widgets.energy import window_text

    return window_text(EnergyWindow(**fields)) if fields else None


def _energy_lines(e: dict[str, Any]) -> list[str]:
    """An engine's energy rows as its column shows them (widgets.energy.energy_rows): J/token, tok/J and watts
    with whose and how measured, or why there is none; nothing for an engine whose energy is not read here."""
    from tui.model.samples import EngineStats
    from widgets.energy import energy_rows
    from widgets.fmt import Rows

    stats = EngineStats(energy_w=e.get("energy_w"), joules_per_token=e.get("joules_per_token"),
                        tokens_per_joule=e.get("tokens_per_joule"), energy_source=e.get("energy_source"),
                        energy_scope=e.get("energy_scope"),
                        energy_shared_with=tuple(e.get("energy_shared_with") or ()),
                        energy_note=e.get("energy_note"))
    grid = Rows()
    energy_rows(grid, stats)
    text = grid.text().plain
    return text.splitlines() if text else []


def table(snapshot: dict[str, Any]) -> str:
    lines = [f"{'engine':<16} {'health':<9} {'gen tok/s':>9} {'prompt tok/s':>12} {'running':>7} "
             f"{'waiting':>7}  model"]
    for name, e in snapshot["engines"].items():
        lines.append(f"{name[:16]:<16} {e['health']:<9} {_na(e.get('gen_tps'), '.1f'):>9} "
                     f"{_na(e.get('prompt_processed_tps'), '.1f'):>12} {_na(e.get('running'), '.0f'):>7} "
                     f"{_na(e.get('waiting'), '.0f'):>7}  {e.get('model') or 'n/a'}")
        if e["health"] != "up" and e.get("health_reason"):
            lines.append(f"{'':<16} {e['health_reason']}")
        if e.get("config"):
            if e["config"].get("facts"):
                lines.append(f"{'':<16} model: {e['config']['facts']}")
            lines.append(f"{'':<16} config: {e['config']['summary'] or 'n/a'}")
            lines += [f"{'':<16} not published: {why}" for why in e["config"]["lacks"]]
        for key in ("placement", "limits"):
            if e.get(key):
                lines.append(f"{'':<16} {e[key]}")
        if e.get("port_held_by"):
            lines.append(f"{'':<16} port held by {e['port_held_by']}")
        lines += [f"{'':<16} {line}" for line in _energy_lines(e)]
        for f in e.get("findings") or ():
            lines.append(f"{'':<16} {f['severity'].upper()} {f['id']}: {f['title']}")
            lines.append(f"{'':<16}   try: {f['suggestion']}")
    for g in snapshot["gpus"]:
        lines.append(f"GPU {g.get('index')}: {g.get('name')} util {_na(g.get('util_pct'), '.0f')} %")
        if (energy := _window(g.get("energy"))) is not None:
            lines.append(f"{'':<16} energy {energy}")
    if snapshot.get("gpu_unavailable"):
        lines.append(f"GPU: {snapshot['gpu_unavailable']}")
    host = snapshot.get("host") or {}
    # the host panel's CPU energy row: the package's window, else why it cannot be read
    cpu = _window(host.get("cpu_energy")) or host.get("cpu_energy_error")
    if cpu:
        lines.append(f"CPU energy: {cpu}")
    return "\n".join(lines)


def cmd_snapshot(args: argparse.Namespace) -> int:
    # imported when the command runs, so --help and the other commands never pay for it
    import asyncio

    from tui.run.snapshot import any_engine_down, take_snapshot
    from tui.run.sources import RunOptions
    from tui.run.targets import build_targets

    fleet = fleet_options(args)
    discovering = not args.engine and fleet is None
    targets = build_targets(args.engine, args.api_key_file, args.api_key_env, discovering=discovering)
    if discovering:
        from tui.base.install import command
        from tui.run.discovery import discover, start_hints
        from tui.run.targets import discovered_targets
        from tui.sources.discover import DiscoverError
        from tui.sources.discover_keys import UnnamedKeyError, check_unnamed_keys

        try:
            found = None if args.no_discover else discover()
        except DiscoverError as exc:
            print(f"enginetop snapshot: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if found is None or not found.engines:
            discovered_targets([], args.api_key_file, args.api_key_env)  # a key for none: said first
            lines = found.report("snapshot") if found is not None else [
                "no --engine given, and --no-discover: nothing to read", *start_hints("snapshot")]
            lines.append(f"or read a fleet: `{command()} snapshot --prometheus URL` / `--dcgm URL`")
            for line in lines:
                print(f"enginetop snapshot: {line}", file=sys.stderr)
            return EXIT_BAD_INPUT
        for line in found.report():
            print(f"enginetop snapshot: {line}", file=sys.stderr)
        try:  # a key that names no engine goes only to the one found that is this user's own
            check_unnamed_keys(found.engines, args.api_key_file, args.api_key_env)
        except UnnamedKeyError as exc:
            print(f"enginetop snapshot: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        targets = discovered_targets(found.engines, args.api_key_file, args.api_key_env)
    for url in args.traffic or ():
        if not url.startswith(("http://", "https://")):
            print(f"enginetop snapshot: --traffic: expected the proxy's http(s) URL, got {url!r}",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    options = RunOptions(watched=targets, fleet=fleet, poll_timeout_s=args.timeout,
                         traffic=list(args.traffic or ()))
    snapshot = asyncio.run(take_snapshot(options, interval=args.interval))
    print(json.dumps(snapshot, indent=2) if args.json else table(snapshot))
    if snapshot.get("error"):
        print(f"enginetop snapshot: {snapshot['error']}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_ENGINE_DOWN if any_engine_down(snapshot) else EXIT_OK
