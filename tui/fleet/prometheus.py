"""An async client for the Prometheus HTTP API (query, query_range, targets, readiness).

Queries are sent as a POST form, so a long fleet-wide expression never hits a URL-length limit. The app's
proxy policy (tui.net.policy) picks the way, as it does for the engine poller (tui.net.keepalive.Transports):
a Prometheus asked directly gets the poller's keep-alive pool (h11 over asyncio), a proxied one (or a test's
injected transport) an httpx transport; what is sent, the trust for https and everything after the answer
(status, body bytes) is the same either way. Why not httpx throughout: a refresh sends ~15 queries every
5 s, and httpx's per-request machinery (Request/Response objects, the client's auth and header merging,
httpcore's pool, anyio streams) was ~40 % of the fleet view's CPU (2.19 % of a core at 200 engines,
bench/bench_fleet.py). Each failure becomes a `PromError` whose message
says what to do: Prometheus down, not ready (503), a bad expression (400/422, Prometheus' own errorType and
error verbatim), a timeout, a 401/403 from a protected Prometheus. The bearer token is sent as a header and
never appears in a message (tui.net.policy.public_url strips URL credentials too).

Sample values arrive as strings; "NaN", "+Inf", "-Inf" (a 0/0 ratio, an empty histogram_quantile) read as
None, which is what "not available" is everywhere in enginetop.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from tui.net.keepalive import Transport, Transports, exchange
from tui.net.policy import auth_headers, check_secret_transport, public_url, split_credentials

Labels = dict[str, str]
POOL = 4
KEEPALIVE_S = 120.0  # longer than any refresh; Prometheus keeps an idle connection for 5 min
MAX_ANSWER_BYTES = 256 << 20  # an answer larger than this is refused, not held in memory
FORM = "application/x-www-form-urlencoded"


class PromError(Exception):
    """A Prometheus call failed; `kind` is one of: down, not_ready, bad_query, timeout, auth, http, format."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def value(text: Any) -> float | None:
    """A Prometheus sample value (a string) as a float, None for NaN / ±Inf / anything unreadable."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


@dataclass(frozen=True, slots=True)
class Target:
    job: str
    instance: str
    health: str  # "up" | "down" | "unknown"
    last_error: str
    scrape_url: str
    scrape_interval_s: float | None
    labels: Labels = field(default_factory=dict)


def _duration_s(text: str | None) -> float | None:
    """'15s', '1m', '1m30s', '500ms' -> seconds."""
    if not text:
        return None
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    total, num = 0.0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            num += ch
            i += 1
            continue
        unit = text[i:i + 2] if text[i:i + 2] == "ms" else ch
        if unit not in units or not num:
            return None
        total += float(num) * units[unit]
        num = ""
        i += len(unit)
    return total if not num else None


class PrometheusClient:
    """One Prometheus (or VictoriaMetrics / Thanos / Mimir: the same API). `token` is a bearer token."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        url, basic = split_credentials(url.rstrip("/"))
        self.url = url
        self.shown = public_url(url)
        self.timeout = timeout
        check_secret_transport(url, bool(token or basic))
        # the bearer token, else the URL's user:password as Basic: a header, never in a message
        self._headers = {"Accept": "application/json", "Accept-Encoding": "gzip, deflate",
                         **auth_headers(token, basic)}
        # A refresh sends its ~15 queries at once, every few seconds. A few connections, kept between
        # refreshes: httpx dropped an idle one after 5 s by default (so each refresh connected anew), and
        # its pool scans every connection for every request event (15 connections cost more CPU than the
        # queries' wait on 4; bench/bench_fleet.py). So: at most POOL requests at a time (the semaphore),
        # each on a connection of its own, and POOL of them kept idle between refreshes.
        self._slots = asyncio.Semaphore(POOL)
        self._transports: Transports | None = None
        self._via: Transport
        if transport is not None:
            self._via = transport
        else:
            limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL,
                                  keepalive_expiry=KEEPALIVE_S)
            self._transports = Transports(max_idle_per_origin=POOL, limits=limits)
            self._via = self._transports.for_url(url)
        self.calls = 0  # API calls made: the bench shows it does not grow with the number of engines
        # Prometheus' (or Thanos') warnings on the last answers, e.g. a partial response: shown, not fatal
        self.warnings: list[str] = []

    async def aclose(self) -> None:
        if self._transports is not None:
            await self._transports.aclose()
        elif isinstance(self._via, httpx.AsyncBaseTransport):
            await self._via.aclose()

    # ---- the API --------------------------------------------------------------------------------------
    async def query(self, expr: str, at: float | None = None) -> list[tuple[Labels, float | None]]:
        form = {"query": expr, "timeout": f"{self.timeout:g}s"}
        if at is not None:
            form["time"] = f"{at:.3f}"
        data = await self._api("/api/v1/query", form)
        kind = data.get("resultType")
        result = data.get("result")
        if kind == "scalar" and isinstance(result, list):
            return [({}, value(result[1]))]
        if kind != "vector" or not isinstance(result, list):
            raise PromError("format", f"{self.shown}: expected an instant vector for {expr!r}, got {kind}")
        return [(item.get("metric", {}), value(item.get("value", (0, None))[1])) for item in result]

    async def query_range(self, expr: str, start: float, end: float, step: float
                          ) -> list[tuple[Labels, list[tuple[float, float | None]]]]:
        form = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}",
                "timeout": f"{self.timeout:g}s"}
        data = await self._api("/api/v1/query_range", form)
        if data.get("resultType") != "matrix":
            raise PromError("format", f"{self.shown}: expected a range matrix for {expr!r}")
        return [(item.get("metric", {}), [(float(t), value(v)) for t, v in item.get("values", ())])
                for item in data.get("result", ())]

    async def targets(self) -> list[Target]:
        data = await self._api("/api/v1/targets", {"state": "active"}, method="GET")
        out = []
        for t in data.get("activeTargets", ()):
            labels = t.get("labels", {})
            out.append(Target(job=labels.get("job", ""), instance=labels.get("instance", ""),
                              health=t.get("health", "unknown"), last_error=t.get("lastError", ""),
                              scrape_url=public_url(t.get("scrapeUrl", "")),
                              scrape_interval_s=_duration_s(t.get("scrapeInterval")), labels=labels))
        return out

    async def ready(self) -> None:
        """Raise PromError unless /-/ready answers 200."""
        try:
            status, _ = await self._send("GET", "/-/ready", None)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._transport_error(exc) from None
        if status == 503:
            raise PromError("not_ready", f"Prometheus at {self.shown} is not ready yet (503 on /-/ready: "
                                         "still starting or replaying its write-ahead log)")
        self._status_error(status)

    # ---- plumbing ---------------------------------------------------------------------------------------
    async def _api(self, path: str, params: dict[str, str], method: str = "POST") -> dict[str, Any]:
        self.calls += 1
        started = time.monotonic()
        try:
            status, raw = await self._send(method, path, params)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._transport_error(exc, time.monotonic() - started) from None
        if raw is None:
            raise PromError("format", f"{self.shown}{path} answered more than {MAX_ANSWER_BYTES >> 20} MiB: "
                                      "narrow the engines asked for (--match)")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if isinstance(body, dict) and body.get("status") == "error":
            etype, error = body.get("errorType", "?"), body.get("error", "")
            kind = {"bad_data": "bad_query", "execution": "bad_query", "timeout": "timeout",
                    "unavailable": "not_ready"}.get(etype, "http")
            raise PromError(kind, f"Prometheus at {self.shown} answered {status}: {etype}: {error}")
        self._status_error(status)
        if isinstance(body, dict) and body.get("warnings"):
            self.warnings = [str(w) for w in body["warnings"]][:5]
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise PromError("format", f"{self.shown}{path} did not answer with the Prometheus API envelope "
                                      f"(HTTP {status}): is this URL a Prometheus?")
        return body["data"]

    async def _send(self, method: str, path: str, params: dict[str, str] | None) -> tuple[int, bytes | None]:
        """(status, body; None when over MAX_ANSWER_BYTES). A POST carries `params` as its form, a GET in
        its URL. At most POOL at a time; waiting for a turn and the exchange are each bounded by the
        timeout (httpx's pool and read timeouts were). Raises httpx's exceptions or TimeoutError."""
        url = self.url + path
        body = b""
        headers = self._headers
        if params:
            form = urlencode(params)
            if method == "GET":
                url += "?" + form
            else:
                body = form.encode()
                headers = {**headers, "Content-Type": FORM}
        async with asyncio.timeout(self.timeout):
            await self._slots.acquire()
        try:
            async with asyncio.timeout(self.timeout):
                status, data, over = await exchange(self._via, method, url, headers, MAX_ANSWER_BYTES,
                                                    self.timeout, body)
        finally:
            self._slots.release()
        return status, None if over else data

    def _status_error(self, status: int) -> None:
        if status in (401, 403):
            has = "Authorization" in self._headers
            hint = "the token was refused" if has else "it needs a token: --prometheus-key-file PATH"
            raise PromError("auth", f"Prometheus at {self.shown} answered {status}: {hint}")
        if status == 503:
            raise PromError("not_ready", f"Prometheus at {self.shown} answered 503 (not ready, or busy)")
        if status >= 400:
            raise PromError("http", f"Prometheus at {self.shown} answered HTTP {status}")

    def _transport_error(self, exc: httpx.HTTPError | TimeoutError, took: float | None = None) -> PromError:
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            return PromError("timeout", f"Prometheus at {self.shown} did not answer within {self.timeout:g}s")
        if isinstance(exc, httpx.ConnectError):
            return PromError("down", f"Prometheus at {self.shown} refused the connection: is it running?")
        return PromError("down", f"Prometheus at {self.shown}: {type(exc).__name__}")
