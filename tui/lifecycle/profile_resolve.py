"""Resolving a profile for a start: every ${VAR} substituted, the API key read and handed to the engine, the
command line checked once more for secrets. What comes out, a `ResolvedProfile`, is exactly what gets
launched; everything that stands in the way is raised as one ProfileError before anything is started.

Variables resolve in this order: the profile's own PORT and HOST, then the environment, then the built-ins
of the bundled demo engines. Those are looked up only when a profile that uses them is resolved (they may
assemble the model file), so that listing profiles never touches the demo engines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tui.base.secrets import SecretError, read_api_key
from tui.lifecycle.profile_keys import KEY_ON_ARGV, hand_over_key, secrets_on_argv_any_engine
from tui.lifecycle.profiles import VARIABLE, Profile, ProfileError, ProfileIssue
from tui.lifecycle.toml_lines import KeyLines

# Variables that are always defined: the profile's own address, and the bundled demo engine.
PROFILE_VARIABLES = ("PORT", "HOST")
BUILTIN_VARIABLES = (
    "ENGINETOP_LLAMA_SERVER", "ENGINETOP_DEMO_MODEL", "ENGINETOP_DEMO_MODELS_DIR",  # `make engine`
    "ENGINETOP_VLLM_PYTHON", "ENGINETOP_VLLM_GEMMA", "ENGINETOP_VLLM_TINY",  # `make vllm`
)


# ---------------------------------------------------------------- variables


def _builtin_value(name: str) -> str:
    # Imported here so that listing profiles never touches the demo engines.
    from tui.engines import install_llamacpp, install_vllm

    locate: dict[str, Callable[[], Path]] = {
        "ENGINETOP_LLAMA_SERVER": install_llamacpp.llama_server_binary,
        "ENGINETOP_DEMO_MODEL": install_llamacpp.demo_model_path,
        "ENGINETOP_DEMO_MODELS_DIR": install_llamacpp.demo_models_dir,
        "ENGINETOP_VLLM_PYTHON": install_vllm.vllm_python,
        "ENGINETOP_VLLM_GEMMA": install_vllm.gemma_hf_dir,
        "ENGINETOP_VLLM_TINY": install_vllm.tiny_model_dir,
    }
    return str(locate[name]())


def variable_lookup(
    profile: Profile, environ: Mapping[str, str] | None = None
) -> Callable[[str], str | None]:
    """Resolution order: the profile's own PORT/HOST, then the environment, then the built-ins."""
    env = os.environ if environ is None else environ
    cache: dict[str, str | None] = {}

    def lookup(name: str) -> str | None:
        if name not in cache:
            if name == "PORT":
                cache[name] = str(profile.port)
            elif name == "HOST":
                cache[name] = profile.host
            elif name in env:
                cache[name] = env[name]
            elif name in BUILTIN_VARIABLES:
                cache[name] = _builtin_value(name)  # may raise EngineNotInstalled: a clear message
            else:
                cache[name] = None
        return cache[name]

    return lookup


def is_defined(name: str, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return name in PROFILE_VARIABLES or name in BUILTIN_VARIABLES or name in env


def substitute(text: str, lookup: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """Replace every ${VAR}; returns the text and the names that had no value."""
    missing: list[str] = []

    def repl(match: re.Match[str]) -> str:
        value = lookup(match.group(1))
        if value is None:
            missing.append(match.group(1))
            return match.group(0)
        return value

    return VARIABLE.sub(repl, text), missing


# ---------------------------------------------------------------- resolving for a start


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    """A profile with every variable substituted and the API key read: exactly what gets launched."""

    profile: Profile
    argv: tuple[str, ...] | None
    env: dict[str, str] = field(repr=False)  # added to the inherited environment (may hold VLLM_API_KEY)
    workdir: str | None
    api_key: str | None = field(default=None, repr=False)  # never printed, logged or put on argv


def resolve(profile: Profile, environ: Mapping[str, str] | None = None) -> ResolvedProfile:
    """Substitute variables and read the key; raises ProfileError before anything is started."""
    from tui.engines.install_llamacpp import EngineNotInstalled

    lookup = variable_lookup(profile, environ)
    issues: list[ProfileIssue] = []
    lines = KeyLines(_read_or_empty(profile.path))

    def sub(fld: str, text: str, key: str | None, table: str | None = None) -> str:
        try:
            value, missing = substitute(text, lookup)
        except EngineNotInstalled as exc:
            issues.append(ProfileIssue(profile.path, lines.key(key or "", table), fld, str(exc)))
            return text
        for name in missing:
            line = lines.text("${" + name + "}", lines.key(key or "", table))
            issues.append(
                ProfileIssue(profile.path, line, fld, f"variable ${{{name}}} is not set in the environment")
            )
        return value

    argv = tuple(sub(f"argv[{i}]", a, "argv") for i, a in enumerate(profile.argv)) if profile.argv else None
    env = {k: sub(f"env.{k}", v, k, "env") for k, v in profile.env.items()}
    workdir = sub("workdir", profile.workdir, "workdir") if profile.workdir else None
    if workdir:
        workdir = os.path.expanduser(workdir)
        if argv is not None and not Path(workdir).is_dir():
            issues.append(
                ProfileIssue(profile.path, lines.key("workdir"), "workdir", f"{workdir} is not a directory")
            )
    api_key = None
    if profile.api_key_file:
        key_path = Path(os.path.expanduser(sub("api_key_file", profile.api_key_file, "api_key_file")))
        if not issues:
            try:
                api_key = read_api_key(key_path)
            except SecretError as exc:
                issues.append(ProfileIssue(profile.path, lines.key("api_key_file"), "api_key_file", str(exc)))
        if api_key is not None and "," in api_key and profile.engine == "llama.cpp":
            issues.append(ProfileIssue(
                profile.path, lines.key("api_key_file"), "api_key_file",
                f"the key in {key_path} contains a comma: llama-server reads a comma as a separator of keys",
            ))
    engine_keys: list[str] = []
    if argv is not None and not issues:
        try:
            api_key, engine_keys = hand_over_key(profile, argv, env, workdir, api_key, environ)
        except SecretError as exc:
            issues.append(ProfileIssue(profile.path, lines.key("argv"), "argv", str(exc)))
    if argv is not None:
        # Again after substitution: a ${VAR} may expand to a key flag or to the key, and a derived profile
        # (a sweep arm) never went through parse_profile. Every start passes here.
        for i, why in secrets_on_argv_any_engine(argv, [api_key, *engine_keys]):
            line = lines.key("argv")
            issues.append(ProfileIssue(profile.path, line, f"argv[{i}]", f"{why}: {KEY_ON_ARGV}"))
    if issues:
        raise ProfileError(issues)
    return ResolvedProfile(profile=profile, argv=argv, env=env, workdir=workdir, api_key=api_key)


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
