"""Which discovered engine may be given an API key whose flag names none (`--api-key-file PATH`,
`--api-key-env VAR` with no NAME=).

A key goes only to an engine named for it (NAME=PATH, NAME as discovery named it), or, unnamed, to the single
engine found whose process enginetop can read and that runs as the same user as enginetop. Otherwise a bare
key would go to whatever happened to answer: a server another user started on a usual port (its process
unreadable without root, or readable as root but not this user's) would be handed the key of the engine the
user meant. Such a flag is refused, with what was found and how to name it.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence

from tui.sources.discover_found import FoundEngine


class UnnamedKeyError(ValueError):
    """A key flag with no NAME= that cannot be given to the engines found."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _why_not_mine(engine: FoundEngine, euid: int) -> str | None:
    """Why `engine` is not surely this user's own (None: it is)."""
    if engine.pid is None or engine.uid is None:
        return ("its process cannot be read (another user's, or in a container), so whose it is cannot be "
                "told")
    if engine.uid != euid:
        return f"its process runs as {_user(engine.uid)}, not as {_user(euid)} (who runs enginetop)"
    return None


def check_unnamed_keys(engines: Sequence[FoundEngine], key_files: list[str] | None,
                       key_envs: list[str] | None, euid: int | None = None) -> None:
    """Raise UnnamedKeyError when a key flag names no engine and the engines found are not exactly one that
    runs as this user with a readable process. None found: left to the caller's own "found: none"."""
    euid = os.geteuid() if euid is None else euid
    bare = [(flag, value, what) for flag, values, what in (("--api-key-file", key_files, "PATH"),
                                                          ("--api-key-env", key_envs, "VAR"))
            for value in values or () if "=" not in value]
    if not bare or not engines:
        return
    flag, value, what = bare[0]
    if len(engines) > 1:
        names = ", ".join(e.name for e in engines)
        raise UnnamedKeyError(f"{flag} {value!r} names no engine, and {len(engines)} were found ({names}): "
                              f"name the one it is for, e.g. {flag} {engines[0].name}={what}")
    [engine] = engines
    why = _why_not_mine(engine, euid)
    if why is None:
        return
    raise UnnamedKeyError(
        f"{flag} {value!r} names no engine, and the one found, {engine.name} ({engine.found_as()}), is not "
        f"sent a key unasked: {why}. If it is the engine the key is for, name it: "
        f"{flag} {engine.name}={what}")
