"""Engine specs (`NAME=URL`) and profiles into EngineTargets, with API keys read from files or env only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tui.base.secrets import read_api_key
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import Profile, ProfileError
from tui.model.targets import EngineTarget
from tui.net.policy import split_credentials
from tui.sources.discover import FoundEngine


class TargetError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    url: str  # public: any user:password@ has been split off into basic_auth
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)


def parse_engine_spec(spec: str) -> EngineSpec:
    """`NAME=URL` or a bare URL (named after host:port). Credentials in the URL never reach the name or
    the URL that is shown: they are kept apart and sent as Basic auth."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = "", spec
    url = url.strip().rstrip("/")
    try:
        public, basic = split_credentials(url)
        parts = urlsplit(public)
        port = parts.port
    except ValueError as exc:
        shown = spec.rpartition("@")[2] if "@" in spec else spec
        raise TargetError(f"--engine {shown!r}: not a valid URL ({exc}); ports run from 1 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = f"{name}={public}" if name else public
        raise TargetError(f"--engine {shown!r}: expected NAME=http://HOST:PORT (got no http(s) URL)")
    if port == 0:
        raise TargetError(f"--engine {public!r}: port 0 is not a port an engine can listen on")
    return EngineSpec(name.strip() or parts.netloc, public, basic)


def _by_name(pairs: list[str] | None, flag: str, only: str | None = None) -> dict[str, str]:
    """`NAME=VALUE` pairs; a bare VALUE names the `only` engine there is, if there is one."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep and only is not None:
            name, value = only, pair
        elif not sep or not name or not value:
            raise TargetError(f"{flag} {pair!r}: expected ENGINE_NAME=VALUE")
        out[name] = value
    return out


def keys_by_name(key_files: list[str] | None, key_envs: list[str] | None) -> dict[str, str]:
    """--api-key-file NAME=PATH and --api-key-env NAME=VAR, read: {NAME: key}."""
    files = _by_name(key_files, "--api-key-file")
    envs = _by_name(key_envs, "--api-key-env")
    keys = {}
    for name in {**files, **envs}:
        key = read_api_key(files.get(name), envs.get(name))
        if key is not None:
            keys[name] = key
    return keys


def _key(files: dict[str, str], envs: dict[str, str], name: str) -> str | None:
    return read_api_key(files.get(name), envs.get(name)) if (name in files or name in envs) else None


def build_targets(engines: list[str] | None, key_files: list[str] | None = None,
                  key_envs: list[str] | None = None, *, discovering: bool = False) -> list[EngineTarget]:
    """--engine NAME=URL (repeatable) with --api-key-file NAME=PATH / --api-key-env NAME=VAR; with a single
    engine, NAME= may be left out of the key flags. `discovering` (no --engine, and the engines found will be
    watched): the key flags are left to discovered_targets, which knows the names found."""
    if discovering and not engines:
        return []
    specs = [parse_engine_spec(spec) for spec in engines or []]
    only = specs[0].name if len(specs) == 1 else None
    files = _by_name(key_files, "--api-key-file", only)
    envs = _by_name(key_envs, "--api-key-env", only)
    targets: list[EngineTarget] = []
    seen: set[str] = set()
    for parsed in specs:
        if parsed.name in seen:
            raise TargetError(f"two engines are named {parsed.name!r}: give each --engine a distinct NAME=")
        seen.add(parsed.name)
        targets.append(EngineTarget(name=parsed.name, url=parsed.url, api_key=_key(files, envs, parsed.name),
                                    basic_auth=parsed.basic_auth))
    unknown = (set(files) | set(envs)) - seen
    if unknown:
        given = ", ".join(sorted(seen)) or "none"
        raise TargetError(f"API key given for unknown engine(s): {', '.join(sorted(unknown))} (the --engine "
                          f"names given: {given})")
    return targets


def discovered_targets(engines: Sequence[FoundEngine], key_files: list[str] | None = None,
                       key_envs: list[str] | None = None) -> list[EngineTarget]:
    """The engines discovery found on this machine (tui.sources.discover), watched as --engine NAME=URL would
    watch them: never started, stopped or loaded. The key flags name them as found (the name their line
    says); with one found, NAME= may be left out."""
    only = engines[0].name if len(engines) == 1 else None
    files = _by_name(key_files, "--api-key-file", only)
    envs = _by_name(key_envs, "--api-key-env", only)
    unknown = (set(files) | set(envs)) - {e.name for e in engines}
    if unknown:
        found = ", ".join(e.name for e in engines) or "none"
        raise TargetError(f"API key given for {', '.join(sorted(unknown))}: neither an --engine given nor an "
                          f"engine found on this machine (found: {found})")
    # the API its probes speak, where its command line said what it is (Ollama's native one, tui.probe.ollama;
    # an engine's OpenAI one): said here, so that they need not ask
    return [EngineTarget(name=e.name, url=e.url, api_key=_key(files, envs, e.name), api=_api(e))
            for e in engines]


def _api(engine: FoundEngine) -> str | None:
    if engine.how != "command line":
        return None
    return "ollama" if engine.program == "Ollama" else "openai"


def profile_target(profile: Profile, *, strict: bool = False) -> EngineTarget:
    """The engine a profile runs, as every poller, probe and recorder must see it: its URL, its health and
    metrics paths, and its API key (so it is sent, and scrubbed from whatever is written). A key file that
    cannot be read raises ProfileError when `strict`; else it gives no key here, and the lifecycle's
    resolve step reports it where the user sees it."""
    api_key = None
    if profile.api_key_file:
        try:
            api_key = resolve(profile).api_key
        except ProfileError:
            if strict:
                raise
    return EngineTarget(name=profile.name, url=profile.url, api_key=api_key,
                        health_path=profile.health_path, metrics_path=profile.metrics_path,
                        model=profile.router_model)
