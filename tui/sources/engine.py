"""Poll one engine: /health, /v1/models, /metrics, and a llama-server's /slots. Never raises: each failure
becomes words to act on.

The transport is passed in so the app keeps one connection per engine (tui.net.keepalive). The API key
is sent as `Authorization: Bearer` (vLLM, llama.cpp and SGLang all accept it) and is scrubbed from every
message this module produces. The requests themselves and their words are tui.sources.engine_http; /metrics,
tui.sources.engine_metrics; routers of models (llama-server's router mode, llama-swap),
tui.sources.engine_routers; the engine's configuration, tui.sources.engine_config.
"""

from __future__ import annotations

import json
import time

from tui.model.samples import EngineReading, EngineSample, Health, RoutedModel, RouterKind
from tui.model.slots import SlotsReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transport
from tui.net.policy import InsecureSecret, error_text, target_headers
from tui.sources import swap as swap_source
from tui.sources.engine_http import (
    ERROR_BODY_BYTES,
    NOT_YET,
    REFUSED,
    Failed,
    address_of,
    auth_message,
    fetch_path,
    path_fetcher,
    scrub,
)
from tui.sources.engine_metrics import METRICS_OFF, NO_METRICS, NameFilter, is_sglang, read_metrics
from tui.sources.engine_routers import router_models, swap_models, swap_states
from tui.sources.native_servers import NAMES, Native, read_models, summary, which_server
from tui.sources.router import NEEDS_MODEL, plural
from tui.sources.slots import SLOTS_PATH, parse_slots


def nothing_listened(sample: EngineSample) -> bool:
    """The poll found nothing listening on the engine's port (REFUSED, NOT_YET: tui.sources.engine_http)."""
    reason = sample.health_reason or ""
    return sample.health != "up" and reason.startswith((REFUSED, NOT_YET))


