"""llama-swap (a proxy that starts and stops one engine process per model on demand): its models and their
states from GET /running and /v1/models, the requests in flight from its event stream (/api/events), its
active profile, and for each model /running says is `ready` the model's own /metrics and /slots through
/upstream/{model}/.

llama-swap STARTS a model on any request that names it, /upstream/{model}/... included, so a model is read
through /upstream only when /running has just said it is ready; a model stopped in between would be started
by that read, which llama-swap's `upstream.ignorePaths` (e.g. ["^/metrics$", "^/slots$"]) prevents: it
then answers 409, read here as "not ready". Shapes as in llama-swap's internal/server (api.go, apigroup.go).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import orjson

from tui.model.samples import EngineReading, RoutedModel
from tui.sources.metrics import MetricsFormatError, parse_reading
from tui.sources.router import MODELS_PATH, Fetch, parse_models, plural
from tui.sources.slots import SLOTS_PATH, parse_slots

LABEL = "llama-swap"
RUNNING_PATH = "/running"
EVENTS_PATH = "/api/events"
PROFILES_PATH = "/api/profiles"
IGNORED = 409  # a path in upstream.ignorePaths while the model is not loaded: nothing was started

# () -> the in-flight requests of the event stream's first snapshot, or why they could not be read
Events = Callable[[], Awaitable[list[dict[str, Any]] | str]]


def running_states(status: int, body: bytes) -> dict[str, str] | None:
    """/running's {model: state}, or None when this is not llama-swap's answer."""
    if status != 200:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    items = data.get("running") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    return {str(i["model"]): str(i.get("state") or "unknown") for i in items
            if isinstance(i, dict) and isinstance(i.get("model"), str)}


def inflight_snapshot(line: bytes) -> list[dict[str, Any]] | None:
    """The requests of an SSE `data:` line carrying the stream's `inflight` snapshot, else None. Each message
    is {"type", "data"} with `data` itself JSON text."""
    if not line.startswith(b"data:"):
        return None
    try:
        message = orjson.loads(line[5:])
        if message.get("type") != "inflight":
            return None
        data = orjson.loads(message.get("data") or "{}")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None
    if not isinstance(data, dict) or data.get("operation") != "snapshot":
        return None
    requests = data.get("requests") or []
    return [r for r in requests if isinstance(r, dict)] if isinstance(requests, list) else []


def upstream(model: str, path: str) -> str:
    return f"/upstream/{quote(model, safe='')}{path}"


async def read_swap(fetch: Fetch, events: Events, metrics_path: str,
                    states: dict[str, str]) -> tuple[tuple[RoutedModel, ...], str]:
    """Every model llama-swap has (from /v1/models, states from /running: `states`), the figures of the ready
    ones, and a summary line. ValueError when the model list cannot be read."""
    status, body, over = await fetch(MODELS_PATH)
    if status != 200 or over:
        raise ValueError(f"{MODELS_PATH} answered HTTP {status}" if status != 200 else
                         f"{MODELS_PATH} is too large")
    ids = [item["id"] for item in parse_models(body)]
    ids += sorted(set(states) - set(ids))  # unlisted ones that run
    inflight = await events()
    words = []
    if isinstance(inflight, str):
        words.append(f"in-flight requests unknown ({inflight})")
    profile = await _active_profile(fetch)
    models = []
    for model_id in ids:
        model = RoutedModel(model_id, states.get(model_id, "stopped"))
        if not isinstance(inflight, str):
            mine = [r for r in inflight if r.get("model") == model_id]
            oldest = max((r.get("elapsed_ms") or 0 for r in mine), default=None)
            model = replace(model, in_flight=len(mine), oldest_ms=oldest if mine else None)
        if model.status == "ready":
            model = await _ready(fetch, metrics_path, model)
        models.append(model)
    ready = sum(m.status == "ready" for m in models)
    summary = f"{LABEL}: {len(models)} model{plural(len(models))}, {ready} ready" + (
        f", profile {profile}" if profile else "")
    return tuple(models), "; ".join([summary, *words])


async def _active_profile(fetch: Fetch) -> str | None:
    try:
        status, body, _ = await fetch(PROFILES_PATH)
        active = orjson.loads(body).get("active") if status == 200 else None
    except (ValueError, AttributeError, orjson.JSONDecodeError):
        return None
    return active if isinstance(active, str) else None


async def _ready(fetch: Fetch, metrics_path: str, model: RoutedModel) -> RoutedModel:
    reading: EngineReading | None = None
    try:
        status, body, over = await fetch(upstream(model.id, metrics_path))
        if status == IGNORED:
            return replace(model, error="stopped before it could be read (ignorePaths)")
        if status != 200 or over:
            return replace(model, error=f"{metrics_path} through /upstream answered HTTP {status}")
        reading = parse_reading(body.decode("utf-8", "replace"))
        slots = None
        if reading.dialect == "llamacpp":
            status, body, over = await fetch(upstream(model.id, SLOTS_PATH))
            slots = parse_slots(status, body) if not over and status != IGNORED else None
    except (MetricsFormatError, ValueError) as exc:
        return replace(model, reading=reading, error=str(exc))
    return replace(model, reading=reading, slots=slots)
