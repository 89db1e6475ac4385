"""Poll one engine: /health, /v1/models, /metrics. Never raises: each failure becomes words to act on.

The transport is passed in so the app keeps one connection per engine (tui.net.keepalive). The API key
is sent as `Authorization: Bearer` (vLLM, llama.cpp and SGLang all accept it) and is scrubbed from every
message this module produces.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

from tui.model.config import EngineConfig
from tui.model.samples import EngineReading, EngineSample, Health, RoutedModel, RouterKind
from tui.model.slots import SlotsReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import StreamLines, Transport, exchange
from tui.net.policy import InsecureSecret, error_text, public_url, target_headers
from tui.sources import swap as swap_source
from tui.sources.config import read_config
from tui.sources.metrics import MetricsFormatError, names_query, parse_reading
from tui.sources.native_servers import NAMES, Native, read_models, summary, which_server
from tui.sources.router import NEEDS_MODEL, plural, read_router
from tui.sources.slots import SLOTS_PATH, parse_slots

# One line per request, off unless --log-http (tui.cli.dashboard.log_to_file): four engines a second say
# nothing.
http_log = logging.getLogger("tui.http")

# The poller's own keep-alive pool, or an httpx transport (a proxied engine; tests that pass their own)
_ERROR_BODY_BYTES = 4096  # enough of an error response to quote its message


class _Failed(Exception):
    """One request failed; the message is final, user-facing text."""

    def __init__(self, message: str, refused: bool = False, late: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.late = late  # no answer in time (the server is there: it accepted the connection)


@functools.lru_cache(maxsize=64)  # asked on every poll of the same few URLs
def _where(url: str) -> str:
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return url
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return f"{u.host}:{port}" if port else u.host or url


# What a poll says when nothing listened on the engine's port: its process is gone (or not there yet), so the
# next answer is from a new run of the server (tui.sources.engine_source starts /slots' counters again)
REFUSED = "connection refused at"
NOT_YET = "not accepting connections yet at"


def nothing_listened(sample: EngineSample) -> bool:
    reason = sample.health_reason or ""
    return sample.health != "up" and reason.startswith((REFUSED, NOT_YET))


def _transport_failure(exc: Exception, where: str, timeout: float, path: str) -> _Failed:
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return _Failed(f"no answer within {timeout:g}s from {where}{path}", late=True)
    text = str(exc)
    low = text.lower()
    if isinstance(exc, httpx.ConnectError):
        if "refused" in low or "connect call failed" in low or "all connection attempts failed" in low:
            return _Failed(f"{REFUSED} {where} — is the engine running?", refused=True)
        if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low:
            return _Failed(f"cannot resolve the host of {where}: check the engine URL")
        return _Failed(f"cannot connect to {where}: {text or type(exc).__name__}")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return _Failed(f"invalid engine URL {where!r}: {text}")
    if isinstance(exc, httpx.RemoteProtocolError):
        return _Failed(f"{where}{path} closed the connection or sent a malformed response: {text}")
    return _Failed(f"{where}{path} failed: {type(exc).__name__}: {text}")


async def _get(transport: Transport, url: str, headers: dict[str, str], timeout: float,
               limit: int) -> tuple[int, bytes, bool]:
    """GET with a total deadline and a body cap: (status, body, over_cap). The body of a non-200 answer is
    read only far enough to quote it."""
    async with asyncio.timeout(timeout):
        status, body, over = await exchange(transport, "GET", url, headers, limit, timeout,
                                            error_cap=_ERROR_BODY_BYTES)
    if http_log.isEnabledFor(logging.INFO):  # off by default, and this runs every poll
        http_log.info("GET %s: HTTP %d", public_url(url), status)
    return status, body, over


async def _fetch(transport: Transport, target: EngineTarget, path: str, headers: dict[str, str],
                 timeout: float, limit: int, query: str = "") -> tuple[int, bytes, bool]:
    """GET `path` + `query`; a failure's message names the path alone."""
    try:
        return await _get(transport, target.base + path + query, headers, timeout, limit)
    except (httpx.HTTPError, httpx.InvalidURL, TimeoutError, OSError, ValueError) as exc:
        raise _transport_failure(exc, _where(target.url), timeout, path) from None


# llama-server's answer to /metrics without --metrics (its default): its /slots are read instead
METRICS_OFF = "metrics disabled: start llama-server with --metrics"
NO_METRICS = "this server publishes no Prometheus metrics"  # /metrics answered 404


