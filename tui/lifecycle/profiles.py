"""Engine profiles: TOML files that say how to launch (or where to find) one engine configuration.

Loading never stops at the first bad file: every mistake becomes a `ProfileIssue` naming the file, the
line and the field, and the other files still load. tomllib keeps no positions, so the line of a key is
found again in the raw text (`_KeyLines`).

The format is documented at the top of profiles/vllm-qwen27b.toml.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tui.base.paths import config_dir
from tui.base.secrets import SecretError, read_api_key, read_llama_key_file
from tui.engines import llamacpp
from tui.engines.argv import Options, secrets_on_argv
from tui.engines.known import ENGINES, by_name
from tui.net.policy import is_loopback_host

ENGINE_KINDS = ("llama.cpp", "vllm", "sglang", "other")
DEFAULT_VRAM_THRESHOLD_GIB = 4.0
GIB = 1024**3

# Variables that are always defined: the profile's own address, and the bundled demo engine. The demo
# ones are resolved only when a profile that uses them is started (they may assemble the model file).
PROFILE_VARIABLES = ("PORT", "HOST")
BUILTIN_VARIABLES = (
    "ENGINETOP_LLAMA_SERVER", "ENGINETOP_DEMO_MODEL", "ENGINETOP_DEMO_MODELS_DIR",  # `make engine`
    "ENGINETOP_VLLM_PYTHON", "ENGINETOP_VLLM_GEMMA", "ENGINETOP_VLLM_TINY",  # `make vllm`
)

KEY_ON_ARGV = (
    "an API key or other secret must not be on the command line (every user of the machine can read it in "
    "the process list): put an API key in a file and set api_key_file; give a token through env"
)


def engine_options(engine: str | None) -> Options | None:
    """The option table of a profile's engine kind ("llama.cpp", "vllm", "sglang"; None for "other")."""
    known = by_name(engine)
    return known.options if known else None


def _secrets_on_argv(argv: list[str] | tuple[str, ...], secrets: list[str | None] | None = None
                     ) -> list[tuple[int, str]]:
    """A secret on the argv in a spelling any engine takes (a profile's engine kind may be "other", or
    wrong): each engine's table is asked, and the generic rule. A shell's command string (`sh -c "exec
    llama-server -hft ..."`, `bash -lc`, `env ... sh -c`) is split as the shell splits it and each of its
    commands read the same way, with its own engine's table where it runs an engine (tui.engines.argv)."""
    found: dict[int, str] = {}
    for table in (*(e.options for e in ENGINES), None):
        for i, why in secrets_on_argv(argv, table, secrets or ()):
            found.setdefault(i, why)
    return sorted(found.items())

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOML_POS = re.compile(r"\(at line (\d+), column \d+\)")


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
            for name in _VAR.findall(text):
                if name not in found:
                    found.append(name)
        return found

    def _substituted_texts(self) -> list[str]:
        texts = list(self.argv or ())
        texts += list(self.env.values())
        texts += [t for t in (self.workdir, self.api_key_file) if t]
        return texts


# ---------------------------------------------------------------- variables


