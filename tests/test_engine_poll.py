"""poll_engine against real HTTP servers on 127.0.0.1 that misbehave in the ways engines do."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.prom_filter import restricted
from tui.base.process import free_port
from tui.model.targets import EngineTarget
from tui.net.keepalive import KeepAlivePool, Transports
from tui.sources.engine import poll_engine
from tui.sources.engine_source import EngineSource
from tui.sources.metrics import names_query

DATA = Path(__file__).parent / "data" / "metrics"
VLLM_BODY = (DATA / "vllm_0_33.txt").read_bytes()
FILTERED = "/metrics/?" + names_query("vllm")  # what EngineSource asks a vLLM for (NameFilter)
LLAMA_LOADING = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
MODELS = json.dumps({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]}).encode()

NEEDS_KEY = ("unauthorized: it answers, and needs an API key: give it with --api-key-file NAME=PATH or "
             "--api-key-env NAME=VAR")


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay: float = 0.0  # before the headers
    drip: float | None = None  # send the body one byte every `drip` seconds
    content_length: bool = True
    require_key: str | None = None  # answer 401 unless `Authorization: Bearer <key>`
    extra_length: int = 0  # announce this many bytes more than are sent, then close


@dataclass
class Fake:
    url: str
    port: int
    routes: dict[str, Route] = field(default_factory=dict)
    seen_auth: list[str | None] = field(default_factory=list)
    seen_paths: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.seen_auth.append(self.headers.get("Authorization"))
        fake.seen_paths.append(self.path)
        route = fake.routes.get(self.path, Route(404, b'{"detail":"Not Found"}', "application/json"))
        if route.delay:
            time.sleep(route.delay)
        key = route.require_key
        if key is not None and self.headers.get("Authorization") != f"Bearer {key}":
            route = Route(401, b'{"error":{"code":401,"message":"Invalid API Key"}}', "application/json")
        try:
            self.send_response(route.status)
            self.send_header("Content-Type", route.content_type)
            if route.content_length:
                self.send_header("Content-Length", str(len(route.body) + route.extra_length))
            self.end_headers()
            if route.drip is None:
                self.wfile.write(route.body)
                return
            for i in range(len(route.body)):
                self.wfile.write(route.body[i : i + 1])
                self.wfile.flush()
                time.sleep(route.drip)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: Fake


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = _Server(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    server.fake = Fake(url=f"http://127.0.0.1:{port}", port=port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def healthy(fake: Fake, metrics: Route | None = None) -> None:
    """A vLLM: its unfiltered /metrics and, when that is the vLLM body, prometheus_client's filtered one."""
    fake.routes["/health"] = Route(200, b"")
    fake.routes["/v1/models"] = Route(200, MODELS, "application/json")
    fake.routes["/metrics"] = metrics or Route(200, VLLM_BODY)
    if metrics is None:
        fake.routes[FILTERED] = Route(200, restricted(VLLM_BODY.decode(), FILTERED.partition("?")[2]))


def make_transport(kind: str) -> KeepAlivePool | httpx.AsyncHTTPTransport:
    return KeepAlivePool() if kind == "keep-alive" else httpx.AsyncHTTPTransport()