async def _sglang(fetch: Callable[[str], Awaitable[tuple[int, bytes, bool]]]) -> bool:
    """SGLang, by its own route (/get_model_info: {"model_path": ..., "is_generation": ...})."""
    try:
        status, body, _ = await fetch("/get_model_info")
        info = json.loads(body) if status == 200 else None
    except ValueError:
        return False
    return isinstance(info, dict) and "model_path" in info and "is_generation" in info


def _metrics_status_message(status: int, body: bytes, has_key: bool, path: str) -> str:
    if status in (401, 403):
        return _auth_message(has_key)
    if status == 404:
        # which server it is decides the hint (poll_engine): none here is written for another engine
        return f"{NO_METRICS} at {path}: its figures come from enginetop's proxy (--proxy-listen) and probes"
    # llama-server's own words: "This server does not support metrics endpoint. Start it with `--metrics`"
    if status == 501 and (b"--metrics" in body or b"does not support metrics" in body):
        return METRICS_OFF
    detail = error_text(body)
    return f"{path} answered HTTP {status}" + (f": {detail}" if detail else "")


def _auth_message(has_key: bool) -> str:
    if has_key:
        return "unauthorized: the engine refused this API key; check the key set for this engine"
    return ("unauthorized: it answers, and needs an API key: give it with --api-key-file NAME=PATH or "
            "--api-key-env NAME=VAR")


