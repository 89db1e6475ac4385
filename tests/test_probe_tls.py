"""Probes of an https:// engine: the TLS handshake timed apart from TTFT, a certificate the client does not
trust refused in words, and a keyed https:// engine reached through a proxy's CONNECT tunnel.

The certificate is made here with the openssl command; the client is told to trust it by replacing its
TLS context (certifi's bundle, the trust every enginetop client has) with one that trusts this certificate.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_server import ForwardProxy, SSEServer, running

from tui.model.targets import EngineTarget
from tui.net import policy as net
from tui.probe.client import ProbeClient
from tui.probe.results import ProbeResult

BODY = {"messages": [{"role": "user", "content": "over tls"}], "max_tokens": 5}


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=enginetop-test",
         "-addext", f"subjectAltName=IP:127.0.0.1,DNS:{socket.gethostname()}"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.fixture(scope="module")
def engine(cert: tuple[Path, Path]) -> Iterator[SSEServer]:
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(*cert)
    with running(host="0.0.0.0", tls=server_side) as server:
        yield server


@pytest.fixture
def trusted(cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "_ssl_context", ssl.create_default_context(cafile=str(cert[0])))


async def probe(url: str, key: str | None = None) -> ProbeResult:
    async with ProbeClient() as client:
        return await client.chat(EngineTarget(name="tls", url=url, api_key=key), BODY)


async def test_tls_is_timed_apart_from_ttft(engine: SSEServer, trusted: None) -> None:
    before = time.monotonic()
    r = await probe(f"https://127.0.0.1:{engine.port}/s/ok")
    assert r.ok, r.error
    assert r.completion_tokens == 5
    assert r.connect_s is not None and r.tls_s is not None and r.tls_s > 0
    assert r.sent_at is not None and before + r.connect_s + r.tls_s <= r.sent_at  # TTFT starts after both
    assert r.to_json()["tls_s"] == r.tls_s


async def test_an_untrusted_certificate_is_refused_in_words(
    engine: SSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(net, "_ssl_context", None)  # the real default: certifi's bundle
    before = len(engine.requests)
    r = await probe(f"https://127.0.0.1:{engine.port}/s/ok", key="sk-secret-123")
    assert not r.ok and r.sent_at is None and r.status is None
    assert r.error is not None and r.error.startswith("TLS handshake failed:"), r.error
    assert "CERTIFICATE_VERIFY_FAILED" in r.error
    assert len(engine.requests) == before  # nothing was sent


async def test_a_keyed_https_engine_goes_through_the_proxy_tunnel(
    engine: SSEServer, trusted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    url = f"https://{socket.gethostname()}:{engine.port}/s/ok"
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        r = await probe(url, key="sk-secret-123")
    assert r.ok, r.error  # the key travels inside TLS: the proxy sees only the tunnel
    tunnel = f"{socket.gethostname()}:{engine.port}"
    # two tunnels: the GET asking whether it is Ollama (tui.probe.ollama), then the probe
    assert [(p.method, p.target) for p in proxy.requests] == [("CONNECT", tunnel)] * 2
    assert engine.requests[-1].headers["authorization"] == "Bearer sk-secret-123"
    assert r.tls_s is not None and r.connect_s is not None
