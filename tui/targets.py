"""Turning command-line engine specs into EngineTargets, with API keys read from files or env only."""

from __future__ import annotations

from urllib.parse import urlparse

from tui.sources.engine import EngineTarget


class TargetError(ValueError):
    pass


def parse_engine_spec(spec: str) -> tuple[str, str]:
    """`NAME=URL` or a bare URL (named after host:port)."""
    name, sep, url = spec.partition("=")
    if not sep:
        name, url = "", spec
    url = url.strip().rstrip("/")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise TargetError(f"--engine {spec!r}: expected NAME=http://HOST:PORT (got no http(s) URL)")
    return (name.strip() or parsed.netloc), url


def _by_name(pairs: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise TargetError(f"{flag} {pair!r}: expected ENGINE_NAME=VALUE")
        out[name] = value
    return out


def build_targets(engines: list[str] | None, key_files: list[str] | None = None,
                  key_envs: list[str] | None = None) -> list[EngineTarget]:
    from tui.secrets import read_api_key

    files = _by_name(key_files, "--api-key-file")
    envs = _by_name(key_envs, "--api-key-env")
    targets: list[EngineTarget] = []
    seen: set[str] = set()
    for spec in engines or []:
        name, url = parse_engine_spec(spec)
        if name in seen:
            raise TargetError(f"two engines are named {name!r}: give each --engine a distinct NAME=")
        seen.add(name)
        key = read_api_key(files.get(name), envs.get(name)) if (name in files or name in envs) else None
        targets.append(EngineTarget(name=name, url=url, api_key=key))
    unknown = (set(files) | set(envs)) - seen
    if unknown:
        raise TargetError(f"API key given for unknown engine(s): {', '.join(sorted(unknown))}")
    return targets
