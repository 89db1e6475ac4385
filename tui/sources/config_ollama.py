"""Ollama's effective configuration (tui.model.config.EngineConfig), read as it sets itself up: GET
/api/version, the loaded model from GET /api/ps (its context, quantization, parameters, size), the server's
OLLAMA_* settings from `ollama serve`'s environment (tui.engines.ollama.settings: a name that says secret is
masked), and the command line of the runner it started for the model (since 0.3x llama.cpp's own
llama-server, llm/llama_server.go; before, `ollama runner` with the same flags): Ollama gives its runner the
context of all its parallel slots at once (-c num_ctx × OLLAMA_NUM_PARALLEL -np OLLAMA_NUM_PARALLEL), so one
request's context is the runner's context over its slots, each slot its own share. An engine on another
machine gives its API's figures alone."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psutil

from tui.engines import ollama
from tui.engines.argv import Options, mask_argv, parse
from tui.engines.known import ENGINES
from tui.model.config import EngineConfig
from tui.sources.json_answers import Fetch, fetch_json, lenient_int
from tui.sources.native_servers import OLLAMA_PS, OLLAMA_VERSION
from tui.sources.processes import tree_pids

OLLAMA_SHOW = "/api/show"

Post = Callable[[str, dict[str, Any]], Awaitable[tuple[int, bytes]]]  # POST path with a JSON body
_OFF = ("0", "false", "off", "no", "")


def _runner(pid: int, secrets: Sequence[str]) -> tuple[int, list[str], tuple[str, ...]] | None:
    """The runner `ollama serve` (PID `pid`) started for its model: (its PID, its argv, the argv masked)."""
    for child in sorted(tree_pids(pid) - {pid}):
        try:
            argv = psutil.Process(child).cmdline()
        except psutil.Error:
            continue
        # Ollama's runner: `ollama runner …`, or (since 0.3x) llama.cpp's own llama-server
        if "runner" in argv[1:3] or table(argv) is not ollama.OPTIONS:
            return child, argv, mask_argv(argv, table(argv), secrets)
    return None


def _environ(pid: int) -> tuple[dict[str, str], str | None]:
    try:
        return psutil.Process(pid).environ(), None
    except psutil.Error as exc:
        return {}, f"the environment of `ollama serve` (PID {pid}) cannot be read: {exc}"


def table(argv: Sequence[str]) -> Options:
    """The option table its runner is read with: Ollama's runner's, or the engine's own where the runner is
    one enginetop knows (a llama-server)."""
    return next((e.options for e in ENGINES if e.dialect != "ollama" and e.is_engine(argv)), ollama.OPTIONS)


async def ollama_config(fetch: Fetch, pid: int | None, command_lacks: str | None,
                        secrets: Sequence[str] = (), post: Post | None = None) -> EngineConfig:
    """`pid`: `ollama serve`'s process on this machine (None: elsewhere or not found, `command_lacks` says
    why)."""
    lacks: list[str] = []
    sources: list[str] = []
    fields: dict[str, Any] = {}
    version = await fetch_json(fetch, OLLAMA_VERSION, lacks)
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        fields["version"] = version["version"]
        sources.append(OLLAMA_VERSION)
    ps = await fetch_json(fetch, OLLAMA_PS, lacks)
    loaded = [m for m in ps.get("models") or () if isinstance(m, dict)] if isinstance(ps, dict) else []
    if loaded:
        sources.append(OLLAMA_PS)
        m = loaded[0]
        details: dict[str, Any] = m["details"] if isinstance(m.get("details"), dict) else {}
        fields.update(model=m.get("name"), context_tokens=lenient_int(m.get("context_length")),
                      quantization=details.get("quantization_level"), model_bytes=lenient_int(m.get("size")))
        fields["served_names"] = tuple(str(x.get("name")) for x in loaded)
        if post is not None and isinstance(m.get("name"), str):
            await _show(post, m["name"], fields, sources, lacks)
    elif isinstance(ps, dict):
        lacks.append("no model loaded: a model's context and runner are known once a request loads it")
    argv: tuple[str, ...] = ()
    runner_pid = None
    if pid is None:
        lacks.append(command_lacks or "argv: no process of this machine was found listening on its port")
    else:
        environ, why = await asyncio.to_thread(_environ, pid)  # /proc reads: never on the event loop
        if why:
            lacks.append(why)
        fields["published"] = ollama.settings(environ, secrets)
        if environ:
            sources.append(f"OLLAMA_* (PID {pid})")
        found = await asyncio.to_thread(_runner, pid, secrets)
        if found is not None:
            runner_pid, raw, argv = found
            sources.append(f"argv of its runner (PID {runner_pid})")
            _runner_fields(parse(list(argv), table(raw)).options, fields)
        elif loaded:
            lacks.append(f"the runner of {fields.get('model')} is no child process of `ollama serve` here")
        kv = environ.get("OLLAMA_KV_CACHE_TYPE")
        if kv and "kv_cache_dtype" not in fields:
            fields["kv_cache_dtype"] = kv
        flash = environ.get("OLLAMA_FLASH_ATTENTION")
        if flash is not None and "flash_attn" not in fields:
            fields["flash_attn"] = "off" if flash.strip().lower() in _OFF else "on"
    return EngineConfig(engine="Ollama", read_wall=time.time(), argv=argv, pid=runner_pid,
                        sources=tuple(sources), lacks=tuple(lacks), **fields)


async def _show(post: Post, model: str, fields: dict[str, Any], sources: list[str], lacks: list[str]) -> None:
    """The model's own facts (POST /api/show, model_info as the GGUF has it): its parameters and the context
    it was trained for."""
    try:
        status, body = await post(OLLAMA_SHOW, {"model": model})
        shown = json.loads(body) if status == 200 else None
    except ValueError as exc:
        lacks.append(f"{OLLAMA_SHOW}: {exc}")
        return
    info = shown.get("model_info") if isinstance(shown, dict) else None
    if not isinstance(info, dict):
        lacks.append(f"{OLLAMA_SHOW} answered HTTP {status} without model_info")
        return
    sources.append(OLLAMA_SHOW)
    arch = info.get("general.architecture")
    fields["params"] = lenient_int(info.get("general.parameter_count"))
    if isinstance(arch, str):
        fields["train_context"] = lenient_int(info.get(f"{arch}.context_length"))


def _runner_fields(opts: dict[str, str], fields: dict[str, Any]) -> None:
    """The runner's settings: its --ctx-size is every slot's context together, split between its --parallel
    slots."""
    total, parallel = lenient_int(opts.get("--ctx-size")), lenient_int(opts.get("--parallel"))
    if total:
        fields["kv_pool_tokens"] = total
        if parallel and parallel > 0:
            fields["context_tokens"] = total // parallel
    if parallel:
        # each slot has its own num_ctx by Ollama's design (no unified pool to ask for): not llama-server's
        # split, which its findings would answer with llama-server's flags
        fields["slots"] = parallel
    fields["batch_size"] = lenient_int(opts.get("--batch-size"))
    fields["gpu_layers"] = opts.get("--n-gpu-layers") or opts.get("--gpu-layers")
    if "--flash-attn" in opts:  # llama-server's takes a value (on, off, auto); Ollama's old runner none
        fields["flash_attn"] = opts["--flash-attn"] or "on"
    fields["ubatch_size"] = lenient_int(opts.get("--ubatch-size"))
    kv = opts.get("--kv-cache-type") or opts.get("--cache-type-k")
    if kv:
        fields["kv_cache_dtype"] = kv