def _model_id(body: bytes) -> str | None:
    try:
        data = json.loads(body)
        model = data["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return model if isinstance(model, str) else None


@dataclass
class NameFilter:
    """Ask a vLLM for only the series read here. vLLM serves its registry twice: `/metrics` through an
    instrumentator that sends all of it (600 to 3,000 lines, nearly all of which this poller would only
    skip), and `/metrics/` through prometheus_client's own exposition, which honours `name[]=` and sends
    ~80. One per watched engine, made once a poll has found a vLLM; `refused` once the filtered path did
    not give a vLLM reading where the engine answered (another server, a path of the user's; not for an
    answer any path would get: 401/403, 5xx), and then only the plain path is asked. SGLang is not asked
    so: a declared family without a series yet means zero there (tui.sources.metrics), and the filter
    drops such a family whole."""

    refused: bool = False


async def _metrics(transport: Transport, target: EngineTarget, headers: dict[str, str],
                   timeout: float, max_body: int,
                   only: NameFilter | None = None) -> tuple[EngineReading | None, str | None]:
    """The reading, or why there is none."""
    if only is not None and not only.refused:
        try:
            path = target.metrics_path.rstrip("/") + "/"
            status, body, over = await _fetch(transport, target, path, headers, timeout, max_body,
                                              "?" + names_query("vllm"))
        except _Failed as exc:
            return None, str(exc)  # the engine, not the path: the plain path would fail alike
        if status == 200 and not over:
            try:
                reading = parse_reading(body.decode("utf-8", "replace"))
            except MetricsFormatError:
                reading = None
            if reading is not None and reading.dialect == "vllm":
                return reading, None
        if status not in (401, 403) and status < 500:  # a key or an overload is the engine's, on any path
            only.refused = True
    try:
        status, body, over = await _fetch(transport, target, target.metrics_path, headers, timeout, max_body)
    except _Failed as exc:
        return None, str(exc)
    if over:
        return None, f"{target.metrics_path} body is larger than the {max_body / 2**20:g} MiB limit; not read"
    if status != 200:
        return None, _metrics_status_message(status, body, bool(target.api_key), target.metrics_path)
    try:
        return parse_reading(body.decode("utf-8", "replace")), None
    except MetricsFormatError as exc:
        return None, str(exc)


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
    where = _where(target.url)

    def sample(health: Health, reason: str | None = None, model: str | None = None,
               reading: EngineReading | None = None, metrics_error: str | None = None,
               slots: SlotsReading | None = None, models: tuple[RoutedModel, ...] | None = None,
               router: RouterKind | None = None) -> EngineSample:
        if slots is not None and slots.error is not None:
            slots = SlotsReading(error=_scrub(slots.error, target))
        return EngineSample(
            name=target.name, url=target.url, t=time.monotonic(), wall=time.time(), health=health,
            health_reason=_scrub(reason, target), model=model, reading=reading,
            metrics_error=_scrub(metrics_error, target), slots=slots, models=models, router=router,
        )

    async def routed(health: Health) -> EngineSample:
        """A llama-server in router mode: its models, and the figures of the loaded ones."""
        models = await _router(transport, target, headers, timeout)
        if isinstance(models, str):
            return sample(health, None, None, None, f"router mode: {models}")
        loaded = sum(m.status == "loaded" for m in models)
        return sample(health, None, f"router: {len(models)} model{plural(len(models))}, {loaded} loaded",
                      models=models, router="llama-server")

    async def swapped(states: dict[str, str] | None = None) -> EngineSample:
        """llama-swap: its models and their states, requests in flight, and the figures of the ready ones."""
        read = await _swap(transport, target, headers, timeout, states)
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

    async def fetch(path: str) -> tuple[int, bytes, bool]:
        try:
            return await _fetch(transport, target, path, headers, timeout, 8 * 2**20)
        except _Failed as exc:
            raise ValueError(str(exc)) from None

    if router is not None and known_model is not None and not check_health:
        if router in ("ollama", "lm-studio"):
            native_sample = await native(router, known_model)
            if native_sample.models is not None:
                return native_sample  # else asked afresh below: gone, or another server now
        routed_sample = await (swapped() if router == "llama-swap" else routed("up"))
        if routed_sample.models is not None:
            return routed_sample
    if not check_health and known_model is not None:
        reading, metrics_error = await _metrics(transport, target, headers, timeout, max_body, only)
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
        status, body, _ = await _fetch(transport, target, target.health_path, headers, timeout,
                                      _ERROR_BODY_BYTES)
    except _Failed as exc:
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
        return sample("down", _auth_message(bool(target.api_key)))
    if status != 200 and not no_health_route:
        detail = error_text(body)
        reason = f"{where}{target.health_path} answered HTTP {status}" + (f": {detail}" if detail else "")
        return sample("down", reason)

    model = known_model
    models_ok = known_model is not None
    if known_model is None:
        try:
            status, body, _ = await _fetch(transport, target, "/v1/models", headers, timeout, 1 << 20)
            if status == 200:
                models_ok = True
                model = _model_id(body)
        except _Failed:
            pass  # the model name is a nicety; /metrics below reports reachability problems in full

    reading, metrics_error = await _metrics(transport, target, headers, timeout, max_body, only)
    if no_health_route and not models_ok and reading is None:
        reason = (f"no {target.health_path} endpoint at {where}, and neither /v1/models nor "
                  f"{target.metrics_path} answered")
        return sample("down", reason, model, reading, metrics_error)
    if reading is None and metrics_error is not None and NEEDS_MODEL in metrics_error:
        return await routed(health)  # /metrics wants a model: a router, whose models are read one by one
    if reading is None and (states := await _swap_states(transport, target, headers, timeout)) is not None:
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
        if metrics_error is not None and metrics_error.startswith(NO_METRICS) and await _sglang(fetch):
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
        status, body, _ = await _fetch(transport, target, "/v1/models", headers, timeout, 1 << 20)
    except _Failed:
        return False
    if status != 200 or _model_id(body) is None:
        return False
    reading, _ = await _metrics(transport, target, headers, timeout, max_body)
    return reading is None or reading.dialect == "unknown"


async def _router(transport: Transport, target: EngineTarget, headers: dict[str, str],
                  timeout: float) -> tuple[RoutedModel, ...] | str:
    """The router's models (tui.sources.router), or why they could not be read."""
    async def fetch(path: str) -> tuple[int, bytes, bool]:
        try:
            return await _fetch(transport, target, path, headers, timeout, 8 * 2**20)
        except _Failed as exc:
            raise ValueError(str(exc)) from None

    try:
        return await read_router(fetch, target.metrics_path)
    except (ValueError, TypeError) as exc:
        return str(exc)


async def _swap_states(transport: Transport, target: EngineTarget, headers: dict[str, str],
                       timeout: float) -> dict[str, str] | None:
    try:
        status, body, _ = await _fetch(transport, target, swap_source.RUNNING_PATH, headers, timeout, 1 << 20)
    except _Failed:
        return None
    return swap_source.running_states(status, body)


async def _swap(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                states: dict[str, str] | None) -> tuple[tuple[RoutedModel, ...], str] | str:
    """llama-swap's models (tui.sources.swap), or why they could not be read."""
    async def fetch(path: str) -> tuple[int, bytes, bool]:
        try:
            return await _fetch(transport, target, path, headers, timeout, 8 * 2**20)
        except _Failed as exc:
            raise ValueError(str(exc)) from None

    async def events() -> list[dict[str, Any]] | str:
        return await _inflight(transport, target, headers, timeout)

    try:
        if states is None:
            states = swap_source.running_states(*(await fetch(swap_source.RUNNING_PATH))[:2])
            if states is None:
                return f"{swap_source.RUNNING_PATH} is not llama-swap's answer any more"
        return await swap_source.read_swap(fetch, events, target.metrics_path, states)
    except (ValueError, TypeError) as exc:
        return str(exc)


async def _inflight(transport: Transport, target: EngineTarget, headers: dict[str, str], timeout: float,
                    cap: int = 4 * 2**20) -> list[dict[str, Any]] | str:
    """The first in-flight snapshot of llama-swap's event stream, which it sends on connect after its log
    history (hence the cap); the stream is dropped as soon as it came."""
    events = swap_source.EVENTS_PATH
    lines = StreamLines()
    found: list[list[dict[str, Any]]] = []

    def until(piece: bytes) -> bool:
        snapshots = (swap_source.inflight_snapshot(line) for line in lines.feed(piece))
        found.extend(r for r in snapshots if r is not None)
        return bool(found)

    try:
        async with asyncio.timeout(timeout):
            status, _, over = await exchange(transport, "GET", target.base + events, headers, cap, timeout,
                                             error_cap=_ERROR_BODY_BYTES, until=until)
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        return f"{events}: {type(exc).__name__}"
    if status != 200:
        return f"{events} answered HTTP {status}"
    if found:
        return found[0]
    return f"no in-flight snapshot in the first {cap // 2**20} MiB of {events}" if over else \
        f"{events} ended without an in-flight snapshot"


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
        return SlotsReading(error=_scrub(slots.error, target))
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
        status, body, over = await _fetch(transport, target, SLOTS_PATH, headers, timeout, 1 << 20)
    except _Failed as exc:
        return SlotsReading(error=str(exc))
    if over:
        return SlotsReading(error=f"{SLOTS_PATH} body is larger than 1 MiB; not read")
    return parse_slots(status, body)


def _secrets(target: EngineTarget) -> list[str]:
    secrets = [target.api_key] if target.api_key else []
    if target.basic_auth is not None and target.basic_auth[1]:
        secrets.append(target.basic_auth[1])
    return secrets


def _scrub(message: str | None, target: EngineTarget) -> str | None:
    """Error text may quote what the server or the HTTP library saw: never a secret."""
    if message is None:
        return message
    for secret in _secrets(target):
        message = message.replace(secret, "***")
    return message


async def poll_config(transport: Transport, target: EngineTarget, dialect: str, *,
                      slots: SlotsReading | None = None, pid: int | None = None, remote: bool = False,
                      timeout: float = 2.0, no_pid: str | None = None) -> EngineConfig | None:
    """The engine's effective configuration (tui.sources.config), read with the poller's own transport and
    key; every message scrubbed of secrets. `no_pid`: why no process of this machine is the engine's (the
    port's holder is a tunnel or a forwarder: tui.sources.port_holder)."""
    try:
        headers = target_headers(target)
    except InsecureSecret:
        return None

    async def fetch(path: str) -> tuple[int, bytes]:
        try:
            status, body, over = await _fetch(transport, target, path, headers, timeout, 8 * 2**20)
        except _Failed as exc:
            raise ValueError(_scrub(str(exc), target)) from None
        if over:
            raise ValueError("the answer is larger than 8 MiB; not read")
        return status, body

    async def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """A POST that only reads (Ollama's /api/show), within the poll's timeout."""
        try:
            async with asyncio.timeout(timeout):
                status, data, over = await exchange(transport, "POST", target.base + path,
                                                    {**headers, "Content-Type": "application/json"},
                                                    8 * 2**20, timeout, json.dumps(body).encode(),
                                                    error_cap=_ERROR_BODY_BYTES)
        except (httpx.HTTPError, TimeoutError, OSError, ValueError) as exc:
            raise ValueError(_scrub(str(_transport_failure(exc, _where(target.url), timeout, path)),
                                    target)) from None
        if over:
            raise ValueError("the answer is larger than 8 MiB; not read")
        return status, data

    config = await read_config(fetch, dialect, slots=slots, pid=pid, remote=remote, secrets=_secrets(target),
                               no_pid=no_pid, post=post)
    if config is None or not config.lacks:
        return config
    return replace(config, lacks=tuple(_scrub(x, target) or "" for x in config.lacks))