# Every case runs through the dashboard's keep-alive pool and through httpx (proxied engines, tests): the
# same answers must give the same sample, word for word.
@pytest.fixture(params=["keep-alive", "httpx"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return request.param


async def poll(fake: Fake, kind: str, api_key: str | None = None, **kwargs: object):
    kwargs.setdefault("timeout", 10.0)  # the fake answers at once, but tests run beside engines on 2 cores
    transport = make_transport(kind)
    try:
        return await poll_engine(transport, EngineTarget("e1", fake.url, api_key), **kwargs)
    finally:
        await transport.aclose()


async def test_healthy_engine_gives_model_and_reading(fake: Fake, transport_kind: str) -> None:
    healthy(fake)
    before = time.monotonic()
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"
    assert sample.health_reason is None
    assert sample.model == "Qwen/Qwen3-8B"
    assert sample.metrics_error is None
    assert sample.reading is not None and sample.reading.dialect == "vllm"
    assert sample.reading.running == 7
    assert sample.name == "e1" and sample.url == fake.url
    assert sample.t >= before


async def test_connection_refused(transport_kind: str) -> None:
    port = free_port()  # nothing listens there
    async with contextlib.AsyncExitStack() as stack:
        transport = make_transport(transport_kind)
        stack.push_async_callback(transport.aclose)
        target = EngineTarget("e", f"http://127.0.0.1:{port}")
        down = await poll_engine(transport, target)
        starting = await poll_engine(transport, target, launched_by_us=True)
    assert down.health == "down"
    assert down.health_reason == f"connection refused at 127.0.0.1:{port} — is the engine running?"
    assert down.reading is None and down.model is None
    assert starting.health == "starting"  # vLLM refuses connections until its model is loaded
    assert f"127.0.0.1:{port}" in starting.health_reason


async def test_health_timeout(fake: Fake, transport_kind: str) -> None:
    healthy(fake)
    fake.routes["/health"] = Route(200, b"", delay=5.0)
    began = time.monotonic()
    sample = await poll(fake, transport_kind, timeout=0.3)
    assert time.monotonic() - began < 4.0  # gave up long before the server answered
    assert sample.health == "down"
    assert sample.health_reason == f"no answer within 0.3s from 127.0.0.1:{fake.port}/health"


async def test_a_gateways_slow_health_with_its_model_list_is_up_and_said(fake: Fake,
                                                                        transport_kind: str) -> None:
    """A gateway (LiteLLM's /health asks every model behind it): no engine's /metrics, its model list at once:
    up, with its slow /health said; an engine whose /health hangs stays down (test_health_timeout)."""
    healthy(fake)
    del fake.routes["/metrics"], fake.routes[FILTERED]
    fake.routes["/health"] = Route(200, b"", delay=5.0)
    sample = await poll(fake, transport_kind, timeout=0.3)
    assert sample.health == "up" and sample.model == "Qwen/Qwen3-8B"
    assert sample.health_reason == ("/health is slow (a gateway's asks every model behind it): no answer "
                                    f"within 0.3s from 127.0.0.1:{fake.port}/health")


async def test_metrics_slow_drip_hits_the_total_deadline(fake: Fake, transport_kind: str) -> None:
    # Each byte arrives well within a read timeout, but the whole body would take minutes.
    healthy(fake, Route(200, VLLM_BODY[:2000], drip=0.05))
    sample = await poll(fake, transport_kind, timeout=0.5)
    assert sample.health == "up"
    assert sample.reading is None
    assert sample.metrics_error == f"no answer within 0.5s from 127.0.0.1:{fake.port}/metrics"


async def test_llama_server_loading(fake: Fake, transport_kind: str) -> None:
    for path in ("/health", "/v1/models", "/metrics"):
        fake.routes[path] = Route(503, LLAMA_LOADING, "application/json")
    sample = await poll(fake, transport_kind)
    assert sample.health == "loading"
    assert sample.health_reason == "loading model"
    assert sample.reading is None


async def test_health_503_means_dead_unless_we_are_starting_it(fake: Fake, transport_kind: str) -> None:
    fake.routes["/health"] = Route(503, b"")
    assert (await poll(fake, transport_kind)).health == "down"
    sample = await poll(fake, transport_kind, launched_by_us=True)
    assert sample.health == "starting"
    assert sample.health_reason == f"127.0.0.1:{fake.port}/health answered HTTP 503"


async def test_health_500_quotes_the_error(fake: Fake, transport_kind: str) -> None:
    fake.routes["/health"] = Route(500, b'{"error":{"message":"engine core died"}}', "application/json")
    sample = await poll(fake, transport_kind)
    assert sample.health == "down"
    assert sample.health_reason == f"127.0.0.1:{fake.port}/health answered HTTP 500: engine core died"


async def test_no_health_route_but_metrics_answer(fake: Fake, transport_kind: str) -> None:
    healthy(fake)
    del fake.routes["/health"]
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"
    assert sample.reading is not None


NO_METRICS_404 = ("this server publishes no Prometheus metrics at /metrics: its figures come from "
                  "enginetop's proxy (--proxy-listen) and probes")


async def test_sglang_without_its_metrics_gets_the_hint_written_for_it(fake: Fake,
                                                                      transport_kind: str) -> None:
    """The hint that names SGLang's flag only where its own route says it is SGLang (/get_model_info); any
    other server's 404 names no engine's flag."""
    healthy(fake)
    del fake.routes["/metrics"], fake.routes[FILTERED]
    fake.routes["/get_model_info"] = Route(200, b'{"model_path": "Qwen/Qwen3-8B", "is_generation": true}',
                                           "application/json")
    sample = await poll(fake, transport_kind)
    assert sample.metrics_error == NO_METRICS_404 + ": SGLang serves them with --enable-metrics"
    del fake.routes["/get_model_info"]
    sample = await poll(fake, transport_kind)
    assert sample.metrics_error == NO_METRICS_404 and "SGLang" not in sample.metrics_error


async def test_nothing_answers_but_404(fake: Fake, transport_kind: str) -> None:
    sample = await poll(fake, transport_kind)
    assert sample.health == "down"
    assert "no /health endpoint" in sample.health_reason
    assert sample.metrics_error == NO_METRICS_404


async def test_unauthorized_without_and_with_wrong_key(fake: Fake, transport_kind: str) -> None:
    healthy(fake)
    fake.routes["/metrics"].require_key = "right-key"
    fake.routes["/v1/models"].require_key = "right-key"
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"  # /health is public on every engine
    assert sample.metrics_error == NEEDS_KEY
    assert sample.model is None

    wrong = "wrong-key-s3cr3t"
    sample = await poll(fake, transport_kind, api_key=wrong)
    assert sample.metrics_error.startswith("unauthorized: the engine refused this API key")
    assert wrong not in repr(sample)
    assert f"Bearer {wrong}" in fake.seen_auth

    sample = await poll(fake, transport_kind, api_key="right-key")
    assert sample.metrics_error is None
    assert sample.model == "Qwen/Qwen3-8B"


async def test_api_key_never_in_repr_or_str() -> None:
    target = EngineTarget("e", "http://127.0.0.1:1", "sk-very-secret")
    assert "sk-very-secret" not in repr(target)
    assert "sk-very-secret" not in str(target)
    assert target.api_key == "sk-very-secret"


async def test_api_key_that_cannot_be_a_header_is_refused_without_quoting_it(fake: Fake,
                                                                              transport_kind: str) -> None:
    healthy(fake)
    sample = await poll(fake, transport_kind, api_key="line\nbreak-secret")
    assert sample.health == "down"
    assert "break-secret" not in repr(sample)
    assert "cannot carry" in sample.health_reason
    assert fake.seen_auth == []  # nothing was sent


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (Route(404, b"Not Found"), NO_METRICS_404),
        (
            Route(501, b'{"error":{"code":501,"message":"This server does not support metrics endpoint. '
                  b'Start it with `--metrics`","type":"not_supported_error"}}', "application/json"),
            "metrics disabled: start llama-server with --metrics",
        ),
        (Route(500, b'{"error":{"message":"boom"}}', "application/json"), "/metrics answered HTTP 500: boom"),
        (Route(502, b"<html>\n<h1>Bad   Gateway</h1>\n</html>", "text/html"),
         "/metrics answered HTTP 502: <html> <h1>Bad Gateway</h1> </html>"),
    ],
)
async def test_metrics_status_messages(fake: Fake, route: Route, message: str, transport_kind: str) -> None:
    healthy(fake, route)
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"
    assert sample.reading is None
    assert sample.metrics_error == message


