"""/metrics of one engine polled: its reading, or why there is none in words to act on (`METRICS_OFF`: a
llama-server without --metrics; `NO_METRICS`: a server that publishes none); a vLLM asked for the series
read here alone (`NameFilter`); SGLang known by its own route when it serves none (`is_sglang`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tui.model.samples import EngineReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transport
from tui.net.policy import error_text
from tui.sources.engine_http import Failed, auth_message, fetch_path
from tui.sources.metrics import MetricsFormatError, names_query, parse_reading

# llama-server's answer to /metrics without --metrics (its default): its /slots are read instead
METRICS_OFF = "metrics disabled: start llama-server with --metrics"
NO_METRICS = "this server publishes no Prometheus metrics"  # /metrics answered 404


async def is_sglang(fetch: Callable[[str], Awaitable[tuple[int, bytes, bool]]]) -> bool:
    """SGLang, by its own route (/get_model_info: {"model_path": ..., "is_generation": ...})."""
    try:
        status, body, _ = await fetch("/get_model_info")
        info = json.loads(body) if status == 200 else None
    except ValueError:
        return False
    return isinstance(info, dict) and "model_path" in info and "is_generation" in info


def _metrics_status_message(status: int, body: bytes, has_key: bool, path: str) -> str:
    if status in (401, 403):
        return auth_message(has_key)
    if status == 404:
        # which server it is decides the hint (poll_engine): none here is written for another engine
        return f"{NO_METRICS} at {path}: its figures come from enginetop's proxy (--proxy-listen) and probes"
    # llama-server's own words: "This server does not support metrics endpoint. Start it with `--metrics`"
    if status == 501 and (b"--metrics" in body or b"does not support metrics" in body):
        return METRICS_OFF
    detail = error_text(body)
    return f"{path} answered HTTP {status}" + (f": {detail}" if detail else "")


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


async def read_metrics(transport: Transport, target: EngineTarget, headers: dict[str, str],
                       timeout: float, max_body: int,
                       only: NameFilter | None = None) -> tuple[EngineReading | None, str | None]:
    """The reading, or why there is none."""
    if only is not None and not only.refused:
        try:
            path = target.metrics_path.rstrip("/") + "/"
            status, body, over = await fetch_path(transport, target, path, headers, timeout, max_body,
                                                  "?" + names_query("vllm"))
        except Failed as exc:
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
        status, body, over = await fetch_path(transport, target, target.metrics_path, headers, timeout,
                                              max_body)
    except Failed as exc:
        return None, str(exc)
    if over:
        return None, f"{target.metrics_path} body is larger than the {max_body / 2**20:g} MiB limit; not read"
    if status != 200:
        return None, _metrics_status_message(status, body, bool(target.api_key), target.metrics_path)
    try:
        return parse_reading(body.decode("utf-8", "replace")), None
    except MetricsFormatError as exc:
        return None, str(exc)

