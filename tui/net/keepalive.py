"""Keep-alive HTTP/1.1 GETs for the poller on enginetop's one HTTP/1.1 client (tui.net.http1.Connection),
one idle connection kept per engine.

Why not the httpx transport the rest of enginetop uses: the dashboard asks every engine for /metrics every
second, and httpx's stack (Request and Response objects, httpcore's pool, anyio's streams and a timeout
object per read) cost about 1.6 ms of CPU a poll against 0.9 ms here with the same parse
(bench/bench_app.py, issue 9's CPU budget). Proxies still go through httpx (`Transports` below decides):
what is sent, the trust for https and the errors are the same either way, and failures are raised as the
httpx exceptions `tui.sources.engine_http` already turns into words.

The fleet view's Prometheus client sends its queries through the same pool, as POSTs with a form body
(tui.fleet.prometheus says why). Every request the pool sends is idempotent (a GET, a Prometheus query), so
one sent on an idle connection the server had just closed is sent again on a fresh one.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

import httpx

from tui.net.http1 import Connection, HttpFailure
from tui.net.policy import Origin, proxy_for, request_target, ssl_context

_DEFAULT_HEADERS = (("Accept", "*/*"), ("Accept-Encoding", "identity"))

Until = Callable[[bytes], bool]  # a piece of the body just received -> enough read


class StreamLines:
    """The whole lines of a stream read in pieces (an `until` reading an event stream): a line cut between
    two pieces is kept until its end comes."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, piece: bytes) -> list[bytes]:
        *lines, self._pending = (self._pending + piece).split(b"\n")
        return lines


