"""The proxy on loopback, in front of test upstreams whose every move the test sees: concurrency, a client
that goes away, a dead engine, limits, errors, headers, its own Prometheus series scraped by a real
Prometheus."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import orjson
import psutil
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.prometheus_server import running_prometheus
from tests.sse_server import Scenario, SSEServer
from tests.waiting import until_async
from tui.base.defaults import METRICS_PATH, TRAFFIC_PATH
from tui.base.process import free_port
from tui.live.store import Store
from tui.model.samples import EngineSample
from tui.net.listen import Listen, ListenError
from tui.proxy import upstream as spares
from tui.proxy.server import Route, TrafficProxy
from tui.proxy.source import ProxyTraffic, RemoteTraffic
from widgets.engine_panel import render_engine


def proxy_for(upstream: str, name: str = "e", **kwargs) -> TrafficProxy:
    return TrafficProxy([Route(name, upstream.rstrip("/"), Listen("127.0.0.1", free_port()))], **kwargs)


def chat(stream: bool = True, **extra):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": stream, **extra}


class Upstream:
    """An aiohttp upstream that keeps what it received and when a handler saw its client go away."""

    def __init__(self, headers_first: bool) -> None:
        self.headers_first = headers_first
        self.received: list[dict[str, str]] = []
        self.peers: list[int] = []  # the proxy's port of each request's connection
        self.cancelled_at: list[float] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.received.append(dict(request.headers))
        self.peers.append(request.transport.get_extra_info("peername")[1])
        await request.read()
        try:
            if request.path == "/echo":
                return web.json_response({"headers": dict(request.headers)})
            if request.path == "/login":
                response = web.json_response({})
                response.set_cookie("session", "client-a-secret")
                return response
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            if self.headers_first:
                await response.prepare(request)
                await response.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
            await asyncio.sleep(30)  # a long prefill: the first token never comes in time
            return response
        except asyncio.CancelledError:
            self.cancelled_at.append(time.monotonic())
            raise

    async def __aenter__(self) -> Upstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def test_256_concurrent_streams_are_relayed_at_once_none_waits_behind_another():
    # 5 s a stream: longer than opening 256 of them takes beside the engine tests (2 s was not, once)
    with SSEServer(default=Scenario(tokens=5, per_token_delay_s=1.0)) as upstream:
        proxy = proxy_for(upstream.url)
        await proxy.start()
        url = proxy.routes[0].proxy_url + "/v1/chat/completions"
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, proxy.books["e"].in_flight)
                await asyncio.sleep(0.01)

        async def one(client: httpx.AsyncClient) -> int:
            async with client.stream("POST", url, json=chat()) as reply:
                return sum([1 async for line in reply.aiter_lines() if '"content"' in line])

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=300)) as client:
                counts = await asyncio.gather(*(one(client) for _ in range(256)))
        finally:
            watcher.cancel()
            await proxy.stop()
        took = time.monotonic() - started
    assert len(set(counts)) == 1  # every client got the same events
    assert [(r.outcome, r.completion_tokens, r.token_events) for r in proxy.books["e"].recent()] == [
        ("ok", 5, 5)] * 256
    # each stream lasts ~5 s (5 tokens 1 s apart); one after another they would take 21 minutes
    assert peak == 256, f"at most {peak} streams were relayed at once"
    assert took < 30, took
    assert proxy.books["e"].total == 256 and proxy.books["e"].stats().errors == 0


@pytest.mark.parametrize("headers_first", [True, False], ids=["after-headers", "before-headers"])
async def test_a_client_gone_before_the_first_token_cancels_the_upstream_request_within_1s(headers_first):
    async with Upstream(headers_first) as upstream:
        proxy = proxy_for(upstream.url)
        await proxy.start()
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                async def go() -> None:
                    async with client.stream("POST", proxy.routes[0].proxy_url + "/v1/chat/completions",
                                             json=chat()) as reply:
                        async for _ in reply.aiter_bytes():
                            pass
                task = asyncio.create_task(go())
                await until_async(lambda: upstream.received, "the request at the upstream")
                await asyncio.sleep(0.3)
                task.cancel()
                gone = time.monotonic()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await until_async(lambda: upstream.cancelled_at, "the upstream to see its client go", timeout=5)
            assert upstream.cancelled_at[0] - gone < 1.0
            await until_async(lambda: proxy.books["e"].total, "the request to be counted")
            stats = proxy.books["e"].stats()
            assert stats.abandoned == 1 and stats.in_flight == 0
        finally:
            await proxy.stop()


async def test_headers_are_forwarded_and_hop_by_hop_ones_are_not():
    async with Upstream(True) as upstream:
        # by name: a client's cookie jar keeps cookies of named hosts (aiohttp's ignores bare IPs)
        proxy = proxy_for(f"http://localhost:{upstream.port}")
        await proxy.start()
        try:
            async with httpx.AsyncClient() as other:  # one client logs in...
                login = await other.get(proxy.routes[0].proxy_url + "/login")
            assert "client-a-secret" in login.headers["set-cookie"]  # ...and gets its cookie back
            async with httpx.AsyncClient() as client:
                reply = await client.get(proxy.routes[0].proxy_url + "/echo?x=1",
                                         headers={"Authorization": "Bearer sk-test", "X-Custom": "v",
                                                  "Connection": "keep-alive, X-Drop", "X-Drop": "1",
                                                  "Keep-Alive": "timeout=5"})
        finally:
            await proxy.stop()
    seen = {k.lower(): v for k, v in reply.json()["headers"].items()}
    assert seen["authorization"] == "Bearer sk-test" and seen["x-custom"] == "v"
    assert "x-drop" not in seen and "keep-alive" not in seen
    assert seen.get("connection") != "keep-alive, X-Drop"
    assert seen["host"] == f"localhost:{upstream.port}"
    assert "cookie" not in seen  # the proxy keeps no cookie jar: nothing of one client reaches another


def connections_to(port: int) -> set[int]:
    """This process's own ports of its open connections to `port` (the proxy runs in the test's process)."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


