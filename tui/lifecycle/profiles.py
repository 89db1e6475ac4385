"""Engine profiles: one engine configuration each, how to launch it (or where to find one already running),
and the mistakes a profile file can hold.

Only the values live here, shared by the rooms that make and use them: tui.lifecycle.profile_files parses
and loads the TOML files, tui.lifecycle.profile_resolve turns a profile into what gets launched (variables
substituted, the API key read), tui.lifecycle.profile_keys keeps keys off the command line. Each of those
imports this module and none needs the others' work to hold a profile.

The format is documented at the top of profiles/vllm-qwen27b.toml.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tui.engines.argv import Options
from tui.engines.known import by_name

ENGINE_KINDS = ("llama.cpp", "vllm", "sglang", "other")
DEFAULT_VRAM_THRESHOLD_GIB = 4.0
GIB = 1024**3

# A ${VAR} in argv, env, workdir or api_key_file: substituted when the profile is resolved for a start
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def engine_options(engine: str | None) -> Options | None:
    """The option table of a profile's engine kind ("llama.cpp", "vllm", "sglang"; None for "other")."""
    known = by_name(engine)
    return known.options if known else None


@dataclass(frozen=True, slots=True)
class ProfileIssue:
    """One mistake (or warning) in one profile file, pointing at the line a user has to edit."""

    path: Path
    line: int | None
    field: str | None
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        what = f"{self.field}: " if self.field else ""
        return f"{where}: {self.severity}: {what}{self.message}"


class ProfileError(ValueError):
    """A profile cannot be used (yet): carries every issue that stands in the way."""

    def __init__(self, issues: list[ProfileIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    engine: str
    port: int
    path: Path  # the file it came from
    argv: tuple[str, ...] | None = None  # None: attach to a server that is already running
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    host: str = "127.0.0.1"
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    api_key_file: str | None = None
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    drain_timeout_s: float = 120.0
    vram_threshold_gib: float = DEFAULT_VRAM_THRESHOLD_GIB
    notes: str = ""
    router_model: str | None = None  # a model of a llama-server router or llama-swap: switching loads it
    swap_profile: str | None = None  # llama-swap: the profile (its model pins) made active by the switch

    def same_router(self, other: Profile) -> bool:
        """Both name a model of one router, started (or attached to) the same way: a switch between them
        changes the model and keeps the router."""
        return bool(self.router_model and other.router_model) and (self.url, self.argv, self.env) == (
            other.url, other.argv, other.env)

    @property
    def attach(self) -> bool:
        return self.argv is None

    @property
    def vram_threshold_bytes(self) -> int:
        return int(self.vram_threshold_gib * GIB)

    @property
    def connect_host(self) -> str:
        """Where a client on this machine reaches a server bound to `host` (a wildcard means loopback)."""
        if self.host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.host == "::":
            return "::1"
        return self.host

    @property
    def url(self) -> str:
        host = self.connect_host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def variables(self) -> list[str]:
        """Every ${VAR} the profile refers to, in order of first use."""
        found: list[str] = []
        for text in self._substituted_texts():
            for name in VARIABLE.findall(text):
                if name not in found:
                    found.append(name)
        return found

    def _substituted_texts(self) -> list[str]:
        texts = list(self.argv or ())
        texts += list(self.env.values())
        texts += [t for t in (self.workdir, self.api_key_file) if t]
        return texts
