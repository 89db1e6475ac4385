"""enginetop's one HTTP/1.1 client: h11 writes each request (and refuses an invalid header), httptools
(llhttp, the parser uvicorn uses) reads the response, asyncio's Protocol API delivers (`Connection`). The
probe's streamed POST on a fresh connection (`Exchange`, here) and the poller's keep-alive pool
(tui.net.keepalive) both run on it.

Why not httpx here (the rest of enginetop uses it): a probe reads a token or two per network read, and
httpx's stack (httpcore, anyio, a task switch and a timeout object per read) costs about 2.5x the CPU of
a bare streaming client (bench/bench_probe.py: 20 requests of 128 tokens on llama-server). Here the parser
is fed straight from `data_received`, and each body piece goes to the caller's sink from its callback,
with no task switch and no per-read timer. Why httptools and not h11 for reading: h11 is pure Python,
about 20 us per chunk of a stream against 0.5 us (one chunk a token).

What this module adds to them: a fresh connection per request (`Connection: close`; see tui.probe.client
for why), TLS with the trust every enginetop httpx client has (certifi, nothing from the environment),
the proxy policy of tui.net.policy (an http:// proxy forwards http:// engines and tunnels https:// ones with
CONNECT; user:password in the proxy URL becomes Proxy-Authorization), gzip or deflate if a server
compresses though asked not to, the set-up (TCP connect, TLS) timed apart from the send, and a server
silent for `read_s` failing the request. The caller bounds the whole exchange.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import socket
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import h11
import httptools

from tui.net.policy import MAX_HEAD_BYTES, Origin, proxy_for, public_url, request_target, ssl_context

# Called with each piece of decoded body and its arrival time (time.monotonic()); True stops reading.
Sink = Callable[[bytes, float], bool]


class HttpFailure(Exception):
    """The exchange failed. `kind`: url, connect, connect-timeout, tls, proxy, request (not sendable),
    silent, dropped or protocol."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass
class Phases:
    """When the exchange got where (time.monotonic() seconds); None: it never got there."""

    connect_s: float | None = None  # TCP connect, to the proxy when there is one
    tls_s: float | None = None  # TLS handshake(s)
    sent_at: float | None = None  # the request went out (after any proxy CONNECT and TLS)


def _origin(url: str) -> Origin:
    try:
        return Origin.of(url)
    except ValueError as exc:
        raise HttpFailure("url", str(exc)) from None


def _request(method: str, target: str, headers: list[tuple[str, str]], content: bytes) -> bytes:
    writer = h11.Connection(h11.CLIENT)
    try:
        out = writer.send(h11.Request(method=method, target=target, headers=headers))
        if content:
            out += writer.send(h11.Data(data=content))
        out += writer.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        # h11's text quotes the offending header, which may be a secret: never pass it on
        raise HttpFailure("request", f"the {method} could not be sent: a header or the target is not "
                                     "valid HTTP/1.1") from None
    return out