async def test_the_next_request_finds_its_connection_made_and_never_a_stale_or_closed_one(monkeypatch):
    async with Upstream(True) as upstream:
        proxy = proxy_for(upstream.url)
        await proxy.start()
        url = proxy.routes[0].proxy_url + "/echo"
        try:
            async with httpx.AsyncClient() as client:
                assert (await client.get(url)).status_code == 200
                # (the request's own connection may not be closed yet when its answer is in)
                used = upstream.peers[-1]
                spare = await until_async(lambda: connections_to(upstream.port) - {used},
                                          "a connection opened ahead")
                assert (await client.get(url)).status_code == 200
                assert upstream.peers[-1] in spare, "the second request connected again"
                # older than an engine waits for a first request: closed, and the request connects anew
                monkeypatch.setattr(spares, "SPARE_MAX_AGE_S", 0.0)
                used = upstream.peers[-1]
                stale = await until_async(lambda: connections_to(upstream.port) - {used}, "the next one")
                assert (await client.get(url)).status_code == 200
                assert upstream.peers[-1] not in stale
                assert not stale & connections_to(upstream.port), "the stale spare stayed open"
        finally:
            await proxy.stop()
        assert not connections_to(upstream.port), "the proxy left a spare open when it stopped"


def sse_server_process(port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.sse_server", "--port", str(port)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("listening ")
    return proc


async def test_an_engine_restarted_under_its_spare_connection_answers_the_next_request():
    port = free_port()
    engine = sse_server_process(port)
    proxy = proxy_for(f"http://127.0.0.1:{port}")
    await proxy.start()
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            url = proxy.routes[0].proxy_url + "/v1/chat/completions"
            assert (await client.post(url, json=chat())).status_code == 200
            await until_async(lambda: connections_to(port), "a connection opened ahead")
            engine.kill()  # its sockets close with it, the spare among them
            engine.wait()
            engine = sse_server_process(port)
            reply = await client.post(url, json=chat())
        assert reply.status_code == 200 and "data: [DONE]" in reply.text
    finally:
        await proxy.stop()
        engine.kill()
        engine.wait()


async def test_a_dead_engine_gets_502_naming_it_and_errors_pass_through_with_their_status_and_body():
    dead = proxy_for(f"http://127.0.0.1:{free_port()}", name="llama-down")
    scenarios = {"s503": Scenario(mode="http500", status=503), "s500": Scenario(mode="http500")}
    with SSEServer(scenarios) as upstream:
        live = proxy_for(upstream.url)
        await dead.start()
        await live.start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                down = await client.post(dead.routes[0].proxy_url + "/v1/chat/completions", json=chat())
                direct = {s: await client.post(upstream.url_for(s) + "/v1/chat/completions", json=chat())
                          for s in scenarios}
                proxied = {s: await client.post(live.routes[0].proxy_url + f"/s/{s}/v1/chat/completions",
                                                json=chat()) for s in scenarios}
        finally:
            await dead.stop()
            await live.stop()
    assert down.status_code == 502
    error = down.json()["error"]
    assert "llama-down" in error["message"] and "not reachable" in error["message"] and error["code"] == 502
    for s in scenarios:
        assert proxied[s].status_code == direct[s].status_code and proxied[s].content == direct[s].content
    assert dead.books["llama-down"].stats().errors == 1 and live.books["e"].stats().errors == 2


async def test_a_body_over_the_limit_gets_413_and_the_engine_never_sees_it():
    async with Upstream(True) as upstream:
        proxy = proxy_for(upstream.url, max_body_bytes=1024)
        await proxy.start()
        try:
            async with httpx.AsyncClient() as client:
                big = await client.post(proxy.routes[0].proxy_url + "/v1/chat/completions",
                                        content=b"{" + b" " * 4096 + b"}")
                small = await client.post(proxy.routes[0].proxy_url + "/echo", content=b"{}")
        finally:
            await proxy.stop()
    assert big.status_code == 413 and "1024 bytes" in big.json()["error"]["message"]
    assert small.status_code == 200 and len(upstream.received) == 1


async def test_a_taken_port_is_a_clear_error_and_nothing_stays_open():
    with SSEServer() as upstream:
        first = proxy_for(upstream.url)
        await first.start()
        second = TrafficProxy([Route("e2", upstream.url, first.routes[0].listen)])
        try:
            with pytest.raises(ListenError, match="already in use"):
                await second.start()
        finally:
            await first.stop()
    assert second._runners == [] and second._session is None


async def test_traffic_reaches_the_store_and_the_panel_in_process_and_from_a_separate_proxy():
    with SSEServer(default=Scenario(tokens=6, per_token_delay_s=0.02)) as upstream:
        proxy = proxy_for(upstream.url, name="llama")
        await proxy.start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(3):
                    await client.post(proxy.routes[0].proxy_url + "/v1/chat/completions", json=chat())
                    await client.post(proxy.routes[0].proxy_url + "/v1/chat/completions", json=chat(False))
            store = Store()
            store.add(EngineSample("llama", upstream.url, time.monotonic(), time.time(), "up"))
            for sample in await ProxyTraffic(proxy).read():
                store.add(sample)
            remote = RemoteTraffic(proxy.routes[0].proxy_url)
            remote_samples = await remote.read()
        finally:
            await proxy.stop()
        gone = await remote.read()  # the proxy stopped: the last figures, with why
        await remote.aclose()
    state = store.engines["llama"]
    assert state.traffic is not None and state.traffic.stats.requests == 6
    assert state.traffic.stats.ttft_p50_s is not None and state.traffic.stats.itl_p50_s is not None
    assert 0.01 < state.traffic.stats.itl_p50_s < 0.2
    text = render_engine(state).plain
    assert "req/s, 0 in flight" in text and "traffic TTFT" in text and "tokens/request" in text
    assert "errors" not in text
    assert [s.stats.requests for s in remote_samples] == [6] and remote_samples[0].name == "llama"
    assert gone and "did not answer" in (gone[0].error or "")


async def test_the_proxys_series_are_scraped_by_a_real_prometheus():
    with SSEServer(default=Scenario(tokens=4, per_token_delay_s=0.01)) as upstream:
        proxy = proxy_for(upstream.url, name="llama")
        await proxy.start()
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(3):
                    await client.post(proxy.routes[0].proxy_url + "/v1/chat/completions", json=chat())
                text = (await client.get(proxy.routes[0].proxy_url + METRICS_PATH)).text
                traffic = orjson.loads((await client.get(proxy.routes[0].proxy_url + TRAFFIC_PATH)).content)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert {"enginetop_proxy_time_to_first_token_seconds",
                    "enginetop_proxy_inter_token_latency_seconds", "enginetop_proxy_requests",
                    "enginetop_proxy_prompt_tokens",
                    "enginetop_proxy_requests_in_flight"} <= set(families)
            assert traffic[0]["stats"]["total_requests"] == 3
            target = proxy.routes[0].listen.display + METRICS_PATH
            with running_prometheus({"proxy": [target]}, interval_s=1.0) as prom:
                result = await asyncio.to_thread(
                    prom.wait_for, 'enginetop_proxy_requests_total{engine="llama",status="200",outcome="ok"}')
                assert float(result[0]["value"][1]) == 3.0
                count = await asyncio.to_thread(
                    prom.wait_for, 'enginetop_proxy_time_to_first_token_seconds_count{engine="llama"}')
                assert float(count[0]["value"][1]) == 3.0
        finally:
            await proxy.stop()



def test_bad_proxy_flags_are_refused_with_a_reason_before_anything_starts(tmp_path, capsys):
    import socket

    from tui.cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {
            ("proxy", "--engine", "a=http://127.0.0.1:1", "--listen", f"127.0.0.1:{port}"): "already in use",
            ("proxy", "--engine", "a=http://127.0.0.1:1", "--engine", "b=http://127.0.0.1:2",
             "--listen", "a=127.0.0.1:1"): "no address for b",
            ("proxy", "--engine", "a=http://127.0.0.1:1", "--listen", "c=127.0.0.1:1"):
                "no engine is named 'c'",
            ("proxy", "--engine", "a=http://127.0.0.1:1", "--listen", "10.1.2.3:8081"): "not a loopback",
            ("proxy", "--engine", "a=http://127.0.0.1:1", "--listen", "127.0.0.1:1",
             "--capture-content"): "needs a trace file",
            ("--engine", "a=http://127.0.0.1:1", "--proxy-listen", f"127.0.0.1:{port}"): "already in use",
            ("--engine", "a=http://127.0.0.1:1", "--proxy-trace", str(tmp_path / "t")): "need --proxy-listen",
        }
        for argv, words in cases.items():
            assert main(list(argv)) == 2, argv
            assert words in capsys.readouterr().err, argv