class KeepAlivePool:
    """Idle connections by origin. A connection is taken for one request and put back only when the
    exchange ended cleanly, so an engine polled once a second keeps one connection for the whole session.
    The pool does not bound how many requests run at once (each takes a connection of its own): a caller
    that sends many at a time bounds them itself (tui.fleet.prometheus: a semaphore as large as
    `max_idle_per_origin`)."""

    def __init__(self, max_idle_per_origin: int = 2) -> None:
        self._idle: dict[Origin, list[Connection]] = {}
        self.max_idle = max_idle_per_origin

    async def get(self, url: str, headers: dict[str, str], cap: int) -> tuple[int, bytes, bool]:
        """(status, body, over_cap). Raises httpx's exceptions; the caller bounds the time
        (asyncio.timeout), and a cancelled GET drops its connection."""
        return await self.request("GET", url, headers, cap)

    async def request(self, method: str, url: str, headers: dict[str, str], cap: int,
                      body: bytes = b"", until: Until | None = None) -> tuple[int, bytes, bool]:
        """Any idempotent method, with an optional body (sent with its Content-Length; the caller names
        its Content-Type). `headers` replace the defaults of the same name (Accept, Accept-Encoding).
        `until`: a stream that does not end (SSE) is read only until it returns True for a piece received
        (the connection is then dropped). Same answer and error contract as `get`."""
        try:
            origin = Origin.of(url)
        except ValueError as exc:
            raise httpx.InvalidURL(str(exc)) from None
        target = request_target(url)
        sent = [("Host", origin.authority)]
        if headers:
            names = {name.lower() for name in headers}
            sent += [h for h in _DEFAULT_HEADERS if h[0].lower() not in names]
            sent += headers.items()
        else:
            sent += _DEFAULT_HEADERS
        if body or method not in ("GET", "HEAD"):
            sent.append(("Content-Length", str(len(body))))
        idle = self._idle.setdefault(origin, [])
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, origin, method, target, sent, body, cap, until)
            except httpx.RemoteProtocolError:
                # The server closed an idle connection as we reused it (keep-alive timeouts): nothing was
                # answered, so the request is sent again on a fresh connection, as httpcore does.
                if conn.answered:
                    raise
        conn = await self._connect(origin)
        return await self._exchange(conn, origin, method, target, sent, body, cap, until)

    async def _exchange(self, conn: Connection, origin: Origin, method: str, target: str,
                        headers: list[tuple[str, str]], body: bytes, cap: int,
                        until: Until | None = None) -> tuple[int, bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        enough = False

        def keep(data: bytes, _at: float) -> bool:  # True (over the cap, or enough): read no more, drop it
            nonlocal size, enough
            size += len(data)  # what the body inflates to, when it is compressed
            if size > cap:
                return True
            chunks.append(data)
            enough = until is not None and until(data)
            return enough

        try:
            conn.begin(method, target, headers, body)
            status, head = await conn.head
            length = head.get("content-length", "")
            if length.isdigit() and int(length) > cap:
                conn.close()  # not read: the connection is dropped
                return status, b"", True
            await conn.read_body(keep)
        except HttpFailure as exc:
            conn.close()
            raise _as_httpx(exc) from None
        except zlib.error as exc:
            conn.close()
            raise httpx.DecodingError(f"bad compressed body: {exc}") from None
        except BaseException:
            conn.close()
            raise
        if size > cap:
            return status, b"", True
        if enough:
            conn.close()
            return status, b"".join(chunks), False
        idle = self._idle.setdefault(origin, [])
        if conn.reusable and len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()
        return status, b"".join(chunks), False

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        tls = ssl_context() if origin.scheme == "https" else None
        try:
            _, conn = await loop.create_connection(lambda: Connection(loop, keep_alive=True), origin.host,
                                                   origin.port, ssl=tls,
                                                   server_hostname=origin.host if tls else None)
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return conn

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


def _as_httpx(exc: HttpFailure) -> httpx.HTTPError:
    """The client's failure as the httpx exception the pool's callers turn into words (engine_http)."""
    if exc.kind == "request":
        return httpx.LocalProtocolError(exc.detail)
    if exc.kind == "protocol":
        return httpx.RemoteProtocolError(f"malformed HTTP response: {exc.detail}")
    return httpx.RemoteProtocolError(exc.detail)  # dropped: closed before or during the answer


Transport = KeepAlivePool | httpx.AsyncBaseTransport


async def exchange(transport: Transport, method: str, url: str, headers: dict[str, str], cap: int,
                   timeout: float, body: bytes = b"", error_cap: int | None = None,
                   until: Until | None = None) -> tuple[int, bytes, bool]:
    """One request through either way `Transports.for_url` gives: (status, body, over_cap). The answer is
    read up to `cap` bytes (over it: b"", True); with `error_cap`, a non-200 answer is read only far enough
    to quote it (cut to error_cap, never "over"); with `until`, a 200 answer only until it returns True for
    a piece received. Raises httpx's exceptions; the caller bounds the total time (asyncio.timeout),
    `timeout` bounds each of httpx's phases."""
    if isinstance(transport, KeepAlivePool):
        status, data, over = await transport.request(method, url, headers, cap, body, until)
        if error_cap is not None and status != 200:
            return status, b"" if over else data[:error_cap], False
        return status, data, over
    request = httpx.Request(method, url, headers=headers, content=body, extensions={"timeout": {
        "connect": timeout, "read": timeout, "write": timeout, "pool": timeout}})
    resp = await transport.handle_async_request(request)
    try:
        status = resp.status_code
        quoting = error_cap is not None and status != 200
        limit = error_cap if error_cap is not None and quoting else cap
        length = resp.headers.get("content-length", "")
        if not quoting and length.isdigit() and int(length) > limit:
            return status, b"", True
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.aiter_bytes():  # decoded (gzip) as it arrives
            size += len(chunk)
            if size > limit:
                if not quoting:
                    return status, b"", True
                chunks.append(chunk[: limit - (size - len(chunk))])
                break
            chunks.append(chunk)
            if until is not None and not quoting and until(chunk):
                break
        return status, b"".join(chunks), False
    finally:
        await resp.aclose()


class Transports:
    """How the poller reaches each engine: the keep-alive pool for engines asked directly, one httpx
    transport per proxy for the others (tui.net.policy.proxy_for decides, for every client alike).
    `max_idle_per_origin` is the pool's; `limits` are the proxied transports' (httpx's defaults if None)."""

    def __init__(self, max_idle_per_origin: int = 2, limits: httpx.Limits | None = None) -> None:
        self.direct = KeepAlivePool(max_idle_per_origin)
        self._limits = limits
        self._proxied: dict[str, httpx.AsyncHTTPTransport] = {}

    def for_url(self, url: str) -> KeepAlivePool | httpx.AsyncHTTPTransport:
        proxy = proxy_for(url)
        if proxy is None:
            return self.direct
        transport = self._proxied.get(proxy)
        if transport is None:
            limits = self._limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
            transport = httpx.AsyncHTTPTransport(proxy=proxy, trust_env=False, limits=limits)
            self._proxied[proxy] = transport
        return transport

    async def aclose(self) -> None:
        await self.direct.aclose()
        proxied, self._proxied = list(self._proxied.values()), {}
        for transport in proxied:
            await transport.aclose()
