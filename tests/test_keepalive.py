"""The poller's keep-alive pool on real loopback sockets: one connection for many polls, a connection the
server dropped while idle is replaced without an error, an oversized body drops its connection."""

from __future__ import annotations

import asyncio
import gzip

import httpx
import pytest

from tui.net.keepalive import KeepAlivePool

BODY = b"# TYPE x counter\nx_total 1\n"


class Server:
    """HTTP/1.1 on loopback: answers every GET with BODY; `close_after` answers per connection, then closes
    it silently (no Connection: close), as an engine's keep-alive timeout does."""

    def __init__(self, close_after: int | None = None, body: bytes = BODY) -> None:
        self.close_after, self.body = close_after, body
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /metrics HTTP/1.1\r\n")
                assert b"\r\nhost: 127.0.0.1:" in head.lower()
                self.requests += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(self.body) + self.body)
                await writer.drain()
                answered += 1
                if self.close_after is not None and answered >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/metrics"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def test_many_polls_share_one_connection() -> None:
    server = Server()
    pool = KeepAlivePool()
    async with server as url:
        for _ in range(5):
            assert await pool.get(url, {}, 1 << 20) == (200, BODY, False)
    await pool.aclose()
    assert (server.connections, server.requests) == (1, 5)


async def test_a_connection_the_server_dropped_while_idle_is_replaced() -> None:
    server = Server(close_after=1)
    pool = KeepAlivePool()
    async with server as url:
        for _ in range(3):
            assert await pool.get(url, {}, 1 << 20) == (200, BODY, False)
            await asyncio.sleep(0.05)  # the close reaches us, or not yet: either way the next GET works
    await pool.aclose()
    assert (server.connections, server.requests) == (3, 3)


@pytest.mark.parametrize("cap", [10, len(BODY) - 1])
async def test_a_body_over_the_cap_is_not_kept_and_drops_the_connection(cap: int) -> None:
    server = Server()
    pool = KeepAlivePool()
    async with server as url:
        status, body, over = await pool.get(url, {}, cap)
        assert (status, over) == (200, True) and len(body) <= cap
        assert await pool.get(url, {}, 1 << 20) == (200, BODY, False)
    await pool.aclose()
    assert server.connections == 2


class FormServer:
    """HTTP/1.1 on loopback that reads whole requests (head, then a Content-Length body) and records them:
    (method, target, headers with lower-case names, body). Answers `answer` with `headers`; `close_after`
    as Server's."""

    def __init__(self, answer: bytes = b'{"status":"success"}', headers: dict[str, str] | None = None,
                 close_after: int | None = None) -> None:
        self.answer, self.headers, self.close_after = answer, headers or {}, close_after
        self.connections = 0
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.rstrip("\r\n").split("\r\n")
                method, target, version = request_line.split(" ")
                assert version == "HTTP/1.1", request_line
                headers = {}
                for line in lines:
                    name, _, val = line.partition(":")
                    assert name.lower() not in headers, f"{name} sent twice"
                    headers[name.lower()] = val.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.seen.append((method, target, headers, body))
                extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
                writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.answer)}\r\n{extra}\r\n".encode()
                             + self.answer)
                await writer.drain()
                answered += 1
                if self.close_after is not None and answered >= self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


FORM = b"query=sum+by+%28job%29+%28up%29&timeout=5s"


async def test_a_post_sends_its_form_with_content_length_and_keeps_the_connection() -> None:
    server = FormServer()
    pool = KeepAlivePool()
    headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
    async with server as base:
        for _ in range(3):
            answer = await pool.request("POST", f"{base}/api/v1/query", headers, 1 << 20, FORM)
            assert answer == (200, b'{"status":"success"}', False)
        assert await pool.request("GET", f"{base}/-/ready", {}, 1 << 20) == (200, b'{"status":"success"}',
                                                                            False)
    await pool.aclose()
    assert server.connections == 1 and len(server.seen) == 4
    for method, target, sent, body in server.seen[:3]:
        assert (method, target, body) == ("POST", "/api/v1/query", FORM)
        assert sent["content-length"] == str(len(FORM))
        assert sent["content-type"] == "application/x-www-form-urlencoded"
        assert sent["accept"] == "application/json"  # the caller's, instead of the default */*
        assert sent["host"] == base.removeprefix("http://") and sent["accept-encoding"] == "identity"
    method, target, sent, body = server.seen[3]
    assert (method, target, body) == ("GET", "/-/ready", b"") and "content-length" not in sent
    assert sent["accept"] == "*/*"


