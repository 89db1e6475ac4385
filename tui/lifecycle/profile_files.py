"""Profile files: one TOML file parsed into a `Profile`, and every file of the profile folders loaded.

Loading never stops at the first bad file: every mistake becomes a `ProfileIssue` naming the file, the
line and the field (tui.lifecycle.toml_lines finds the line again: tomllib keeps no positions), and the
other files still load. A variable that is not set yet, or a warning, keeps the profile, so that the UI
can list it and say why it cannot start yet; resolving it for a start is tui.lifecycle.profile_resolve's.

The format is documented at the top of profiles/vllm-qwen27b.toml.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.base.paths import config_dir
from tui.lifecycle.profile_keys import KEY_ON_ARGV, secrets_on_argv_any_engine
from tui.lifecycle.profile_resolve import is_defined
from tui.lifecycle.profiles import (
    DEFAULT_VRAM_THRESHOLD_GIB,
    ENGINE_KINDS,
    VARIABLE,
    Profile,
    ProfileError,
    ProfileIssue,
)
from tui.lifecycle.toml_lines import KeyLines
from tui.net.policy import is_loopback_host

_TOML_POS = re.compile(r"\(at line (\d+), column \d+\)")


# ---------------------------------------------------------------- parsing

_KNOWN_KEYS = {
    "name",
    "engine",
    "argv",
    "env",
    "workdir",
    "host",
    "port",
    "health_path",
    "metrics_path",
    "api_key_file",
    "start_timeout_s",
    "stop_timeout_s",
    "drain_timeout_s",
    "vram_threshold_gib",
    "notes",
    "router_model",
    "swap_profile",
}
_STRING_KEYS = (
    "name", "engine", "workdir", "host", "health_path", "metrics_path", "api_key_file", "notes",
    "router_model", "swap_profile",
)
_NUMBER_KEYS = ("start_timeout_s", "stop_timeout_s", "drain_timeout_s", "vram_threshold_gib")


def _type_name(value: Any) -> str:
    return {
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def parse_profile(
    text: str,
    path: Path,
    environ: Mapping[str, str] | None = None,
) -> tuple[Profile | None, list[ProfileIssue]]:
    """Parse one file. The profile is None when an error makes it unusable; unset variables and warnings
    keep it (so the UI can list it and say why it cannot start yet)."""
    lines = KeyLines(text)
    issues: list[ProfileIssue] = []

    def err(fld: str | None, message: str, line: int | None = None, table: str | None = None) -> None:
        if line is None and fld is not None:
            line = lines.key(fld.split(".")[-1] if table else fld.split("[")[0], table)
        issues.append(ProfileIssue(path, line, fld, message))

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        pos = _TOML_POS.search(str(exc))
        return None, [ProfileIssue(path, int(pos.group(1)) if pos else None, None, f"invalid TOML: {exc}")]

    for key in data:
        if key not in _KNOWN_KEYS:
            err(key, f"unknown key (known: {', '.join(sorted(_KNOWN_KEYS))})")

    for key in _STRING_KEYS:
        if key in data and not isinstance(data[key], str):
            err(key, f"must be a string, got {_type_name(data[key])}")
    for key in _NUMBER_KEYS:
        value = data.get(key)
        if key in data and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            err(key, f"must be a positive number, got {value!r}")

    for key in ("name", "engine", "port"):
        if key not in data:
            issues.append(ProfileIssue(path, None, key, f"missing required key '{key}'"))
    name = data.get("name")
    if isinstance(name, str) and not name.strip():
        err("name", "must not be empty")
    engine = data.get("engine")
    if isinstance(engine, str) and engine not in ENGINE_KINDS:
        err("engine", f"unknown engine kind {engine!r} (one of: {', '.join(ENGINE_KINDS)})")

    port = data.get("port")
    if "port" in data and (isinstance(port, bool) or not isinstance(port, int)):
        err("port", f"must be an integer, got {_type_name(port)}")
    elif isinstance(port, int) and not 1 <= port <= 65535:
        err("port", f"must be between 1 and 65535, got {port}")

    argv = data.get("argv")
    if "argv" in data:
        if isinstance(argv, str):
            err(
                "argv",
                "must be a list of strings, one per argument, not a single string "
                '(write argv = ["llama-server", "--port", "${PORT}"]; no shell is involved)',
            )
        elif not isinstance(argv, list) or not argv:
            err("argv", f"must be a non-empty list of strings, got {_type_name(argv)}")
        else:
            for i, item in enumerate(argv):
                if not isinstance(item, str):
                    err(
                        f"argv[{i}]",
                        f"must be a string, got {_type_name(item)} {item!r}",
                        line=lines.key("argv"),
                    )
            # Early, on the text as written; resolve() checks again after ${VAR} substitution.
            as_written = [item if isinstance(item, str) else "" for item in argv]
            for i, why in secrets_on_argv_any_engine(as_written):
                err(f"argv[{i}]", f"{why}: {KEY_ON_ARGV}", line=lines.key("argv"))

    env = data.get("env", {})
    if not isinstance(env, dict):
        err("env", f"must be a table of strings, got {_type_name(env)}")
        env = {}
    for key, value in env.items():
        if not isinstance(value, str):
            err(f"env.{key}", f"must be a string, got {_type_name(value)}", table="env")
        if key.upper().endswith("API_KEY"):
            err(
                f"env.{key}",
                "API keys must not be written in a profile: set api_key_file instead",
                table="env",
            )

    router_model = data.get("router_model")
    if isinstance(router_model, str) and (not router_model.strip() or engine != "llama.cpp"):
        err("router_model", "must name a model of a llama-server router (engine \"llama.cpp\")"
            if router_model.strip() else "must not be empty")

    if "swap_profile" in data and router_model is None:
        err("swap_profile", "needs router_model: the llama-swap model this profile serves")

    if issues:
        return None, issues
    assert isinstance(name, str) and isinstance(engine, str) and isinstance(port, int)  # checked above

    profile = Profile(
        name=name.strip(),
        engine=engine,
        port=port,
        path=path,
        argv=tuple(argv) if argv is not None else None,
        env=dict(env),
        workdir=data.get("workdir"),
        host=data.get("host", "127.0.0.1"),
        health_path=data.get("health_path", "/health"),
        metrics_path=data.get("metrics_path", "/metrics"),
        api_key_file=data.get("api_key_file"),
        start_timeout_s=float(data.get("start_timeout_s", 300.0)),
        stop_timeout_s=float(data.get("stop_timeout_s", 30.0)),
        drain_timeout_s=float(data.get("drain_timeout_s", 120.0)),
        vram_threshold_gib=float(data.get("vram_threshold_gib", DEFAULT_VRAM_THRESHOLD_GIB)),
        notes=data.get("notes", ""),
        router_model=router_model.strip() if isinstance(router_model, str) else None,
        swap_profile=data.get("swap_profile"),
    )
    issues += _unset_variables(profile, lines, environ)
    if not is_loopback_host(profile.host) and profile.api_key_file is None:
        issues.append(
            ProfileIssue(
                path,
                lines.key("host"),
                "host",
                f"binds {profile.host}, reachable from other machines, without an API key (set api_key_file)",
                severity="warning",
            )
        )
    if profile.api_key_file and profile.engine in ("sglang", "other") and profile.argv is not None:
        issues.append(
            ProfileIssue(
                path,
                lines.key("api_key_file"),
                "api_key_file",
                f"enginetop sends the key as Bearer but cannot hand it to {profile.engine} without a "
                "command-line flag: make the engine read it itself",
                severity="warning",
            )
        )
    return profile, issues


def _unset_variables(
    profile: Profile, lines: KeyLines, environ: Mapping[str, str] | None
) -> list[ProfileIssue]:
    issues = []
    fields: list[tuple[str, str, str | None]] = [
        (f"argv[{i}]", a, "argv") for i, a in enumerate(profile.argv or ())
    ]
    fields += [(f"env.{k}", v, None) for k, v in profile.env.items()]
    fields += [
        (k, v, k) for k, v in (("workdir", profile.workdir), ("api_key_file", profile.api_key_file)) if v
    ]
    for fld, text, key in fields:
        for name in VARIABLE.findall(text):
            if not is_defined(name, environ):
                base = lines.key(key) if key else lines.key(fld.split(".", 1)[1], "env")
                issues.append(
                    ProfileIssue(
                        profile.path,
                        lines.text("${" + name + "}", base),
                        fld,
                        f"variable ${{{name}}} is not set in the environment",
                    )
                )
    return issues


# ---------------------------------------------------------------- loading


@dataclass(frozen=True, slots=True)
class ProfileSet:
    profiles: dict[str, Profile]
    issues: list[ProfileIssue]

    def get(self, name: str) -> Profile:
        """The profile called `name`, or a ProfileError that says why it is not there."""
        if name in self.profiles:
            return self.profiles[name]
        own = [i for i in self.issues if i.severity == "error" and i.path.stem == name]
        if own:
            raise ProfileError(own)
        known = ", ".join(sorted(self.profiles)) or "none"
        raise ProfileError(
            [ProfileIssue(Path(name), None, None, f"no profile named {name!r} (known: {known})")]
        )

    def issues_for(self, name: str) -> list[ProfileIssue]:
        path = self.profiles[name].path if name in self.profiles else None
        return [i for i in self.issues if i.path == path]


def repo_profiles_dir() -> Path:
    """The bundled profiles: the repository's profiles/ in a checkout (or an editable install); in a
    wheel, the same files installed as tui/bundled_profiles (pyproject.toml maps that package there)."""
    installed = Path(__file__).resolve().parents[1] / "bundled_profiles"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "profiles"


def user_profiles_dir() -> Path:
    return config_dir() / "profiles"


def default_profile_dirs() -> list[Path]:
    return [repo_profiles_dir(), user_profiles_dir()]


def load_profiles(dirs: Iterable[Path] | None = None, environ: Mapping[str, str] | None = None) -> ProfileSet:
    """Every *.toml in dirs (repo first, then the user's). A name already taken is an error in the later
    file; a file that fails to parse is reported and skipped, never stopping the others."""
    profiles: dict[str, Profile] = {}
    issues: list[ProfileIssue] = []
    for directory in default_profile_dirs() if dirs is None else dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                issues.append(ProfileIssue(path, None, None, f"cannot read: {exc}"))
                continue
            profile, found = parse_profile(text, path, environ)
            if profile is not None and profile.name in profiles:
                first = profiles[profile.name].path
                found = [
                    ProfileIssue(
                        path,
                        KeyLines(text).key("name"),
                        "name",
                        f"duplicate name {profile.name!r}: already defined in {first}",
                    )
                ]
                profile = None
            issues += found
            if profile is not None:
                profiles[profile.name] = profile
    return ProfileSet(profiles, issues)