@pytest.mark.parametrize("content_length", [True, False])
async def test_metrics_body_over_the_cap(fake: Fake, content_length: bool, transport_kind: str) -> None:
    healthy(fake, Route(200, VLLM_BODY, content_length=content_length))
    sample = await poll(fake, transport_kind, max_body=64 * 1024)
    assert sample.reading is None
    assert sample.metrics_error == "/metrics body is larger than the 0.0625 MiB limit; not read"
    sample = await poll(fake, transport_kind, max_body=len(VLLM_BODY))  # exactly at the cap is fine
    assert sample.reading is not None


async def test_malformed_metrics(fake: Fake, transport_kind: str) -> None:
    healthy(fake, Route(200, b"vllm:num_requests_running 1\nvllm:num_requests_waiting{x=1} 2\n"))
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"
    assert sample.reading is None
    assert sample.metrics_error == (
        "malformed /metrics at family 2 (after vllm:num_requests_running): Invalid labels: x=1"
    )


async def test_nan_in_metrics_is_none_not_an_error(fake: Fake, transport_kind: str) -> None:
    healthy(fake, Route(200, b"vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\n"))
    sample = await poll(fake, transport_kind)
    assert sample.metrics_error is None
    assert sample.reading.running is None
    assert sample.reading.waiting == 2


