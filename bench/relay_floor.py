"""The floors under `enginetop proxy`'s added TTFT, for bench_proxy.py's `floor` section: the least a relay
in Python on this machine adds, each its own process on uvloop as `enginetop proxy` is.

    python bench/relay_floor.py pipe|aiohttp|uvicorn UPSTREAM_URL PORT

pipe: asyncio streams copying bytes both ways, no HTTP at all (a Python process in the path, nothing more).
aiohttp: the same library as the proxy doing only what a relay must (read the request, send it upstream on a
new connection, stream the answer back as it comes): no measuring, no headers filtered, no accounting.
uvicorn: the same relay with another server under it (uvicorn on httptools, a bare ASGI app, no framework;
aiohttp's client upstream): whether a lighter HTTP server than aiohttp's would bring the proxy under 1 ms.
Prints "ready" once it listens.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import uvloop
from aiohttp import web


async def pipe(upstream: str, port: int) -> None:
    parts = urlsplit(upstream)

    async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(parts.hostname, parts.port)
        await asyncio.gather(copy(client_r, up_w), copy(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


def upstream_session() -> aiohttp.ClientSession:
    """Both HTTP relays' client: a new upstream connection per request, nothing decoded."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), auto_decompress=False)


async def relay(upstream: str, port: int) -> None:
    session = upstream_session()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.request(request.method, upstream + request.rel_url.raw_path_qs, data=body,
                                   headers={"Content-Type": request.content_type}) as answer:
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": answer.headers["Content-Type"]})
            await response.prepare(request)
            async for data in answer.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def asgi_relay(upstream: str, port: int) -> None:
    import uvicorn  # the dev extra's: only this floor uses it

    session = upstream_session()

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while (message := await receive()).get("more_body"):
            body += message.get("body", b"")
        body += message.get("body", b"")
        query = scope["query_string"].decode()
        url = upstream + scope["raw_path"].decode() + (f"?{query}" if query else "")
        async with session.request(scope["method"], url, data=body,
                                   headers={"Content-Type": "application/json"}) as answer:
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": [(b"content-type", answer.headers["Content-Type"].encode())]})
            async for data in answer.content.iter_any():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="none", http="httptools",
                                           lifespan="off", log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await serving


if __name__ == "__main__":
    kind, upstream, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    uvloop.run({"pipe": pipe, "aiohttp": relay, "uvicorn": asgi_relay}[kind](upstream, port))
