"""Headless lifecycle commands: `profiles`, `up PROFILE`, `down PROFILE`, `switch FROM TO`.

tui/cli.py calls register(subparsers); each sub-command sets `func(args) -> int` (the exit status).
Results are JSON on stdout; live step events and errors go to stderr. A failed step exits non-zero
with the step named on stderr. Standalone: `python -m tui.cli.lifecycle up demo-cpu-threads1`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tui.lifecycle.profile_files import ProfileSet
    from tui.lifecycle.profiles import Profile
    from tui.lifecycle.switch import EngineManager, SwitchResult
    from tui.model.samples import GpuReport
    from tui.model.status import StepEvent


def register(subparsers: Any) -> None:
    """Add the lifecycle sub-commands to an argparse sub-parser collection."""
    p = subparsers.add_parser("profiles", help="list engine profiles and their validation errors")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profiles)

    p = subparsers.add_parser("up", help="start a profile's engine, wait until it is ready, leave it running")
    p.add_argument("profile")
    p.set_defaults(func=cmd_up)

    p = subparsers.add_parser("down", help="stop an engine started by `up` and verify it is gone")
    p.add_argument("profile")
    p.set_defaults(func=cmd_down)

    p = subparsers.add_parser("switch", help="stop FROM, wait for VRAM and port to drain, start TO")
    p.add_argument("from_profile", metavar="FROM")
    p.add_argument("to_profile", metavar="TO")
    p.set_defaults(func=cmd_switch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enginetop", description="enginetop engine lifecycle")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


# ---------------------------------------------------------------- helpers


def _err(message: str) -> None:
    print(f"enginetop: {message}", file=sys.stderr, flush=True)


def _print_step(event: StepEvent) -> None:
    first, *rest = event.message.splitlines() or [""]
    print(f"[{event.elapsed_s:7.2f}s] {event.name:<7} {event.status:<9} {first}", file=sys.stderr, flush=True)
    for line in rest:
        print(f"{'':29}{line}", file=sys.stderr, flush=True)


def _gpu_reader() -> Callable[[], GpuReport] | None:
    """NVML through the shared sampler; on a machine without a driver its reports say so (no GPU)."""
    try:
        from tui.sources.gpu import GpuSampler
    except ImportError:
        return None
    return GpuSampler().sample


def _load() -> ProfileSet:
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.lifecycle.profile_files import load_profiles

    return load_profiles()


def _told(result: SwitchResult) -> int:
    """The result as JSON; a failed step also said on stderr, and exit 1."""
    print(json.dumps(result.to_json(), indent=2))
    if result.ok:
        return 0
    _err(f"step '{result.failed_step}' failed: {result.message}")
    return 1


def _profile(loaded: ProfileSet, name: str) -> Profile | None:
    """The profile `name`, or None once why not is said."""
    from tui.lifecycle.profiles import ProfileError

    try:
        return loaded.get(name)
    except ProfileError as exc:
        _err(f"step 'resolve' failed: {exc}")
        return None


def _adopt(profiles: ProfileSet, name: str) -> tuple[EngineManager | None, str | None]:
    """A manager holding the engine `up` recorded for `name` (or the server an attach profile names: a
    router's model is unloaded by a switch away from it), or an error message."""
    from tui.base.install import command
    from tui.lifecycle import state
    from tui.lifecycle.engine import launch_instance
    from tui.lifecycle.profile_resolve import ResolvedProfile, resolve
    from tui.lifecycle.profiles import ProfileError
    from tui.lifecycle.switch import EngineManager

    try:
        profile = profiles.get(name)
    except ProfileError as exc:
        return None, str(exc)
    record = state.read_state(name)
    if record is None and profile.attach:
        try:
            attached = launch_instance(resolve(profile))
        except ProfileError as exc:
            return None, str(exc)
        manager = EngineManager(gpu=_gpu_reader())
        manager.adopt(attached)
        return manager, None
    if record is None:
        return None, (f"no running engine recorded for profile {name!r} "
                      f"(start one with `{command()} up {name}`)")
    try:
        resolved = resolve(profile)
    except ProfileError:
        # Stopping needs no variables (PIDs come from the state file); only the key would be missing.
        resolved = ResolvedProfile(profile=profile, argv=profile.argv, env={}, workdir=None)
    instance = state.adopt(record, resolved)
    if instance is None:
        return None, f"the engine recorded for {name!r} (PID {record['pid']}) is no longer running"
    manager = EngineManager(gpu=_gpu_reader())
    manager.adopt(instance)
    return manager, None


# ---------------------------------------------------------------- commands


def cmd_profiles(args: argparse.Namespace) -> int:
    loaded = _load()
    loaded_paths = {p.path for p in loaded.profiles.values()}
    rejected = [i for i in loaded.issues if i.path not in loaded_paths]
    if args.json:
        print(
            json.dumps(
                {
                    "profiles": [
                        {
                            "name": p.name,
                            "engine": p.engine,
                            "url": p.url,
                            "attach": p.attach,
                            "router_model": p.router_model,
                            "path": str(p.path),
                            "notes": p.notes,
                            "issues": [str(i) for i in loaded.issues_for(p.name)],
                        }
                        for p in loaded.profiles.values()
                    ],
                    "errors": [str(i) for i in rejected],
                },
                indent=2,
            )
        )
    else:
        for p in loaded.profiles.values():
            how = "attach" if p.attach else "launch"
            where = f"{p.url} model {p.router_model}" if p.router_model else p.url
            print(f"{p.name:<28} {p.engine:<10} {how:<7} {where:<26} {p.path}")
            for issue in loaded.issues_for(p.name):
                print(f"    {issue.severity}: {issue.field or ''}: {issue.message} (line {issue.line})")
        for issue in rejected:
            print(f"not loaded: {issue}")
    return 1 if rejected else 0


def cmd_up(args: argparse.Namespace) -> int:
    from tui.lifecycle.switch import EngineManager

    profile = _profile(_load(), args.profile)
    if profile is None:
        return 1
    return _told(EngineManager(gpu=_gpu_reader()).start(profile, on_step=_print_step))


def cmd_down(args: argparse.Namespace) -> int:
    manager, problem = _adopt(_load(), args.profile)
    if manager is None:
        _err(f"step 'stop' failed: {problem}")
        return 1
    return _told(manager.stop(on_step=_print_step))


def cmd_switch(args: argparse.Namespace) -> int:
    from tui.lifecycle.engine import StepError

    loaded = _load()
    target = _profile(loaded, args.to_profile)
    if target is None:
        return 1
    manager, problem = _adopt(loaded, args.from_profile)
    if manager is None:
        _err(f"step 'stop' failed: {problem}")
        return 1
    try:
        result = manager.switch(target, on_step=_print_step)
    except StepError as exc:  # defensive: switch() reports failures in its result
        _err(f"step '{exc.step}' failed: {exc}")
        return 1
    return _told(result)


if __name__ == "__main__":
    raise SystemExit(main())
