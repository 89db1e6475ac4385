"""The probe client follows tui.net.policy's one proxy policy, through a real forward proxy on loopback.

Loopback engines are never proxied, so the engine here is addressed by this machine's host name, which
the policy cannot tell is local (it is not a loopback name or address) while it still resolves to this
machine; the SSE server listens on every address so the name reaches it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from sse_server import ForwardProxy, SSEServer, running

from tui.model.targets import EngineTarget
from tui.net.policy import is_loopback_host
from tui.probe.client import ProbeClient
from tui.probe.results import ProbeResult

BODY = {"messages": [{"role": "user", "content": "through the proxy"}], "max_tokens": 6}
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(scope="module")
def engine() -> Iterator[SSEServer]:
    with running(host="0.0.0.0") as server:
        yield server


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForwardProxy]:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    with ForwardProxy() as fwd:
        monkeypatch.setenv("HTTP_PROXY", fwd.url)
        yield fwd


def by_host_name(server: SSEServer) -> str:
    host = socket.gethostname()
    assert not is_loopback_host(host), f"this machine's host name {host!r} is a loopback name: pick another"
    return f"http://{host}:{server.port}/s/ok"


async def probe(url: str, key: str | None = None) -> ProbeResult:
    async with ProbeClient() as client:
        return await client.chat(EngineTarget(name="remote", url=url, api_key=key), BODY)


async def test_a_non_loopback_engine_is_probed_through_the_environment_proxy(
    engine: SSEServer, proxy: ForwardProxy
) -> None:
    url = by_host_name(engine)
    before = len(engine.requests)
    r = await probe(url)
    assert r.ok, r.error
    # the one GET asking whether it is Ollama (tui.probe.ollama), then the probe
    assert [(seen.method, seen.target) for seen in proxy.requests] == [("GET", url + "/api/version"),
                                                                       ("POST", url + "/v1/chat/completions")]
    assert proxy.requests[1].headers["connection"] == "close"  # still a fresh connection per request
    assert len(engine.requests) == before + 2
    assert r.completion_tokens == 6 and r.ttft_s is not None and r.connect_s is not None


async def test_a_key_is_never_sent_in_clear_text_through_the_proxy(
    engine: SSEServer, proxy: ForwardProxy
) -> None:
    before = len(engine.requests)
    r = await probe(by_host_name(engine), key="sk-secret-123")
    assert not r.ok and r.status is None and r.sent_at is None
    assert r.error is not None and r.error.startswith("refusing to send the API key / credentials for http://")
    assert f"through the proxy {proxy.url}" in r.error and "NO_PROXY" in r.error
    assert "sk-secret-123" not in r.error
    assert list(proxy.requests) == [] and len(engine.requests) == before  # nothing left this process


async def test_no_proxy_and_loopback_go_direct(
    engine: SSEServer, proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    loopback = await probe(f"http://127.0.0.1:{engine.port}/s/ok", key="sk-secret-123")
    assert loopback.ok, loopback.error
    monkeypatch.setenv("NO_PROXY", socket.gethostname())
    bypassed = await probe(by_host_name(engine), key="sk-secret-123")
    assert bypassed.ok, bypassed.error
    assert list(proxy.requests) == []
