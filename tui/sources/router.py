"""A llama-server in router mode (several models behind one server): its models from GET /models, and for
each loaded one its /metrics and /slots with `?model=ID&autoload=false`. The router loads an unloaded model
on any GET that names it unless autoload=false is given, so nothing here names a model that is not loaded,
and every request that does carries autoload=false: looking at a router never loads or wakes a model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import orjson

from tui.model.samples import EngineReading, RoutedModel
from tui.model.slots import SlotsReading
from tui.net.keepalive import StreamLines
from tui.sources.metrics import MetricsFormatError, parse_reading
from tui.sources.slots import SLOTS_PATH, parse_slots

MODELS_PATH = "/models"
NEEDS_MODEL = "model name is missing"  # the router's /metrics and /slots without ?model=

# (path with query) -> (status, body, over the size cap); raises with a user-facing message
Fetch = Callable[[str], Awaitable[tuple[int, bytes, bool]]]


def plural(n: int) -> str:
    return "" if n == 1 else "s"


def parse_models(body: bytes) -> list[dict[str, Any]]:
    data = orjson.loads(body)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"{MODELS_PATH} has no model list")
    return [item for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)]


def query(model: str) -> str:
    return f"?model={quote(model, safe='')}&autoload=false"


async def read_router(fetch: Fetch, metrics_path: str) -> tuple[RoutedModel, ...]:
    """Every model the router has, and the figures of those loaded. ValueError when /models cannot be read."""
    status, body, over = await fetch(MODELS_PATH)
    if status != 200 or over:
        raise ValueError(f"{MODELS_PATH} answered HTTP {status}" if status != 200 else
                         f"{MODELS_PATH} is too large")
    models = []
    for item in parse_models(body):
        state = item["status"] if isinstance(item.get("status"), dict) else {}
        value = str(state.get("value") or "unknown")
        code = state.get("exit_code")
        model = RoutedModel(item["id"], value, failed=bool(state.get("failed")),
                            exit_code=code if isinstance(code, int) else None)
        if value == "loaded":
            model = await _loaded(fetch, metrics_path, model)
        models.append(model)
    return tuple(models)


async def _loaded(fetch: Fetch, metrics_path: str, model: RoutedModel) -> RoutedModel:
    reading: EngineReading | None = None
    error = None
    try:
        status, body, over = await fetch(metrics_path + query(model.id))
        if status == 200 and not over:
            reading = parse_reading(body.decode("utf-8", "replace"))
        else:
            error = f"{metrics_path} of {model.id} answered HTTP {status}"
        status, body, over = await fetch(SLOTS_PATH + query(model.id))
        slots = parse_slots(status, body) if not over else SlotsReading(error=f"{SLOTS_PATH} is too large")
    except (MetricsFormatError, ValueError) as exc:
        return replace(model, reading=reading, error=str(exc))
    return replace(model, reading=reading, slots=slots, error=error)


SSE_PATH = "/models/sse"


class LoadProgress:
    """Each loading model's progress from the router's event stream (GET /models/sse): /models does not
    carry it, and the stream does not repeat it, so it is followed while a model loads. Events are
    `{"model", "event": "status_change", "data": {"status", "progress": {"current", "value"}}}`."""

    def __init__(self) -> None:
        self.of: dict[str, float] = {}  # model id -> share of its load done (0..1)
        self._lines = StreamLines()

    def feed(self, piece: bytes) -> bool:
        """A piece of the stream as it came (for tui.net.keepalive's `until`): never enough, read on."""
        for line in self._lines.feed(piece):
            if not line.startswith(b"data:"):
                continue
            try:
                event = orjson.loads(line[5:])
                model, data = event["model"], event.get("data") or {}
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            progress = data.get("progress") if isinstance(data, dict) else None
            if isinstance(progress, dict) and isinstance(progress.get("value"), int | float):
                self.of[str(model)] = float(progress["value"])
            elif isinstance(data, dict) and data.get("status") not in (None, "loading"):
                self.of.pop(str(model), None)
        return False
