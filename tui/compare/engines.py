"""The engines behind the arms of a comparison: fresh starts through the safe switch, or attached servers.

An arm's engine only has to start (return where to send probes) and stop. Profiles go through
tui.lifecycle's EngineManager, so every start is stop -> drain (VRAM, PIDs, port) -> start -> ready,
each step checked. Attached servers are never restarted: their "instances" are rounds in time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from tui.lifecycle.engine import StepError
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import EngineManager
from tui.model.samples import GpuReport
from tui.net.policy import InsecureSecret, client_kwargs, target_headers


@dataclass(frozen=True, slots=True)
class Target:
    """Where one instance answers; satisfies tui.probe.client.ProbeTarget."""

    name: str
    url: str  # public: no credentials in it
    api_key: str | None = dataclasses.field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = dataclasses.field(default=None, repr=False)
    model: str | None = None  # what requests name: a llama-server router's model


@dataclass(frozen=True, slots=True)
class Started:
    target: Target
    cold_start_s: float | None  # None for an attached server
    pid: int | None
    log_path: str | None
    steps: tuple[str, ...] = ()  # "step: message" of the switch, for the result's record
    argv: tuple[str, ...] | None = None  # exactly what was launched (variables substituted)


class StartError(RuntimeError):
    """An instance could not be started; the message says which step failed and why."""


class ArmEngine(Protocol):
    attached: bool

    def start(self) -> Started: ...

    def stop(self) -> None: ...


class AttachedEngine:
    """A server enginetop does not manage: probes go to it as it is, nothing is restarted."""

    attached = True

    def __init__(self, name: str, url: str, api_key: str | None = None,
                 basic_auth: tuple[str, str] | None = None) -> None:
        self.target = Target(name, url.rstrip("/"), api_key, basic_auth)

    def start(self) -> Started:
        return Started(self.target, None, None, None)

    def stop(self) -> None:
        return None


class ProfileEngine:
    """Each start() is a fresh instance of the profile via the safe switch of its EngineManager.

    Arms that take turns on one GPU share one manager (the switch stops the previous arm's engine and
    waits for its VRAM); arms that run side by side each get their own.
    """

    def __init__(self, profile: Profile, manager: EngineManager) -> None:
        self.profile = profile
        self.manager = manager
        self.attached = profile.attach

    def start(self) -> Started:
        result = self.manager.switch(self.profile)
        steps = tuple(f"{s.name}: {s.status}: {s.message}" for s in result.steps)
        if not result.ok or result.instance is None:
            raise StartError(f"{self.profile.name}: step '{result.failed_step}' failed: {result.message}")
        inst = result.instance
        key = inst.resolved.api_key
        return Started(
            Target(self.profile.name, inst.url, key, model=self.profile.router_model),
            None if inst.attached else inst.cold_start_s,
            inst.pid,
            str(inst.log_path) if inst.log_path else None,
            steps,
            inst.resolved.argv,
        )

    def stop(self) -> None:
        current = self.manager.current
        if current is None or current.profile.name != self.profile.name:
            return  # another arm's switch already stopped it
        result = self.manager.stop()
        if not result.ok:
            raise StartError(f"{self.profile.name}: stop failed: {result.message}")


def new_manager(gpu: Callable[[], GpuReport] | None) -> EngineManager:
    # No state files: the comparison owns its engines and stops them itself, even on errors.
    return EngineManager(gpu=gpu, record_state=False)


def with_port(profile: Profile, port: int) -> Profile:
    return dataclasses.replace(profile, port=port)


def uses_port_variable(profile: Profile) -> bool:
    return profile.argv is not None and any("${PORT}" in a for a in profile.argv)


def engine_version(target: Target, timeout: float = 5.0) -> str | None:
    """What the server says it is: llama.cpp /props build_info, vLLM /version; None if it does not say."""
    try:
        headers = target_headers(target)
    except InsecureSecret:
        return None
    with httpx.Client(timeout=timeout, **client_kwargs(target.url)) as client:
        for path, key in (("/props", "build_info"), ("/version", "version")):
            try:
                reply = client.get(f"{target.url}{path}", headers=headers)
                value = reply.json().get(key) if reply.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError):
                value = None
            if isinstance(value, str) and value:
                return f"{value} ({path})"
    return None


__all__ = [
    "ArmEngine",
    "AttachedEngine",
    "ProfileEngine",
    "StartError",
    "Started",
    "StepError",
    "Target",
    "engine_version",
    "new_manager",
    "uses_port_variable",
    "with_port",
]
