"""Keep-alive HTTP/1.1 GETs for the poller: h11 over asyncio's Protocol API, one idle connection kept per
engine.

Why not the httpx transport the rest of enginetop uses: the dashboard asks every engine for /metrics every
second, and httpx's stack (Request and Response objects, httpcore's pool, anyio's streams and a timeout
object per read) cost about 1.6 ms of CPU a poll against 0.9 ms here with the same parse
(bench/bench_app.py, issue 9's CPU budget). Proxies still go through httpx (`Transports` below decides):
what is sent, the trust for https and the errors are the same either way, and failures are raised as the
httpx exceptions `tui.sources.engine` already turns into words.

The fleet view's Prometheus client sends its queries through the same pool, as POSTs with a form body
(tui.fleet.prometheus says why). Every request the pool sends is idempotent (a GET, a Prometheus query), so
one sent on an idle connection the server had just closed is sent again on a fresh one.
"""

from __future__ import annotations

import asyncio
import socket
import zlib

import h11
import httpx

from tui.net import MAX_HEAD_BYTES, Origin, proxy_for, request_target, ssl_context


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection, one request at a time."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._status = 0
        self._encoding = ""
        self._chunks: list[bytes] = []
        self._size = 0
        self._cap = 0
        self._over = False
        self.answered = False

    # ---- asyncio callbacks ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a GET is one small write: never hold it back for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.h11.receive_data(data)
            self._events()
        except h11.RemoteProtocolError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        self.connection_lost(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            try:
                self.h11.receive_data(b"")  # a body delimited by the close ends here
                self._events()
            except h11.RemoteProtocolError:
                pass
            if not self._waiter.done():
                self._fail(httpx.RemoteProtocolError("the server closed the connection before answering"
                                                     if exc is None else f"connection lost: {exc}"))

    # ---- one exchange ----
    async def send(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes,
                   cap: int) -> tuple[int, bytes, bool]:
        assert self.transport is not None
        if self.h11.our_state is h11.DONE:
            self.h11.start_next_cycle()
        self._status, self._encoding, self._chunks, self._size = 0, "", [], 0
        self._cap, self._over, self.answered = cap, False, False
        try:
            out = self.h11.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                out += self.h11.send(h11.Data(data=body))
            out += self.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            # h11's text quotes the offending header, which may be a secret: never pass it on
            raise httpx.LocalProtocolError(f"the {method} could not be sent: a header or the target is not "
                                           "valid HTTP/1.1") from None
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(out)  # head and body in one write
        await waiter
        data = b"".join(self._chunks)
        if self._encoding in ("gzip", "deflate") and not self._over:
            # the poller asks for identity, a server that compresses anyway is still read right; the fleet's
            # Prometheus client asks for gzip. The cap applies to what the body inflates to.
            inflate = zlib.decompressobj(47 if self._encoding == "gzip" else 15)
            try:
                data = inflate.decompress(data, cap + 1)
            except zlib.error as exc:
                raise httpx.DecodingError(f"bad {self._encoding} body: {exc}") from None
            if len(data) > cap:
                return self._status, b"", True
            if not inflate.eof:
                raise httpx.DecodingError(f"bad {self._encoding} body: truncated")
        return self._status, data, self._over

    @property
    def reusable(self) -> bool:
        return not self.closed and self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def _events(self) -> None:
        while self._waiter is not None and not self._waiter.done():
            event = self.h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Response):
                self._status = event.status_code
                for name, value in event.headers:
                    if name == b"content-encoding":
                        self._encoding = value.decode("latin-1").strip().lower()
                    elif name == b"content-length" and value.isdigit() and int(value) > self._cap:
                        self._over = True  # not read: the connection is dropped
                        self._waiter.set_result(None)
                        self.close()
                        return
            elif isinstance(event, h11.Data):
                self._size += len(event.data)
                if self._size > self._cap:
                    self._over = True
                    self._waiter.set_result(None)
                    self.close()
                    return
                self._chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._waiter.set_result(None)
            elif isinstance(event, h11.ConnectionClosed):
                self._fail(httpx.RemoteProtocolError("the server closed the connection before answering"))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_DEFAULT_HEADERS = (("Accept", "*/*"), ("Accept-Encoding", "identity"))