async def test_invalid_url_does_not_raise(transport_kind: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        transport = make_transport(transport_kind)
        stack.push_async_callback(transport.aclose)
        sample = await poll_engine(transport, EngineTarget("e", "127.0.0.1:8000"))
    assert sample.health == "down"
    assert sample.health_reason.startswith("invalid engine URL")


async def test_server_closing_mid_response(fake: Fake, transport_kind: str) -> None:
    healthy(fake, Route(200, VLLM_BODY[:5000], extra_length=1000))  # promises 1000 bytes it never sends
    sample = await poll(fake, transport_kind)
    assert sample.health == "up"
    assert sample.reading is None
    assert sample.metrics_error.startswith(
        f"127.0.0.1:{fake.port}/metrics closed the connection or sent a malformed response: "
    )


# ---- EngineSource: the one poller of the dashboard's columns and of `enginetop record` -------------------
async def test_engine_source_asks_models_and_health_only_now_and_then(fake: Fake) -> None:
    healthy(fake)
    transports = Transports()
    source = EngineSource(EngineTarget("e1", fake.url), transports, interval_s=1.0)
    try:
        for _ in range(4):
            [sample] = await source.read()
            assert sample.health == "up" and sample.model == "Qwen/Qwen3-8B"
    finally:
        await transports.aclose()
    # 4 polls: /health and /v1/models once (then every 5 s and 30 s), /metrics every time; and the
    # configuration once (then every minute, or when the engine restarts): cache_config_info asked at
    # /metrics/ (this server does not filter, so /metrics after it), /v1/models and /version
    assert len(fake.seen_auth) == 6 + 4
    assert sample.config is not None and sample.config.engine == "vLLM"


async def read_n(source: EngineSource, n: int) -> list:
    samples = []
    for _ in range(n):
        [sample] = await source.read()
        samples.append(sample)
    return samples


async def test_engine_source_asks_a_vllm_for_the_series_it_reads_alone(fake: Fake) -> None:
    healthy(fake)
    transports = Transports()
    try:
        samples = await read_n(EngineSource(EngineTarget("e1", fake.url), transports, read_config=False), 3)
    finally:
        await transports.aclose()
    # the first poll finds a vLLM on the plain path; the next ones get ~90 lines instead of 3,012
    assert fake.seen_paths == ["/health", "/v1/models", "/metrics", FILTERED, FILTERED]
    assert len(fake.routes[FILTERED].body) < len(VLLM_BODY) / 10
    assert all(s.metrics_error is None for s in samples)
    assert samples[1].reading == samples[2].reading == samples[0].reading


@pytest.mark.parametrize("filtered", [Route(404, b'{"detail":"Not Found"}', "application/json"),
                                      Route(200, b"<html>a page of the user's</html>", "text/html"),
                                      Route(200, (DATA / "llamacpp.txt").read_bytes())],
                         ids=["404", "not-metrics", "another-engine"])
async def test_engine_source_asks_the_plain_path_when_the_filtered_one_does_not_give_vllm(
        fake: Fake, filtered: Route) -> None:
    healthy(fake)
    fake.routes[FILTERED] = filtered
    transports = Transports()
    try:
        samples = await read_n(EngineSource(EngineTarget("e1", fake.url), transports, read_config=False), 4)
    finally:
        await transports.aclose()
    # asked once, then never again; the poll that asked it still reads /metrics
    assert fake.seen_paths == ["/health", "/v1/models", "/metrics", FILTERED] + ["/metrics"] * 3
    assert all(s.metrics_error is None and s.reading is not None for s in samples)
    assert len({s.reading for s in samples}) == 1


@pytest.mark.parametrize("status", [401, 503])
async def test_engine_source_asks_the_filtered_path_again_after_an_answer_any_path_would_get(
        fake: Fake, status: int) -> None:
    healthy(fake)
    answer = fake.routes[FILTERED]
    fake.routes[FILTERED] = Route(status, b'{"error":{"message":"try again"}}', "application/json")
    transports = Transports()
    try:
        source = EngineSource(EngineTarget("e1", fake.url), transports, read_config=False)
        _, refused = await read_n(source, 2)
        fake.routes[FILTERED] = answer
        [after] = await source.read()
    finally:
        await transports.aclose()
    assert refused.reading is not None  # that poll still read the plain path
    assert fake.seen_paths[3:] == [FILTERED, "/metrics", FILTERED]
    assert source.filtering and after.reading == refused.reading


async def test_engine_source_asks_the_filtered_path_again_after_a_timeout(fake: Fake) -> None:
    healthy(fake)
    answer = fake.routes[FILTERED]
    fake.routes[FILTERED] = Route(200, answer.body, delay=1.0)
    transports = Transports()
    try:
        source = EngineSource(EngineTarget("e1", fake.url), transports, timeout_s=0.3, read_config=False)
        _, slow = await read_n(source, 2)
        fake.routes[FILTERED] = answer
        _, after = await read_n(source, 2)  # the poll after any trouble asks /health and the plain path
    finally:
        await transports.aclose()
    # a slow engine is not a path that cannot filter: the error names the path, without the query
    assert slow.metrics_error == f"no answer within 0.3s from 127.0.0.1:{fake.port}/metrics/"
    assert fake.seen_paths[-1] == FILTERED and after.metrics_error is None and after.reading is not None


async def test_engine_source_drops_the_answer_of_an_engine_switched_away_meanwhile(fake: Fake) -> None:
    import asyncio

    healthy(fake, Route(200, VLLM_BODY, delay=0.5))
    transports = Transports()
    source = EngineSource(EngineTarget("old", fake.url), transports, interval_s=1.0, read_config=False)
    try:
        reading = asyncio.create_task(source.read())
        await asyncio.sleep(0.2)
        source.target = EngineTarget("new", fake.url)
        assert await reading == []  # the old engine's answer must not land in the new column
        [sample] = await source.read()
        assert sample.name == "new"
    finally:
        await transports.aclose()


def test_local_pids_finds_who_listens_on_a_loopback_engine_and_skips_remote_ones(fake: Fake) -> None:
    import os

    from tui.sources.engine_source import LocalPids

    pids = LocalPids([EngineTarget("here", fake.url), EngineTarget("far", "http://10.9.9.9:8000")])
    assert list(pids.watched) == ["here"]
    assert pids() == {"here": os.getpid()}  # the fake server runs in this process


async def test_the_configuration_is_read_again_when_the_engine_restarts(fake: Fake) -> None:
    """Read at the first poll, not again while the engine runs on, and again once its counters went back (a
    restart: what it is set to may have changed with it)."""
    healthy(fake)
    fake.routes["/version"] = Route(200, b'{"version": "0.33.0"}', "application/json")
    transports = Transports()
    source = EngineSource(EngineTarget("e1", fake.url), transports, interval_s=1.0)
    try:
        [first] = await source.read()
        [second] = await source.read()
        assert fake.seen_paths.count("/version") == 1
        assert first.config is not None and second.config is first.config and first.config.version == "0.33.0"
        restarted = re.sub(rb"(?m)^(vllm:generation_tokens_total\{[^}]*\}) [0-9.e+]+$", rb"\1 1.0", VLLM_BODY)
        assert restarted != VLLM_BODY
        fake.routes["/metrics"] = Route(200, restarted)
        fake.routes[FILTERED] = Route(200, restricted(restarted.decode(), FILTERED.partition("?")[2]))
        fake.routes["/version"] = Route(200, b'{"version": "0.33.1"}', "application/json")
        [third] = await source.read()
    finally:
        await transports.aclose()
    assert fake.seen_paths.count("/version") == 2 and third.config.version == "0.33.1"