def _builtin_value(name: str) -> str:
    # Imported here so that listing profiles never touches the demo engines.
    from tui.engines import llamacpp, vllm

    locate: dict[str, Callable[[], Path]] = {
        "ENGINETOP_LLAMA_SERVER": llamacpp.llama_server_binary,
        "ENGINETOP_DEMO_MODEL": llamacpp.demo_model_path,
        "ENGINETOP_DEMO_MODELS_DIR": llamacpp.demo_models_dir,
        "ENGINETOP_VLLM_PYTHON": vllm.vllm_python,
        "ENGINETOP_VLLM_GEMMA": vllm.gemma_hf_dir,
        "ENGINETOP_VLLM_TINY": vllm.tiny_model_dir,
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

    return _VAR.sub(repl, text), missing


# ---------------------------------------------------------------- line numbers


class _KeyLines:
    """Finds the line of `key` (top level or inside [table]) in the raw TOML text."""

    _HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]\s*(#.*)?$")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def key(self, key: str, table: str | None = None) -> int | None:
        pattern = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")
        current: str | None = None
        for number, line in enumerate(self.lines, start=1):
            header = self._HEADER.match(line)
            if header and not line.lstrip().startswith("[["):
                current = header.group(1).strip("\"'")
                continue
            if current == table and pattern.match(line):
                return number
        if table is not None:  # inline table: env = { A = "b" }
            return self.key(table)
        return None

    def text(self, needle: str, after: int | None = None) -> int | None:
        start = (after or 1) - 1
        for number, line in enumerate(self.lines[start:], start=start + 1):
            if needle in line:
                return number
        return after


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
    lines = _KeyLines(text)
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
            for i, why in _secrets_on_argv([item if isinstance(item, str) else "" for item in argv]):
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
    profile: Profile, lines: _KeyLines, environ: Mapping[str, str] | None
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
        for name in _VAR.findall(text):
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
                        _KeyLines(text).key("name"),
                        "name",
                        f"duplicate name {profile.name!r}: already defined in {first}",
                    )
                ]
                profile = None
            issues += found
            if profile is not None:
                profiles[profile.name] = profile
    return ProfileSet(profiles, issues)


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
    from tui.engines.llamacpp import EngineNotInstalled

    lookup = variable_lookup(profile, environ)
    issues: list[ProfileIssue] = []
    lines = _KeyLines(_read_or_empty(profile.path))

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
            api_key, engine_keys = _hand_over_key(profile, argv, env, workdir, api_key, environ)
        except SecretError as exc:
            issues.append(ProfileIssue(profile.path, lines.key("argv"), "argv", str(exc)))
    if argv is not None:
        # Again after substitution: a ${VAR} may expand to a key flag or to the key, and a derived profile
        # (a sweep arm) never went through parse_profile. Every start passes here.
        for i, why in _secrets_on_argv(argv, [api_key, *engine_keys]):
            line = lines.key("argv")
            issues.append(ProfileIssue(profile.path, line, f"argv[{i}]", f"{why}: {KEY_ON_ARGV}"))
    if issues:
        raise ProfileError(issues)
    return ResolvedProfile(profile=profile, argv=argv, env=env, workdir=workdir, api_key=api_key)


def _hand_over_key(
    profile: Profile,
    argv: tuple[str, ...],
    env: dict[str, str],
    workdir: str | None,
    api_key: str | None,
    environ: Mapping[str, str] | None,
) -> tuple[str | None, list[str]]:
    """Make the engine and enginetop agree on the key: give the engine the key enginetop sends, through its
    environment (never argv), and check the key files the engine reads itself the way it reads them.
    Returns enginetop's key and the keys the engine was given in files of its own."""
    if profile.engine == "vllm":
        if api_key is not None:
            env["VLLM_API_KEY"] = api_key  # vLLM reads it from its environment
        return api_key, []
    if profile.engine != "llama.cpp":
        return api_key, []
    launch_env = {**(os.environ if environ is None else environ), **env}
    engine_keys: list[str] = []
    for key_file in _llama_key_files(argv, launch_env):
        # As the engine opens it: no ~ expansion (no shell), relative to its working directory.
        engine_keys += read_llama_key_file(Path(workdir or ".") / key_file)  # SecretError: unusable file
    if api_key is not None:
        # The same stripped key enginetop sends; a CRLF key file handed over as a file would give
        # llama-server a key ending in \r, which no client can send.
        env["LLAMA_API_KEY"] = api_key
    elif engine_keys:
        api_key = engine_keys[0]
    elif launch_env.get("LLAMA_API_KEY", "").strip():  # inherited: llama-server will demand it
        api_key = launch_env["LLAMA_API_KEY"].split(",")[0].strip() or None
    return api_key, engine_keys


def _llama_key_files(argv: tuple[str, ...], launch_env: Mapping[str, str]) -> list[str]:
    """The files llama-server will read keys from: --api-key-file on the argv, else LLAMA_ARG_API_KEY_FILE."""
    files = []
    table = llamacpp.OPTIONS
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if table.canonical(table.resolve(name) or "") != "--api-key-file":  # any spelling: --api_key_file too
            continue
        if eq:
            files.append(value)
        elif i + 1 < len(argv):
            files.append(argv[i + 1])
    if not files and launch_env.get("LLAMA_ARG_API_KEY_FILE"):
        files.append(launch_env["LLAMA_ARG_API_KEY_FILE"])
    return files


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