async def test_a_post_on_a_connection_the_server_dropped_while_idle_is_sent_again() -> None:
    server = FormServer(close_after=1)
    pool = KeepAlivePool()
    async with server as base:
        for _ in range(3):
            answer = await pool.request("POST", f"{base}/api/v1/query", {}, 1 << 20, FORM)
            assert answer == (200, b'{"status":"success"}', False)
            await asyncio.sleep(0.05)
    await pool.aclose()
    assert server.connections == 3 and [s[3] for s in server.seen] == [FORM] * 3


async def test_a_gzip_answer_is_inflated_and_the_cap_counts_what_it_inflates_to() -> None:
    plain = b'{"status":"success","data":{"result":[]}}' * 100
    server = FormServer(answer=gzip.compress(plain), headers={"Content-Encoding": "gzip"})
    pool = KeepAlivePool()
    async with server as base:
        url = f"{base}/api/v1/query"
        assert await pool.request("POST", url, {"Accept-Encoding": "gzip"}, 1 << 20, FORM) == (200, plain,
                                                                                               False)
        # compressed it fits the cap; inflated it does not
        assert len(gzip.compress(plain)) < 1000 < len(plain)
        assert await pool.request("POST", url, {"Accept-Encoding": "gzip"}, 1000, FORM) == (200, b"", True)
    await pool.aclose()
    assert server.seen[0][2]["accept-encoding"] == "gzip"


async def test_a_header_that_is_not_http_is_refused_without_quoting_it() -> None:
    server = FormServer()
    pool = KeepAlivePool()
    async with server as base:
        with pytest.raises(httpx.LocalProtocolError) as exc:
            await pool.request("POST", f"{base}/api/v1/query", {"Authorization": "Bearer s3cret\r\nX: y"},
                               1 << 20, FORM)
    await pool.aclose()
    assert "s3cret" not in str(exc.value) and "not valid HTTP/1.1" in str(exc.value)
    assert server.seen == []


async def test_a_server_that_never_answers_is_bounded_by_the_caller_and_its_connection_dropped() -> None:
    accepted: list[asyncio.StreamWriter] = []
    dropped = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # until the client closes its end
        dropped.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/api/v1/query"
    pool = KeepAlivePool()
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await pool.request("POST", url, {}, 1 << 20, FORM)
    assert 0.3 <= asyncio.get_running_loop().time() - started < 2
    # not kept for the next request (its answer may still come): closed now, not at the pool's end
    await asyncio.wait_for(dropped.wait(), 2)
    await pool.aclose()
    server.close()
    assert len(accepted) == 1


class RawServer:
    """Answers the first request on each connection with `answer`, bytes as given (one write), then closes
    the connection when `close` says so."""

    def __init__(self, answer: bytes, close: bool = True) -> None:
        self.answer, self.close = answer, close

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(self.answer)
        await writer.drain()
        if self.close:
            writer.close()
        else:
            await reader.read()  # held open until the client goes

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/metrics"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def test_a_body_that_arrives_with_its_head_in_one_read_is_not_taken_for_a_long_head() -> None:
    body = b"x_total 1\n" * 30_000  # 300 kB: more than MAX_HEAD_BYTES (64 KiB) in the read that ends the head
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    pool = KeepAlivePool()
    async with RawServer(answer) as url:
        assert await pool.get(url, {}, 1 << 20) == (200, body, False)
    await pool.aclose()


async def test_a_head_that_never_ends_is_refused() -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 70_000  # one header line that never ends
    pool = KeepAlivePool()
    async with RawServer(answer, close=False) as url:
        with pytest.raises(httpx.RemoteProtocolError, match="head is over 65536 bytes"):
            await asyncio.wait_for(pool.get(url, {}, 1 << 20), 10)
    await pool.aclose()


async def test_a_body_framed_by_the_close_ends_there_and_one_cut_short_is_an_error() -> None:
    pool = KeepAlivePool()
    async with RawServer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end") as url:
        assert await pool.get(url, {}, 1 << 20) == (200, b"until the end", False)
    async with RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort") as url:
        with pytest.raises(httpx.RemoteProtocolError, match="before the body was complete"):
            await pool.get(url, {}, 1 << 20)
    await pool.aclose()


async def test_a_corrupt_gzip_body_is_named_as_such() -> None:
    bad = b"\x1f\x8b\x08\x00" + b"not gzip at all" * 4
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bad) + bad
    pool = KeepAlivePool()
    async with RawServer(answer) as url:
        with pytest.raises(httpx.DecodingError, match="bad compressed body"):
            await pool.get(url, {}, 1 << 20)
    await pool.aclose()
