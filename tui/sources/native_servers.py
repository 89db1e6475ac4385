"""Servers that publish no Prometheus metrics but say which models they hold, each in its own API: Ollama
(api/types.go: GET /api/version, /api/ps for the loaded models, /api/tags for the installed ones) and LM
Studio (its REST API: GET /api/v0/models). Each is read as a router of models (tui.model.samples.RoutedModel)
with what its API gives of each: size and its share on the GPU, context, quantization, parameters, and
Ollama's keep-alive deadline. Their request figures come from enginetop's proxy and probes, not from here.

A fingerprint (`which_server`) tells them from any other OpenAI-compatible server: Ollama answers
/api/version with {"version": ...} and /api/ps with {"models": [...]}; LM Studio answers /api/v0/models with
{"object": "list", "data": [...]} whose entries carry a `state`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from tui.model.samples import RoutedModel
from tui.sources.json_answers import json_object, nonempty_str, parse_json, strict_int

Fetch = Callable[[str], Awaitable[tuple[int, bytes, bool]]]  # GET path -> (status, body, over the limit)
Native = Literal["ollama", "lm-studio"]

OLLAMA_VERSION, OLLAMA_PS, OLLAMA_TAGS = "/api/version", "/api/ps", "/api/tags"
LMSTUDIO_MODELS = "/api/v0/models"
LMSTUDIO_GREETING = "/lmstudio-greeting"  # {"lmstudio": true}: how its own `lms` and SDKs tell it
NAMES: dict[Native, str] = {"ollama": "Ollama", "lm-studio": "LM Studio"}


def _json(status: int, body: bytes) -> Any:
    """The JSON of an answer of 200; None for any other answer, and for one that is not JSON."""
    return parse_json(body) if status == 200 else None


async def which_server(fetch: Fetch) -> Native | None:
    """Ollama, LM Studio, or neither, from their own routes (two or three GETs)."""
    ps = _json(*(await fetch(OLLAMA_PS))[:2])
    if isinstance(ps, dict) and isinstance(ps.get("models"), list):
        version = _json(*(await fetch(OLLAMA_VERSION))[:2])
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            return "ollama"
    greeting = _json(*(await fetch(LMSTUDIO_GREETING))[:2])
    if is_lmstudio(greeting, None):
        return "lm-studio"
    return None


def is_lmstudio(greeting: Any, listed: Any) -> bool:
    """LM Studio's greeting, or a model list (/api/v0/models) whose models carry its `state`."""
    if isinstance(greeting, dict) and greeting.get("lmstudio") is True:
        return True
    data = listed.get("data") if isinstance(listed, dict) else None
    return isinstance(data, list) and bool(data) and all(isinstance(m, dict) and "state" in m for m in data)


def expires_wall(text: Any) -> float | None:
    """Ollama's expires_at (RFC 3339, nanoseconds) as a wall time; None when not one."""
    if not isinstance(text, str) or not text:
        return None
    stamp = text.replace("Z", "+00:00")
    head, dot, rest = stamp.partition(".")
    if dot:  # Python's parser takes at most microseconds: the nanoseconds' last digits are dropped
        digits = len(rest) - len(rest.lstrip("0123456789"))  # the fraction, then the zone (+02:00)
        stamp = f"{head}.{rest[:min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def ollama_models(ps: Any, tags: Any) -> tuple[RoutedModel, ...]:
    """Every model Ollama has: the loaded ones (/api/ps) with their memory, its share on the GPU, context
    and keep-alive deadline; the others (/api/tags) as unloaded."""
    loaded: dict[str, RoutedModel] = {}
    for m in ps.get("models") or () if isinstance(ps, dict) else ():
        if not isinstance(m, dict) or not nonempty_str(m.get("name")):
            continue
        details = json_object(m.get("details"))
        loaded[m["name"]] = RoutedModel(
            id=m["name"], status="loaded", size_bytes=strict_int(m.get("size")),
            vram_bytes=strict_int(m.get("size_vram")), context_tokens=strict_int(m.get("context_length")),
            expires_wall=expires_wall(m.get("expires_at")),
            quantization=nonempty_str(details.get("quantization_level")),
            parameters=nonempty_str(details.get("parameter_size")),
            family=nonempty_str(details.get("family")))
    installed = []
    for m in tags.get("models") or () if isinstance(tags, dict) else ():
        if isinstance(m, dict) and nonempty_str(m.get("name")) and m["name"] not in loaded:
            details = json_object(m.get("details"))
            installed.append(RoutedModel(
                id=m["name"], status="unloaded", size_bytes=strict_int(m.get("size")),
                quantization=nonempty_str(details.get("quantization_level")),
                parameters=nonempty_str(details.get("parameter_size")),
                family=nonempty_str(details.get("family"))))
    return (*loaded.values(), *installed)


def lmstudio_models(listed: Any) -> tuple[RoutedModel, ...]:
    """LM Studio's models (/api/v0/models): loaded or not, quantization, context, architecture."""
    out = []
    for m in listed.get("data") or () if isinstance(listed, dict) else ():
        if not isinstance(m, dict) or not nonempty_str(m.get("id")):
            continue
        state = m.get("state")
        out.append(RoutedModel(
            id=m["id"], status="loaded" if state == "loaded" else "unloaded",
            context_tokens=(strict_int(m.get("loaded_context_length"))
                            or strict_int(m.get("max_context_length"))),
            quantization=nonempty_str(m.get("quantization")), family=nonempty_str(m.get("arch"))))
    return tuple(out)


async def read_models(fetch: Fetch, kind: Native) -> tuple[RoutedModel, ...]:
    """The server's models now. ValueError: why they could not be read."""
    if kind == "ollama":
        status, body, _ = await fetch(OLLAMA_PS)
        ps = _json(status, body)
        if not isinstance(ps, dict):
            raise ValueError(f"{OLLAMA_PS} answered HTTP {status}, not Ollama's list of loaded models")
        return ollama_models(ps, _json(*(await fetch(OLLAMA_TAGS))[:2]))
    status, body, _ = await fetch(LMSTUDIO_MODELS)
    listed = _json(status, body)
    if not isinstance(listed, dict):
        raise ValueError(f"{LMSTUDIO_MODELS} answered HTTP {status}, not LM Studio's list of models")
    return lmstudio_models(listed)


def summary(kind: Native, models: tuple[RoutedModel, ...]) -> str:
    """"Ollama: 3 models, 1 loaded", as a router's column head says it."""
    loaded = sum(m.status == "loaded" for m in models)
    return f"{NAMES[kind]}: {len(models)} model{'s' if len(models) != 1 else ''}, {loaded} loaded"