class KeepAlivePool:
    """Idle connections by origin. A connection is taken for one request and put back only when the
    exchange ended cleanly, so an engine polled once a second keeps one connection for the whole session.
    The pool does not bound how many requests run at once (each takes a connection of its own): a caller
    that sends many at a time bounds them itself (tui.fleet.prometheus: a semaphore as large as
    `max_idle_per_origin`)."""

    def __init__(self, max_idle_per_origin: int = 2) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self.max_idle = max_idle_per_origin

    async def get(self, url: str, headers: dict[str, str], cap: int) -> tuple[int, bytes, bool]:
        """(status, body, over_cap). Raises httpx's exceptions; the caller bounds the time
        (asyncio.timeout), and a cancelled GET drops its connection."""
        return await self.request("GET", url, headers, cap)

    async def request(self, method: str, url: str, headers: dict[str, str], cap: int,
                      body: bytes = b"") -> tuple[int, bytes, bool]:
        """Any idempotent method, with an optional body (sent with its Content-Length; the caller names
        its Content-Type). `headers` replace the defaults of the same name (Accept, Accept-Encoding).
        Same answer and error contract as `get`."""
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
                return await self._exchange(conn, origin, method, target, sent, body, cap)
            except httpx.RemoteProtocolError:
                # The server closed an idle connection as we reused it (keep-alive timeouts): nothing was
                # answered, so the request is sent again on a fresh connection, as httpcore does.
                if conn.answered:
                    raise
        conn = await self._connect(origin)
        return await self._exchange(conn, origin, method, target, sent, body, cap)

    async def _exchange(self, conn: _Connection, origin: Origin, method: str, target: str,
                        headers: list[tuple[str, str]], body: bytes, cap: int) -> tuple[int, bytes, bool]:
        try:
            result = await conn.send(method, target, headers, body, cap)
        except BaseException:
            conn.close()
            raise
        idle = self._idle.setdefault(origin, [])
        if conn.reusable and len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()
        return result

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = ssl_context() if origin.scheme == "https" else None
        try:
            _, conn = await loop.create_connection(_Connection, origin.host, origin.port, ssl=tls,
                                                   server_hostname=origin.host if tls else None)
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return conn

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


Transport = KeepAlivePool | httpx.AsyncBaseTransport


async def exchange(transport: Transport, method: str, url: str, headers: dict[str, str], cap: int,
                   timeout: float, body: bytes = b"", error_cap: int | None = None
                   ) -> tuple[int, bytes, bool]:
    """One request through either way `Transports.for_url` gives: (status, body, over_cap). The answer is
    read up to `cap` bytes (over it: b"", True); with `error_cap`, a non-200 answer is read only far enough
    to quote it (cut to error_cap, never "over"). Raises httpx's exceptions; the caller bounds the total
    time (asyncio.timeout), `timeout` bounds each of httpx's phases."""
    if isinstance(transport, KeepAlivePool):
        status, data, over = await transport.request(method, url, headers, cap, body)
        if error_cap is not None and status != 200:
            return status, b"" if over else data[:error_cap], False
        return status, data, over
    request = httpx.Request(method, url, headers=headers, content=body, extensions={"timeout": {
        "connect": timeout, "read": timeout, "write": timeout, "pool": timeout}})
    resp = await transport.handle_async_request(request)
    try:
        status = resp.status_code
        quoting = error_cap is not None and status != 200
        limit = error_cap if quoting else cap
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
        return status, b"".join(chunks), False
    finally:
        await resp.aclose()


class Transports:
    """How the poller reaches each engine: the keep-alive pool for engines asked directly, one httpx
    transport per proxy for the others (tui.net.proxy_for decides, for every client alike).
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
            extra = {} if self._limits is None else {"limits": self._limits}
            transport = self._proxied[proxy] = httpx.AsyncHTTPTransport(proxy=proxy, trust_env=False, **extra)
        return transport

    async def aclose(self) -> None:
        await self.direct.aclose()
        proxied, self._proxied = list(self._proxied.values()), {}
        for transport in proxied:
            await transport.aclose()
