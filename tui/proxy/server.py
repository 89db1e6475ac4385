"""The traffic proxy: one listen address per engine, every path and method forwarded unchanged (the OpenAI
API, /metrics, /health, /slots), streams relayed event by event, and every generation request measured
(tui.proxy.stream), counted (tui.proxy.book, tui.proxy.metrics) and traced (tui.proxy.trace).

Built on aiohttp's server and client. The server runs with handler cancellation on, so a client that goes
away cancels its handler at once, and leaving the upstream request's context closes the engine's
connection, which is how llama-server and vLLM learn to stop generating. There is a connect timeout but no
total timeout: a long generation is not cut.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST
from yarl import URL

from tui.base.defaults import CONNECT_TIMEOUT_S, MAX_BODY_BYTES, METRICS_PATH, TRAFFIC_PATH
from tui.base.stats import quantile
from tui.engines.tokens import EngineTokens
from tui.findings.facts import refused_for_length, refused_tokens
from tui.model.slo import Slo
from tui.model.traffic import Outcome, RequestRecord, TrafficSample
from tui.net.listen import Listen, ListenError, bind_message
from tui.proxy.book import TrafficBook
from tui.proxy.headroom import load_capacities
from tui.proxy.metrics import ProxyMetrics
from tui.proxy.prompts import PromptTokens
from tui.proxy.runs import CHECK_S, RunWatch
from tui.proxy.stream import StreamReading, StreamRelay
from tui.proxy.trace import SESSION_HEADERS, TraceItem, TraceWriter
from tui.proxy.upstream import SpareConnector
from tui.sources.metrics import parse_reading

log = logging.getLogger(__name__)

GENERATION_SUFFIXES = ("/chat/completions", "/completions", "/completion", "/api/chat", "/api/generate")
OLLAMA_SUFFIXES = ("/api/chat", "/api/generate")  # Ollama's native API: it streams unless told not to
OPENAI_SUFFIXES = ("/chat/completions", "/completions")  # where stream_options exists
# RFC 9110 7.6.1: meant for one connection, never forwarded. Host and Content-Length are set anew.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
# aiohttp's client adds these when absent; the engine should get only what the client sent
_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")


@dataclass(frozen=True)
class Route:
    engine: str
    upstream: str  # the engine's base URL, no trailing slash
    listen: Listen

    @property
    def proxy_url(self) -> str:
        return f"http://{self.listen.display}"


def forwarded_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    drop = HOP_BY_HOP.union(v.strip().lower() for h in headers.getall("Connection", ()) for v in h.split(","))
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def openai_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def is_generation(method: str, path: str) -> bool:
    return method == "POST" and path.rstrip("/").endswith(GENERATION_SUFFIXES)


@dataclass
class _Exchange:
    """One measured request while it is relayed."""

    route: Route
    path: str
    stream: bool
    request: dict[str, Any]
    reading: StreamReading
    started_wall: float
    status: int | None = None
    error: str | None = None
    outcome: Outcome = "ok"
    injected: bool = False  # the proxy asked for usage itself (StreamRelay takes it back)


class TrafficProxy:
    def __init__(self, routes: Iterable[Route], *, max_body_bytes: int = MAX_BODY_BYTES,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, trace: TraceWriter | None = None) -> None:
        self.routes = list(routes)
        self.max_body_bytes = max_body_bytes
        self.connect_timeout_s = connect_timeout_s
        self.trace = trace
        self.books = {r.engine: TrafficBook(r.engine) for r in self.routes}
        self.metrics = ProxyMetrics()
        self.listeners: list[Callable[[RequestRecord], None]] = []  # told of every request that ended
        # Engines whose streams end with llama.cpp's `timings` (prompt_n, cache_n, predicted_n): their own
        # counts are there, so the proxy stops asking them for usage (it costs the client ~1 ms of TTFT).
        self._counts_itself: set[str] = set()
        self._runners: list[web.AppRunner] = []
        self._session: aiohttp.ClientSession | None = None
        self._upstream: SpareConnector | None = None
        self._capacity_file: Path | None = None
        self._capacity_mtime: float | None = None
        self._tokens_http: httpx.AsyncClient | None = None  # the tokenize calls, off the request path
        self.prompts: PromptTokens | None = None  # each prompt's tokens: its shared prefix, its trace line
        # Each engine's runs (tui.proxy.runs): a restart makes what the books kept for the findings stale
        self.runs = {r.engine: RunWatch() for r in self.routes}
        self._auth: dict[str, str] = {}  # engine -> the last client's Authorization, to read its /metrics
        self._watching: asyncio.Task[None] | None = None
        self._checking: dict[str, asyncio.Task[None]] = {}  # engine -> its first check of a run, under way

    # --- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen on every route's address; a port that cannot be bound raises ListenError and nothing stays
        open."""
        self._upstream = SpareConnector()
        self._session = aiohttp.ClientSession(
            connector=self._upstream,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s,
                                          sock_connect=self.connect_timeout_s),
            # no cookie jar: one client's cookies must never ride on another client's request
            auto_decompress=False, skip_auto_headers=_AUTO_HEADERS, cookie_jar=aiohttp.DummyCookieJar())
        self._tokens_http = httpx.AsyncClient(timeout=30, trust_env=False)
        try:
            for route in self.routes:
                app = web.Application(client_max_size=self.max_body_bytes)
                app.router.add_route("*", "/{tail:.*}", self._handler(route))
                runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
                await runner.setup()
                self._runners.append(runner)
                try:
                    await web.TCPSite(runner, route.listen.host, route.listen.port).start()
                except OSError as exc:
                    flag = f"the proxy for {route.engine}"
                    raise ListenError(bind_message(route.listen, exc, flag)) from None
            self.prompts = PromptTokens(self.tokenize, self._shared, self.trace)
            self.prompts.start()
            self._watching = asyncio.create_task(self._watch_runs(), name="engine runs")
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.gather(self._watching, return_exceptions=True)
            self._watching = None
        for task in list(self._checking.values()):
            task.cancel()
        await asyncio.gather(*self._checking.values(), return_exceptions=True)
        self._checking.clear()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self.prompts is not None:
            await self.prompts.close()
            self.prompts = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._tokens_http is not None:
            await self._tokens_http.aclose()
            self._tokens_http = None

    # --- what the dashboard reads -------------------------------------------------------------------------
    def weigh(self, path: Path) -> None:
        """Judge each engine's traffic against the capacity measured for its URL in `path` (re-read whenever
        it changes: a capacity measured while the proxy runs counts from then on)."""
        self._capacity_file = path
        self._capacity_mtime = None
        self._reweigh()

    def _reweigh(self) -> None:
        if self._capacity_file is None:
            return
        try:
            mtime: float | None = self._capacity_file.stat().st_mtime
        except OSError:
            mtime = None
        if mtime == self._capacity_mtime:
            return
        self._capacity_mtime = mtime
        found = load_capacities(self._capacity_file)
        for route in self.routes:
            book = self.books[route.engine]
            measured = found.get(route.upstream.rstrip("/"))
            book.capacity_rps = measured.capacity_rps if measured else None
            book.slo = Slo.parse(measured.slo) if measured else None

    def samples(self) -> list[TrafficSample]:
        self._reweigh()
        t, wall = time.monotonic(), time.time()
        return [TrafficSample(r.engine, r.proxy_url, t, wall, self.books[r.engine].stats(t))
                for r in self.routes]

    # --- the relay ----------------------------------------------------------------------------------------
    def _handler(self, route: Route) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.path == METRICS_PATH:
                return web.Response(body=self.metrics.text(), headers={"Content-Type": CONTENT_TYPE_LATEST})
            if request.path == TRAFFIC_PATH:
                return web.Response(body=orjson.dumps([_sample_json(s) for s in self.samples()]),
                                    content_type="application/json")
            return await self._relay(route, request)
        return handle

    async def _relay(self, route: Route, request: web.Request) -> web.StreamResponse:
        started, started_wall = time.monotonic(), time.time()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, f"enginetop proxy: the request body is over {self.max_body_bytes} bytes "
                                     "(--max-body)", "request_too_large")
        headers = forwarded_headers(request.headers)
        exchange = None
        if is_generation(request.method, request.path):
            body, exchange = self._measured(route, request.path, body, started, started_wall)
        if exchange is None:
            return await self._forward(route, request, body, headers, None)
        if (auth := request.headers.get("Authorization")) is not None:
            self._auth[route.engine] = auth
        book = self.books[route.engine]
        in_flight = self.metrics.in_flight.labels(route.engine, str(exchange.request.get("model") or ""))
        in_flight.inc()
        try:
            with book.flight():
                return await self._forward(route, request, body, headers, exchange)
        finally:
            in_flight.dec()
            self._ended(exchange, request, started)

    def _measured(self, route: Route, path: str, body: bytes, started: float,
                  started_wall: float) -> tuple[bytes, _Exchange | None]:
        """The body to send (with include_usage when the proxy asks for it) and the exchange to measure."""
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body, None  # not JSON: the engine will say what is wrong; nothing to measure
        if not isinstance(req, dict):
            return body, None
        native = path.rstrip("/").endswith(OLLAMA_SUFFIXES)
        stream = req.get("stream") is not False if native else bool(req.get("stream"))
        injected = False
        options = req.get("stream_options")
        if stream and route.engine not in self._counts_itself and path.rstrip("/").endswith(OPENAI_SUFFIXES) \
                and not (isinstance(options, dict) and options.get("include_usage")):
            # token counts must be the engine's own: ask a stream for usage (unless the engine is known to end
            # its streams with its own counts), and take back what that changes (StreamRelay)
            sent = {**req, "stream_options": {**(options if isinstance(options, dict) else {}),
                                              "include_usage": True}}
            body, injected = orjson.dumps(sent), True
        return body, _Exchange(route, path, stream, req, StreamReading(started), started_wall,
                               injected=injected)

    async def _forward(self, route: Route, request: web.Request, body: bytes, headers: CIMultiDict[str],
                       exchange: _Exchange | None) -> web.StreamResponse:
        assert self._session is not None and self._upstream is not None
        # path and query exactly as the client sent them (encoded: not quoted again)
        url = URL(route.upstream + request.rel_url.raw_path_qs, encoded=True)
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(request.method, url, data=body or None, headers=headers,
                                             allow_redirects=False) as upstream:
                out_headers = forwarded_headers(upstream.headers)
                relay = None
                if exchange is not None:
                    exchange.status = upstream.status
                    encoded = "Content-Encoding" in upstream.headers
                    if upstream.content_type == "text/event-stream" and not encoded:
                        relay = StreamRelay(exchange.reading, exchange.injected)
                    elif upstream.content_type == "application/x-ndjson" and not encoded:
                        relay = StreamRelay(exchange.reading, False, ndjson=True)
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                              headers=out_headers)
                if relay is None and upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
                copy = bytearray() if exchange is not None and relay is None else None
                replenished = False
                async for data in upstream.content.iter_any():
                    arrived = time.monotonic()
                    if relay is not None and relay.injected:
                        # what arrived together leaves together: one write (a syscall) per read, not per event
                        if events := relay.feed(data, arrived):
                            await response.write(b"".join(events))
                    else:  # bytes the proxy does not change go out as they came, before it reads them
                        await response.write(data)
                        if relay is not None:
                            relay.feed(data, arrived)
                        elif copy is not None and len(copy) < self.max_body_bytes:
                            copy += data
                    if not replenished:  # the next request's connection, once this one's first bytes are out
                        self._upstream.replenish()
                        replenished = True
                if relay is not None and relay.injected and (events := relay.close()):
                    await response.write(b"".join(events))
                if copy is not None and exchange is not None and "Content-Encoding" not in upstream.headers:
                    exchange.reading.take_body(bytes(copy))
                await response.write_eof()
                if exchange is not None and exchange.reading.error and upstream.status == 200:
                    exchange.outcome, exchange.error = "error", exchange.reading.error
                elif exchange is not None and upstream.status >= 400:
                    exchange.outcome = "error"
                    exchange.error = f"the engine answered HTTP {upstream.status}"
                return response
        except asyncio.CancelledError:
            if exchange is not None:  # the client went away: its handler was cancelled
                exchange.outcome, exchange.error = "abandoned", "the client disconnected"
            raise
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            if exchange is not None:
                exchange.outcome, exchange.error = "abandoned", f"the client disconnected ({exc})"
            raise
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
                aiohttp.ServerTimeoutError, aiohttp.ClientPayloadError) as exc:
            why = f"engine {route.engine!r} at {route.upstream}: {_connect_words(exc)}"
            if isinstance(exc, aiohttp.ClientConnectorError) and self.runs[route.engine].unreachable():
                self.new_run(route.engine)  # the engine is down: its run is over
            if exchange is not None:
                exchange.outcome, exchange.error = "error", why
            if response is not None and response.prepared:
                raise  # headers already sent: the client sees the stream cut, as it would without the proxy
            return openai_error(502, f"enginetop proxy: {why}", "upstream_unavailable")

    def _ended(self, exchange: _Exchange, request: web.Request, started: float) -> None:
        now = time.monotonic()
        reading = exchange.reading
        times = reading.token_times
        gaps = tuple(b - a for a, b in itertools.pairwise(times))
        ordered = sorted(gaps)
        usage = reading.usage or {}
        timings = reading.timings or {}
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None and isinstance(timings.get("cache_n"), int):
            cached = timings["cache_n"]
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if prompt is None and isinstance(timings.get("prompt_n"), int):  # llama.cpp: its own counts
            prompt = timings["prompt_n"] + (timings.get("cache_n") or 0)
        if completion is None and isinstance(timings.get("predicted_n"), int):
            completion = timings["predicted_n"]
        if exchange.stream and isinstance(timings.get("predicted_n"), int) and isinstance(
                timings.get("prompt_n"), int):
            self._counts_itself.add(exchange.route.engine)
        metrics = reading.metrics or {}
        model = exchange.request.get("model") or reading.model
        refused = refused_for_length(exchange.status, reading.error)
        record = RequestRecord(
            engine=exchange.route.engine, path=exchange.path, stream=exchange.stream,
            started_wall=exchange.started_wall, outcome=exchange.outcome, status=exchange.status,
            error=exchange.error, model=str(model) if model else None,
            ttft_s=times[0] - started if times and exchange.stream else None,
            e2e_s=now - started, itl_p50_s=quantile(ordered, 0.5), itl_p90_s=quantile(ordered, 0.9),
            itl_max_s=ordered[-1] if ordered else None, token_events=len(times),
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
            engine_prompt_ms=timings.get("prompt_ms"), engine_decode_ms=timings.get("predicted_ms"),
            engine_ttft_ms=metrics.get("time_to_first_token_ms"), refused_for_length=refused,
            refused_prompt_tokens=refused_tokens(reading.error, reading.error_prompt_tokens) if refused
            else None, finish_reason=reading.finish_reason, max_tokens=asked_tokens(exchange.request))
        session = delay = None
        reply = "".join(reading.text)
        if self.trace is not None and record.outcome == "ok":
            header = next((request.headers[h] for h in SESSION_HEADERS if h in request.headers), None)
            session, delay = self.trace.session(exchange.request, header, record.started_wall, reply,
                                                record.started_wall + (record.e2e_s or 0.0))
            record = replace(record, session_id=session)
        seq = self.books[record.engine].add(record, gaps, now)
        if self.books[record.engine].holds_evidence:
            self._baseline(exchange.route)
        if self.prompts is not None and record.outcome == "ok":
            keep = reply if self.trace is not None and self.trace.capture_content else ""
            self.prompts.submit(TraceItem(record, exchange.route.upstream, exchange.path, exchange.request,
                                          session, delay, auth=request.headers.get("Authorization"),
                                          reply=keep, seq=seq))
        self.metrics.observe(record, gaps)
        for listener in self.listeners:
            listener(record)

    # --- the engine's runs ----------------------------------------------------------------------------------
    def new_run(self, engine: str) -> None:
        """The engine restarted, or went down: the evidence kept of its last run goes."""
        book = self.books[engine]
        book.new_run()
        if self.prompts is not None:
            self.prompts.new_run(engine, book.total + 1)

    async def _watch_runs(self) -> None:
        """Every CHECK_S, each engine the proxy keeps evidence of (one it keeps none of is not asked)."""
        while True:
            await asyncio.sleep(CHECK_S)
            for route in self.routes:
                if self.books[route.engine].holds_evidence:
                    await self._check_quietly(route)

    def _baseline(self, route: Route) -> None:
        """The first evidence of a run: the engine's counters now, which a restart will go back from."""
        watch = self.runs[route.engine]
        if watch.last is None and not watch.gave_up and route.engine not in self._checking:
            self._checking[route.engine] = asyncio.create_task(self._check_quietly(route))

    async def _check_quietly(self, route: Route) -> None:
        try:
            await self.check_run(route)
        except Exception:  # a bug here must not stop the relay or the next check
            log.exception("reading %s's /metrics for a restart failed", route.engine)
        finally:
            if self._checking.get(route.engine) is asyncio.current_task():
                del self._checking[route.engine]

    async def check_run(self, route: Route) -> None:
        """Read the engine's /metrics: a counter gone back is a restart the proxy saw no request fail for."""
        watch = self.runs[route.engine]
        if self._tokens_http is None or watch.gave_up:
            return
        auth = self._auth.get(route.engine)
        try:
            reply = await self._tokens_http.get(route.upstream + "/metrics", timeout=5.0,
                                                headers={"Authorization": auth} if auth else None)
        except httpx.ConnectError:
            if watch.unreachable():
                self.new_run(route.engine)
            return
        except httpx.HTTPError:
            return  # slow or cut: nothing learnt either way
        try:
            reading = parse_reading(reply.text) if reply.status_code == 200 else None
        except ValueError:
            reading = None
        if reading is None or reading.dialect == "unknown":
            watch.not_metrics()
        elif watch.reading(reading):
            self.new_run(route.engine)

    def _shared(self, engine: str, seq: int, shared: int | None) -> None:
        """A prompt's tokens compared with the earlier ones (tui.proxy.prompts): its book learns its share."""
        self.books[engine].shared(seq, shared)

    # --- the engine's tokenizer, for prefixes and the trace ----------------------------------------------
    async def tokenize(self, item: TraceItem) -> list[int] | None:
        """The prompt's tokens as the engine makes them, chat template applied (tui.engines.tokens), with the
        client's own key. None when the engine does not say."""
        assert self._tokens_http is not None
        req = item.request
        model = req.get("model")
        tokens = EngineTokens(self._tokens_http, item.upstream, model if isinstance(model, str) else None,
                              {"Authorization": item.auth} if item.auth else {})
        if isinstance(req.get("messages"), list):
            return await tokens.chat(req["messages"], req.get("tools"))
        if isinstance(req.get("prompt"), str):
            return await tokens.prompt(req["prompt"])
        return None


def _connect_words(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"not reachable ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "closed the connection without answering"
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return "did not accept the connection in time"
    return f"{type(exc).__name__}: {exc}"


def asked_tokens(request: dict[str, Any]) -> int | None:
    """The most tokens the client asked for: OpenAI's max_completion_tokens or max_tokens, llama.cpp's
    n_predict (-1: no cap)."""
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value if value >= 0 else None
    return None


def _sample_json(sample: TrafficSample) -> dict[str, Any]:
    return {"name": sample.name, "proxy_url": sample.proxy_url, "stats": asdict(sample.stats)}
