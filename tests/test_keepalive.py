"""The poller's keep-alive pool on real loopback sockets: one connection for many polls, a connection the
server dropped while idle is replaced without an error, an oversized body drops its connection."""

from __future__ import annotations

import asyncio

import pytest

from tui.sources.keepalive import KeepAlivePool

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
