"""API keys and a profile: never on the engine's command line, one key the engine and enginetop agree on.

A key on the command line is readable by every user of the machine in the process list, so a profile that puts
one there is refused twice: when its file is parsed (the text as written) and when it is resolved for a start
(after ${VAR} substitution, and for a derived profile, a sweep arm, that no file ever held). The key enginetop
sends is handed to the engine through its environment; the key files the engine reads itself are read here the
way it reads them, so that a key it would mangle is refused before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tui.base.secrets import read_llama_key_file
from tui.engines import llamacpp
from tui.engines.argv import secrets_on_argv
from tui.engines.known import ENGINES
from tui.lifecycle.profiles import Profile

KEY_ON_ARGV = (
    "an API key or other secret must not be on the command line (every user of the machine can read it in "
    "the process list): put an API key in a file and set api_key_file; give a token through env"
)


def secrets_on_argv_any_engine(
    argv: list[str] | tuple[str, ...], secrets: list[str | None] | None = None
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


def hand_over_key(
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
