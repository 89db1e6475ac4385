"""A comparison's arms from what was named for it: profiles, launched or attached through the profile, and
URLs of running servers; and the schedule those arms allow.

`enginetop ab` and `enginetop sweep-param` name them on the command line (tui.cli.compare); what an arm is
and how it runs is tui.compare.ab. Arms side by side ("coresident") each get a port of their own, so every
launched profile's argv must take its port from ${PORT}; one at a time ("switch") they share one engine
manager, whose safe switch stops the previous arm's engine (and waits for its VRAM) before the next starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tui.base.process import free_ports
from tui.compare.ab import Arm, Mode
from tui.compare.engines import AttachedEngine, ProfileEngine, new_manager, uses_port_variable, with_port
from tui.compare.gpu_watch import GpuSource
from tui.lifecycle.profiles import Profile


class ScheduleError(ValueError):
    """The schedule asked for cannot run these arms: its message says why, in the command line's words."""


class RunningServer(Protocol):
    """A running server named by its URL (tui.run.targets.EngineSpec): the URL shown, and the Basic auth
    split off it."""

    @property
    def url(self) -> str: ...

    @property
    def basic_auth(self) -> tuple[str, str] | None: ...


def choose_mode(requested: str, profiles: Sequence[Profile | None], has_gpu: bool) -> Mode:
    """The schedule for `requested` ("auto", "switch" or "coresident"; `profiles`: each arm's, None for a
    URL). "auto" runs side by side where nothing is launched, or where no GPU answered and every launched
    profile takes its port from ${PORT}; else one at a time."""
    launched = [p for p in profiles if p is not None and not p.attach]
    if requested == "switch":
        return "switch"
    can_side_by_side = all(uses_port_variable(p) for p in launched)
    if requested == "coresident":
        if not can_side_by_side:
            bad = ", ".join(p.name for p in launched if not uses_port_variable(p))
            raise ScheduleError(
                f"--mode coresident needs each profile's argv to use ${{PORT}} (so each arm gets its "
                f"own port); not so in: {bad}"
            )
        return "coresident"
    if not launched:
        return "coresident"
    return "coresident" if (not has_gpu and can_side_by_side) else "switch"


def arms_from_profiles(
    named: Sequence[tuple[str, Profile | None, RunningServer | None]], mode: Mode, gpu: GpuSource | None
) -> list[Arm]:
    """An arm per (name, profile, server): attached to the server where there is no profile."""
    shared = new_manager(gpu)
    arms = []
    ports = free_ports(len(named))  # each coresident instance its own port
    for (name, profile, spec), port in zip(named, ports, strict=True):
        if profile is None:
            assert spec is not None
            engine = AttachedEngine(name, spec.url, basic_auth=spec.basic_auth)
            arms.append(Arm(name, engine, url=spec.url, origin=f"attached by URL {spec.url}, not started by "
                            "enginetop"))
            continue
        if mode == "coresident" and not profile.attach:
            profile = with_port(profile, port)
        manager = new_manager(gpu) if mode == "coresident" else shared
        arms.append(
            Arm(
                name,
                ProfileEngine(profile, manager),
                argv=list(profile.argv) if profile.argv else None,
                engine_kind=profile.engine,
                url=None if not profile.attach else profile.url,
                profile_path=str(profile.path),
                notes=profile.notes,
                origin=f"attached through profile {profile.name}, not started by enginetop"
                if profile.attach else None,
            )
        )
    return arms