@functools.lru_cache(maxsize=64)
def _bodiless_request(method: str, target: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    return _request(method, target, list(headers), b"")


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one exchange at a time: `begin` sends a request; `head` gives the status and
    headers; `read_body(sink)` hands the decoded body to a sink as it arrives. `keep_alive`: after a clean
    exchange the connection stays open for the next (the poller's pool); otherwise it closes at the end of
    the body (a probe). `read_s`: a server silent that long fails the exchange (None: the caller bounds
    the time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_s: float | None = None,
                 keep_alive: bool = False) -> None:
        self.loop = loop
        self.read_s = read_s
        self.keep_alive = keep_alive
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.answered = False  # something came back during this exchange
        self.head: asyncio.Future[tuple[int, dict[str, str]]] = loop.create_future()
        self.body_done: asyncio.Future[None] = loop.create_future()
        self._parser: httptools.HttpResponseParser | None = None  # the exchange's response reader
        self._server_keeps = False  # this exchange's answer is complete and lets the connection carry another
        self._head_bytes = 0  # read before the head was complete
        self._headers: dict[str, str] = {}
        self._now = 0.0  # arrival time of the read being parsed
        self._decoder: Any = None  # a zlib decompressor when the body is compressed
        self._sink: Sink | None = None
        self._early: list[tuple[bytes, float]] = []  # body that came before a sink was given
        self._stopped = False  # the sink asked for no more
        self._last_data = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, method: str, target: str, headers: list[tuple[str, str]], content: bytes = b"") -> None:
        """Send one request (head and body in one write)."""
        assert self.transport is not None
        if self._parser is not None:  # the next exchange on a kept connection
            self.head, self.body_done = self.loop.create_future(), self.loop.create_future()
            self._decoder, self._sink, self._early, self._stopped = None, None, [], False
        self._parser = httptools.HttpResponseParser(self)
        self._head_bytes, self._headers = 0, {}
        self._server_keeps = False
        self.answered = False
        # a poller sends the same few requests every second: each is written (and checked) by h11 once
        out = _request(method, target, headers, content) if content else \
            _bodiless_request(method, target, tuple(headers))
        self.arm_silence_timer()
        self.transport.write(out)

    @property
    def reusable(self) -> bool:
        return not self.closed and self._server_keeps  # a failed or stopped exchange has closed it

    # -- asyncio callbacks ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses, so no isinstance check)
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a request is one small write: never hold it back for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._now = self._last_data = time.monotonic()
        self.answered = True
        if self._parser is None or self.body_done.done():
            if not self._stopped:  # nothing asked, or the answer complete: a server speaking out of turn
                self._fail(HttpFailure("protocol", "the server sent data nobody asked for"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # ours, zlib's or the sink's: the cause is the news
            self._fail(exc.__context__ if isinstance(exc.__context__, Exception) else exc)
            return
        except httptools.HttpParserUpgrade:
            self._fail(HttpFailure("protocol", "the server switched protocols, which is not read"))
            return
        except httptools.HttpParserError as exc:
            self._fail(HttpFailure("protocol", str(exc) or type(exc).__name__))
            return
        if not self.head.done():  # a head that never ends is refused, not buffered without end
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(HttpFailure("protocol", f"the response head is over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.stop_silence_timer()
        if self.head.done() and self.body_done.done():
            return
        why = str(exc) if exc else "the server closed the connection"
        if not self.head.done():
            self._fail(HttpFailure("dropped", f"{why} before answering"))
            return
        if exc is None and self._framed_by_close():  # a body with no length and no chunks ends here
            try:
                self._complete()
            except Exception as failure:
                self._fail(failure)
            return
        self._fail(HttpFailure("dropped", f"{why} before the body was complete"))

    def _framed_by_close(self) -> bool:
        return "content-length" not in self._headers and "chunked" not in self._headers.get(
            "transfer-encoding", "").lower()

    # -- the parser's callbacks (httptools) --------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if status < 200:  # an informational answer (100 Continue): the real one follows
            self._headers = {}
            return
        self._start_body(self._headers)
        self.head.set_result((status, self._headers))

    def on_body(self, body: bytes) -> None:
        self._deliver(body, self._now)

    def on_message_complete(self) -> None:
        if self.head.done() and not self.body_done.done():  # not a 1xx: the answer itself is complete
            assert self._parser is not None
            self._server_keeps = self._parser.should_keep_alive()  # before the parser resets for the next
            self._complete()

    def _complete(self) -> None:
        if self._decoder is not None and not self._decoder.eof:
            raise HttpFailure("protocol", "the compressed body is truncated")
        self._finish()

    # -- silence ----------------------------------------------------------------------------------------
    def arm_silence_timer(self) -> None:
        self.stop_silence_timer()
        if self.read_s is None:
            return
        self._last_data = time.monotonic()
        self._timer = self.loop.call_later(self.read_s, self._check_silence)

    def _check_silence(self) -> None:
        # One timer, pushed back lazily: re-arming it on every read would cost a heap operation per token.
        assert self.read_s is not None
        left = self._last_data + self.read_s - time.monotonic()
        if left <= 0:
            where = "before the response" if not self.head.done() else "during the response"
            self._fail(HttpFailure("silent", where))
        else:
            self._timer = self.loop.call_later(left, self._check_silence)

    def stop_silence_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _start_body(self, headers: dict[str, str]) -> None:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "deflate"):
            self._decoder = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)
        elif encoding not in ("", "identity"):
            raise HttpFailure("protocol", f"the server sent Content-Encoding {encoding}, which is not read")

    def _deliver(self, data: bytes, now: float) -> None:
        if self._decoder is not None:
            data = self._decoder.decompress(data)
        if not data or self._stopped:
            return
        if self._sink is None:
            self._early.append((data, now))
        elif self._sink(data, now):
            self._stopped = True
            self._finish()

    # -- outcomes ---------------------------------------------------------------------------------------
    def read_body(self, sink: Sink) -> asyncio.Future[None]:
        """Hand every body piece to `sink` from now on (those already here first); True from it stops."""
        self._sink = sink
        early, self._early = self._early, []
        for data, at in early:
            if sink(data, at):
                self._stopped = True
                self._finish()
                break
        return self.body_done

    def _finish(self) -> None:
        self.stop_silence_timer()
        if not self.body_done.done():
            self.body_done.set_result(None)
        if self._stopped or not self.keep_alive:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def _fail(self, exc: Exception) -> None:
        self.stop_silence_timer()
        for fut in (self.head, self.body_done):
            if not fut.done():
                fut.set_exception(exc)
                break
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.stop_silence_timer()
        for fut in (self.head, self.body_done):
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # seen: asyncio would otherwise log a failure nobody awaited
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Exchange:
    """One POST: `await open(...)`, `await head()`, `await body(sink)`; `close()` always (idempotent)."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.phases = Phases()
        self._proto: Connection | None = None

    async def open(self, url: str, headers: dict[str, str], content: bytes, connect_s: float) -> None:
        """Connect (through a proxy where tui.net.policy says so), set up TLS, send the request."""
        loop = asyncio.get_running_loop()
        origin = _origin(url)
        path = request_target(url)
        proxy = proxy_for(url)
        if proxy and urlsplit(proxy).scheme != "http":
            raise HttpFailure("proxy", f"the proxy {public_url(proxy)} is not http://: the probe client "
                                       "speaks only to http:// proxies (add the engine's host to NO_PROXY)")
        hop = _origin(proxy) if proxy else origin
        proto = self._proto = Connection(loop, self.read_s)
        began = time.monotonic()
        try:
            async with asyncio.timeout(connect_s):
                await loop.create_connection(lambda: proto, hop.host, hop.port)
        except TimeoutError:
            raise HttpFailure("connect-timeout", f"{connect_s:g}s") from None
        except OSError as exc:
            via = f" to the proxy {public_url(proxy)}" if proxy else ""
            raise HttpFailure("connect", f"{exc or type(exc).__name__}{via}") from None
        self.phases.connect_s = time.monotonic() - began
        proxy_auth = _proxy_authorization(proxy)
        fields = [("Host", origin.authority), *headers.items(), ("Content-Length", str(len(content)))]
        if origin.scheme == "https":
            if proxy:
                proto = await self._tunnel(proto, origin, proxy_auth)
            await self._start_tls(loop, proto, origin, connect_s)
        elif proxy:
            path = f"http://{origin.authority}{path}"  # absolute form: the proxy forwards it
            if proxy_auth:
                fields.append(("Proxy-Authorization", proxy_auth))
        self.phases.sent_at = time.monotonic()
        proto.begin("POST", path, fields, content)

    async def _tunnel(self, proto: Connection, origin: Origin, auth: str | None) -> Connection:
        """CONNECT through the proxy; the protocol that reads the engine's answer on the tunnel."""
        fields = [("Host", origin.hostport)] + ([("Proxy-Authorization", auth)] if auth else [])
        proto.begin("CONNECT", origin.hostport, fields)
        status, _ = await proto.head
        proto.stop_silence_timer()
        if status != 200:
            raise HttpFailure("proxy", f"the proxy refused to tunnel to {origin.authority}: HTTP {status}")
        # The tunnel is open: what follows on this connection is the engine's, a new exchange to read.
        fresh = Connection(proto.loop, self.read_s)
        fresh.transport = proto.transport
        assert proto.transport is not None
        proto.transport.set_protocol(fresh)
        self._proto = fresh
        return fresh

    async def _start_tls(self, loop: asyncio.AbstractEventLoop, proto: Connection, origin: Origin,
                         timeout_s: float) -> None:
        assert proto.transport is not None
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                tls = await loop.start_tls(proto.transport, proto, ssl_context(), server_hostname=origin.host)
        except TimeoutError:
            raise HttpFailure("tls", f"TLS handshake timed out after {timeout_s:g}s") from None
        except (ssl.SSLError, OSError) as exc:
            raise HttpFailure("tls", f"TLS handshake failed: {exc}") from None
        assert isinstance(tls, asyncio.Transport)
        proto.transport = tls
        self.phases.tls_s = time.monotonic() - began

    async def head(self) -> tuple[int, dict[str, str]]:
        """Status and headers (lower-case names) of the response."""
        assert self._proto is not None
        return await self._proto.head

    async def body(self, sink: Sink) -> None:
        """Until the body ends, or `sink` returns True."""
        assert self._proto is not None
        await self._proto.read_body(sink)

    def close(self) -> None:
        if self._proto is not None:
            self._proto.close()


def _proxy_authorization(proxy: str | None) -> str | None:
    if not proxy:
        return None
    parts = urlsplit(proxy)
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")