def _model_id(body: bytes) -> str | None:
    try:
        data = json.loads(body)
        model = data["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return model if isinstance(model, str) else None


async def poll_engine(transport: Transport, target: EngineTarget, *, timeout: float = 2.0,
                      max_body: int = 8 * 2**20, launched_by_us: bool = False,
                      known_model: str | None = None, check_health: bool = True,
                      router: RouterKind | None = None, only: NameFilter | None = None,
                      idle_slots: tuple[EngineReading, SlotsReading] | None = None,
                      slots_read: SlotsReading | None = None, plain: str | None = None) -> EngineSample:
    """One poll. `launched_by_us`: a refused connection means "still starting" (vLLM binds its port only
    after loading the model), not "down". `known_model`: the model id from a recent poll, so /v1/models
    need not be asked again (a dashboard polling every second asks it only now and then). `check_health`
    False: go straight to /metrics, and ask /health only if that fails (a healthy engine then costs one
    request a poll; a caller asks /health itself every few seconds, since a dead vLLM engine core still
    serves /metrics). `router`: the last poll found a router (llama-server's router mode or llama-swap), so
    its models are read at once (/metrics without a model only answers 400 on llama-server's). `only`: ask
    /metrics for the series read here alone (NameFilter). `idle_slots`: a llama-server's /slots as last read
    and the /metrics reading taken with them, every slot idle then: while /metrics reads exactly the same, no
    request has run since, so those slots are given again without asking (the caller bounds how long).
    `slots_read`: a llama-server without --metrics whose /slots are being read meanwhile
    (tui.sources.slot_watch): the latest reading, given instead of asking again. `plain`: the last poll found
    a server with no metrics that is neither Ollama nor LM Studio, and said this of it: while its /metrics
    still answers so, it is not asked anything more (the caller asks afresh every few seconds)."""
    where = address_of(target.url)

    def sample(health: Health, reason: str | None = None, model: str | None = None,
               reading: EngineReading | None = None, metrics_error: str | None = None,
               slots: SlotsReading | None = None, models: tuple[RoutedModel, ...] | None = None,
               router: RouterKind | None = None) -> EngineSample:
        if slots is not None and slots.error is not None:
            slots = SlotsReading(error=scrub(slots.error, target))
        return EngineSample(
            name=target.name, url=target.url, t=time.monotonic(), wall=time.time(), health=health,
            health_reason=scrub(reason, target), model=model, reading=reading,
            metrics_error=scrub(metrics_error, target), slots=slots, models=models, router=router,
        )

    async def routed(health: Health) -> EngineSample:
        """A llama-server in router mode: its models, and the figures of the loaded ones."""
        models = await router_models(transport, target, headers, timeout)
        if isinstance(models, str):
            return sample(health, None, None, None, f"router mode: {models}")
        loaded = sum(m.status == "loaded" for m in models)
        return sample(health, None, f"router: {len(models)} model{plural(len(models))}, {loaded} loaded",
                      models=models, router="llama-server")

    async def swapped(states: dict[str, str] | None = None) -> EngineSample:
        """llama-swap: its models and their states, requests in flight, and the figures of the ready ones."""
        read = await swap_models(transport, target, headers, timeout, states)
        if isinstance(read, str):
            return sample("up", None, None, None, f"{swap_source.LABEL}: {read}")
        models, summary = read
        return sample("up", None, summary, models=models, router="llama-swap")

    if target.api_key is not None and not (target.api_key.isascii() and target.api_key.isprintable()):
        # httpx would fail on it, and its error could quote the header: say so without the key.
        return sample("down", "the API key for this engine has characters an HTTP header cannot carry "
                      "(a line break, control or non-ASCII character)")
    try:
        headers = target_headers(target)
    except InsecureSecret as exc:
        return sample("down", str(exc))

    async def native(kind: Native, model: str | None) -> EngineSample:
        """Ollama or LM Studio: their models as their own API gives them (no /metrics: request figures come
        from enginetop's proxy and probes)."""
        try:
            models = await read_models(fetch, kind)
        except ValueError as exc:
            return sample("up", None, model, None, f"{NAMES[kind]}: {exc}")
        return sample("up", None, summary(kind, models), models=models, router=kind)

    fetch = path_fetcher(transport, target, headers, timeout)

    if router is not None and known_model is not None and not check_health:
        if router in ("ollama", "lm-studio"):
            native_sample = await native(router, known_model)
            if native_sample.models is not None:
                return native_sample  # else asked afresh below: gone, or another server now
        routed_sample = await (swapped() if router == "llama-swap" else routed("up"))
        if routed_sample.models is not None:
            return routed_sample
    if not check_health and known_model is not None:
        reading, metrics_error = await read_metrics(transport, target, headers, timeout, max_body, only)
        if reading is not None or metrics_error == METRICS_OFF:
            slots = slots_read if slots_read is not None and metrics_error == METRICS_OFF else \
                await _slots(transport, target, headers, timeout, reading, idle_slots,
                             llama=metrics_error == METRICS_OFF)
            return sample("up", None, known_model, reading, metrics_error, slots)
        if plain is not None and metrics_error is not None and metrics_error.startswith(NO_METRICS):
            # an OpenAI-compatible server found to be no engine enginetop reads: nothing more to ask each
            # poll (its /health may be a gateway's, which asks every model behind it), its words kept
            return sample("up", None, known_model, None, plain)

    # /health first: when the engine is down or loading, /models and /metrics would only repeat that.
    health: Health = "up"
    try:
        status, body, _ = await fetch_path(transport, target, target.health_path, headers, timeout,
                                      ERROR_BODY_BYTES)
    except Failed as exc:
        if exc.refused and launched_by_us:
            return sample("starting", f"{NOT_YET} {where} (starting up)")
        if not (exc.late and await _gateway(transport, target, headers, timeout, max_body)):
            return sample("down", str(exc))
        # a gateway's /health may ask every model behind it first (LiteLLM's takes seconds): its model
        # list answers at once, and the rest of the poll says the rest
        status, body = 200, b""
        health_note: str | None = (f"{target.health_path} is slow (a gateway's asks every model behind it): "
                                   f"{exc}")
    else:
        health_note = None
    no_health_route = status == 404
    if status == 503:
        detail = error_text(body)
        if "loading model" in detail.lower():  # llama-server answers every path so while it loads
            return sample("loading", "loading model")
        reason = f"{where}{target.health_path} answered HTTP 503" + (f": {detail}" if detail else "")
        return sample("starting" if launched_by_us else "down", reason)
    if status in (401, 403):
        return sample("down", auth_message(bool(target.api_key)))
    if status != 200 and not no_health_route:
        detail = error_text(body)
        reason = f"{where}{target.health_path} answered HTTP {status}" + (f": {detail}" if detail else "")
        return sample("down", reason)

    model = known_model
    models_ok = known_model is not None
    if known_model is None:
        try:
            status, body, _ = await fetch_path(transport, target, "/v1/models", headers, timeout, 1 << 20)
            if status == 200:
                models_ok = True
                model = _model_id(body)
        except Failed:
            pass  # the model name is a nicety; /metrics below reports reachability problems in full

    reading, metrics_error = await read_metrics(transport, target, headers, timeout, max_body, only)
    if no_health_route and not models_ok and reading is None:
        reason = (f"no {target.health_path} endpoint at {where}, and neither /v1/models nor "
                  f"{target.metrics_path} answered")
        return sample("down", reason, model, reading, metrics_error)
    if reading is None and metrics_error is not None and NEEDS_MODEL in metrics_error:
        return await routed(health)  # /metrics wants a model: a router, whose models are read one by one
    if reading is None and (states := await swap_states(transport, target, headers, timeout)) is not None:
        return await swapped(states)  # /running answers: llama-swap, whose /metrics is not an engine's
    # no engine's metrics where /metrics should be: Ollama answers 404, LM Studio 200 with an error in JSON
    unknown = reading is not None and reading.dialect == "unknown"
    if unknown or (reading is None and metrics_error is not None and metrics_error != METRICS_OFF
                   and not metrics_error.startswith("unauthorized")):
        try:
            kind = await which_server(fetch)
        except ValueError:
            kind = None
        if kind is not None:
            return await native(kind, model)
        if metrics_error is not None and metrics_error.startswith(NO_METRICS) and await is_sglang(fetch):
            metrics_error = f"{metrics_error}: SGLang serves them with --enable-metrics"  # SGLang says so
    llama = metrics_error == METRICS_OFF
    slots = slots_read if slots_read is not None and llama else \
        await _slots(transport, target, headers, timeout, reading, idle_slots, llama=llama)
    return sample(health, health_note, model, reading, metrics_error, slots)


async def _gateway(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                   max_body: int) -> bool:
    """A server with no engine's metrics whose /v1/models answers a model list: a gateway, up whatever its
    /health does. An engine whose /health hangs is down, however its API server still answers."""
    try:
        status, body, _ = await fetch_path(transport, target, "/v1/models", headers, timeout, 1 << 20)
    except Failed:
        return False
    if status != 200 or _model_id(body) is None:
        return False
    reading, _ = await read_metrics(transport, target, headers, timeout, max_body)
    return reading is None or reading.dialect == "unknown"


async def poll_slots(transport: Transport, target: EngineTarget, timeout: float,
                     reading: EngineReading | None, llama: bool = False) -> SlotsReading | None:
    """A llama-server's /slots alone (an engine whose figures come from elsewhere: Prometheus; `llama`: one
    known to be a llama-server, whose /slots are being watched)."""
    try:
        headers = target_headers(target)
    except InsecureSecret as exc:
        return SlotsReading(error=str(exc))
    slots = await _slots(transport, target, headers, timeout, reading, llama=llama)
    if slots is not None and slots.error is not None:
        return SlotsReading(error=scrub(slots.error, target))
    return slots


async def _slots(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                 reading: EngineReading | None,
                 idle: tuple[EngineReading, SlotsReading] | None = None,
                 llama: bool = False) -> SlotsReading | None:
    """llama-server's slots, beside its /metrics (other engines have none), or in its stead (`llama`: a
    llama-server without --metrics)."""
    if not llama and (reading is None or reading.dialect != "llamacpp"):
        return None
    if idle is not None and idle[0] == reading:
        return idle[1]
    try:
        status, body, over = await fetch_path(transport, target, SLOTS_PATH, headers, timeout, 1 << 20)
    except Failed as exc:
        return SlotsReading(error=str(exc))
    if over:
        return SlotsReading(error=f"{SLOTS_PATH} body is larger than 1 MiB; not read")
    return parse_slots(status, body)
