"""One HTTP policy for every client (tui.net.policy): proxies, URL credentials, secrets through proxies.

The engines and the proxy here are real HTTP servers; the "remote" engine is this machine's own
non-loopback address (a proxy is never used for loopback, by policy).
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import psutil
import pytest

from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.net.policy import InsecureSecret, check_secret_transport, proxy_for, public_url
from tui.run.targets import TargetError, build_targets, parse_engine_spec
from tui.sources.engine import poll_engine

LLAMA_BODY = b"""# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 10
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 20
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def local_address() -> str:
    """An IPv4 address of this machine that is not loopback (eth0's, typically)."""
    for addrs in psutil.net_if_addrs().values():
        for snic in addrs:
            if snic.family.name == "AF_INET" and not snic.address.startswith("127."):
                return snic.address
    raise AssertionError("this machine has no non-loopback IPv4 address to stand in for a remote engine")


@dataclass
class Seen:
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path or absolute URL, auth)


class _Engine(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.seen.requests.append((self.path, self.headers.get("Authorization")))
        body, ctype = {
            "/health": (b"", "text/plain"),
            "/v1/models": (json.dumps({"data": [{"id": "m"}]}).encode(), "application/json"),
            "/metrics": (LLAMA_BODY, "text/plain; version=0.0.4"),
        }.get(self.path, (b'{"detail":"Not Found"}', "application/json"))
        self.send_response(200 if self.path in ("/health", "/v1/models", "/metrics") else 404)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: absolute-form request line in, the same request out."""

    server: _Server

    def do_GET(self) -> None:
        self.server.seen.requests.append((self.path, self.headers.get("Authorization")))
        target = urlsplit(self.path)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "host")}
        conn.request("GET", target.path or "/", headers=headers)
        reply = conn.getresponse()
        body = reply.read()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.getheader("Content-Type") or "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    seen: Seen


def _serve(handler: type[BaseHTTPRequestHandler], host: str) -> tuple[_Server, threading.Thread]:
    server = _Server((host, 0), handler)
    server.seen = Seen()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@dataclass
class Net:
    engine_port: int
    engine: Seen
    proxy_url: str
    proxy: Seen
    remote: str  # http://<this machine's LAN address>:<engine port>


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch) -> Iterator[Net]:
    engine, engine_thread = _serve(_Engine, "0.0.0.0")
    proxy, proxy_thread = _serve(_Proxy, "127.0.0.1")
    port = engine.server_address[1]
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                "all_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    try:
        yield Net(port, engine.seen, proxy_url, proxy.seen, f"http://{local_address()}:{port}")
    finally:
        for server, thread in ((engine, engine_thread), (proxy, proxy_thread)):
            server.shutdown()
            server.server_close()
            thread.join(5)


async def poll(target: EngineTarget):
    transports = Transports()
    try:
        return await poll_engine(transports.for_url(target.url), target, timeout=5)
    finally:
        await transports.aclose()


def test_proxy_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "direct.example,.internal")
    assert proxy_for("http://gpu-box:8000") == "http://proxy.example:3128"
    assert proxy_for("https://gpu-box:8000") == "http://tls-proxy.example:3128"
    for direct in ("http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8000",
                   "http://direct.example:80", "http://node.internal:8000"):
        assert proxy_for(direct) is None, direct
    with pytest.raises(InsecureSecret, match=r"clear text through the proxy http://proxy\.example:3128"):
        check_secret_transport("http://gpu-box:8000", has_secret=True)
    check_secret_transport("https://gpu-box:8000", has_secret=True)  # encrypted end to end: fine
    check_secret_transport("http://gpu-box:8000", has_secret=False)
    check_secret_transport("http://127.0.0.1:8000", has_secret=True)  # loopback never goes to the proxy


async def test_poller_goes_through_the_proxy_for_a_remote_engine(net: Net) -> None:
    sample = await poll(EngineTarget("remote", net.remote))
    assert sample.health == "up" and sample.reading is not None
    assert sample.reading.generation_tokens_total == 20
    proxied = [path for path, _ in net.proxy.requests]
    assert f"{net.remote}/metrics" in proxied and f"{net.remote}/health" in proxied


async def test_loopback_engine_is_never_proxied(net: Net) -> None:
    sample = await poll(EngineTarget("local", f"http://127.0.0.1:{net.engine_port}"))
    assert sample.health == "up"
    assert net.proxy.requests == [] and net.engine.requests


async def test_no_proxy_is_honoured(net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", urlsplit(net.remote).hostname)
    sample = await poll(EngineTarget("remote", net.remote))
    assert sample.health == "up"
    assert net.proxy.requests == [] and net.engine.requests


async def test_a_key_is_never_sent_in_clear_through_a_proxy(net: Net) -> None:
    sample = await poll(EngineTarget("remote", net.remote, api_key="sk-very-secret"))
    assert sample.health == "down"
    assert "refusing to send the API key" in sample.health_reason and "NO_PROXY" in sample.health_reason
    assert "sk-very-secret" not in sample.health_reason
    assert net.proxy.requests == [] and net.engine.requests == []


async def test_url_credentials_are_sent_as_basic_auth_and_shown_nowhere(net: Net) -> None:
    [target] = build_targets([f"http://alice:s3cr3t@127.0.0.1:{net.engine_port}"])
    assert target.name == f"127.0.0.1:{net.engine_port}"
    assert target.url == f"http://127.0.0.1:{net.engine_port}"
    assert "s3cr3t" not in repr(target)
    sample = await poll(target)
    assert sample.health == "up" and sample.url == target.url
    expected = "Basic " + base64.b64encode(b"alice:s3cr3t").decode()
    assert {auth for _, auth in net.engine.requests} == {expected}


def test_spec_parsing_keeps_credentials_out_of_names_and_urls() -> None:
    spec = parse_engine_spec("prod=https://bob:hunter2@gpu-box:8443/")
    assert (spec.name, spec.url, spec.basic_auth) == ("prod", "https://gpu-box:8443", ("bob", "hunter2"))
    bare = parse_engine_spec("http://bob:hunter2@10.0.0.5:8000")
    assert bare.name == "10.0.0.5:8000" and "hunter2" not in bare.url
    assert public_url("http://u:p@h:1/x?y=1") == "http://h:1/x?y=1"
    with pytest.raises(TargetError, match="1 to 65535") as bad:
        parse_engine_spec("http://bob:hunter2@127.0.0.1:99999")
    assert "hunter2" not in str(bad.value)


def test_snapshot_and_probe_banner_never_print_url_credentials(net: Net) -> None:
    url = f"http://carol:pa55word@127.0.0.1:{net.engine_port}"
    snap = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--interval", "0.2", "--json",
                           "--engine", url], capture_output=True, text=True, timeout=60)
    assert snap.returncode == 0, snap.stderr
    assert "pa55word" not in snap.stdout + snap.stderr and "carol" not in snap.stdout
    engines = json.loads(snap.stdout)["engines"]
    assert list(engines) == [f"127.0.0.1:{net.engine_port}"]
    probe = subprocess.run([sys.executable, "-m", "tui", "probe", "--engine", url, "--repeat", "1"],
                           capture_output=True, text=True, timeout=60)
    assert "pa55word" not in probe.stdout + probe.stderr
    assert f"(http://127.0.0.1:{net.engine_port})" in probe.stdout  # the banner shows the public URL


def test_probe_with_a_port_out_of_range_answers_with_an_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "tui", "probe", "--engine", "http://127.0.0.1:99999"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "not a valid URL" in proc.stderr and "65535" in proc.stderr
