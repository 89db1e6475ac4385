"""`enginetop rules -o FILE`: one file of Prometheus alerting rule groups, one group per area that has some.

Providers are modules with `rule_group() -> dict`: the probe exporter's series (tui.exporter.rules) and the
fleet's engines and GPUs as their own exporters report them (tui.fleet.alerts). Options reach the
providers whose rule_group takes them by that keyword. The file is JSON, which
is YAML (Prometheus reads it as a rule file; `promtool check rules FILE` checks it): PyYAML is not a
dependency, and adding one to write one file is not worth it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

PROVIDERS = ("tui.exporter.rules", "tui.fleet.alerts")


def rule_groups(**options: Any) -> list[dict[str, Any]]:
    groups = []
    for name in PROVIDERS:
        module = importlib.import_module(name)
        accepted = inspect.signature(module.rule_group).parameters
        groups.append(module.rule_group(**{k: v for k, v in options.items() if k in accepted}))
    return groups


def render(groups: list[dict[str, Any]]) -> str:
    return json.dumps({"groups": groups}, indent=2) + "\n"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("rules", help="write Prometheus alerting rules for enginetop's series",
                              description="Write alerting rules as one rule file: on the probe exporter's "
                                          "series (TTFT p90, failures, an engine down by probe, stale "
                                          "probes) and on the fleet's engines and GPUs (stalled, KV "
                                          "cache full, queue growing, throttled GPU with tok/s down).")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="write here (default: standard output)")
    p.add_argument("--ttft-p90", type=float, default=2.0, metavar="SECONDS",
                   help="alert when a probe workload's client TTFT p90 is over this for 5 min (default 2)")
    p.add_argument("--probe-every", type=float, default=30.0, metavar="SECONDS",
                   help="the exporter's --probe-every, which sizes the windows (default 30)")
    p.add_argument("--failure-share", type=float, default=0.2, metavar="SHARE",
                   help="alert when more than this share of an engine's probes fail (default 0.2)")
    p.add_argument("--match", default=None, metavar="SELECTOR",
                   help="limit the fleet rules to these engines' series, e.g. '{job=~\"vllm.*\"}'")
    p.set_defaults(func=cmd_rules)


def cmd_rules(args: argparse.Namespace) -> int:
    try:
        text = render(rule_groups(ttft_p90_s=args.ttft_p90, probe_every_s=args.probe_every,
                                  failure_share=args.failure_share, match=args.match))
    except ValueError as exc:
        print(f"enginetop rules: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"enginetop rules: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"enginetop rules: wrote {len(text.splitlines())} lines to {args.output}", file=sys.stderr)
    return 0
