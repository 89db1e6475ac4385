"""Discovery (tui.sources.discover): the engines on this machine found without flags, from their command lines
or on a usual port, each confirmed by its answer, and nothing else; `enginetop snapshot` with no --engine
watches what it found."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from conftest import start_engine
from waiting import until

from tui.base.defaults import DEFAULT_PORTS
from tui.base.process import free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_argv
from tui.engines.known import serving_program
from tui.sources.discover import (
    DiscoverError,
    FoundEngine,
    _named,
    _url_hosts,
    discover,
    usual_ports,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("argv", "program"), [
    (["/opt/llama.cpp/build/bin/llama-server", "-m", "x.gguf", "--port", "8080"], "llama-server"),
    (["llama-swap", "--config", "swap.yaml", "--listen", ":8080"], "llama-swap"),
    (["/venv/bin/vllm", "serve", "Qwen/Qwen3-8B"], "vLLM"),
    (["/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vLLM"),
    (["python", "-m", "sglang.launch_server", "--model-path", "m"], "SGLang"),
    (["python3", "-m", "http.server", "8000"], None),
    (["ssh", "-L", "8080:gpu-box:8080", "gpu-box"], None),
    (["/usr/bin/docker-proxy", "-host-port", "8000"], None),
])
def test_an_engine_is_told_from_its_command_line(argv: list[str], program: str | None) -> None:
    assert serving_program(argv) == program


def test_the_usual_ports_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert usual_ports({}) == DEFAULT_PORTS == (8080, 8000, 30000, 1234, 11434)
    assert usual_ports({"ENGINETOP_DISCOVER_PORTS": "9000, 9001,9000"}) == (9000, 9001)
    assert usual_ports({"ENGINETOP_DISCOVER_PORTS": ""}) == ()
    with pytest.raises(DiscoverError, match="ENGINETOP_DISCOVER_PORTS"):
        usual_ports({"ENGINETOP_DISCOVER_PORTS": "80a"})


def test_only_loopback_reaches_a_listener() -> None:
    assert _url_hosts("0.0.0.0") == ("127.0.0.1",) and _url_hosts("::ffff:127.0.0.1") == ("127.0.0.1",)
    assert _url_hosts("::") == ("127.0.0.1", "[::1]")  # IPv4 too, unless the socket is IPv6-only
    assert _url_hosts("127.0.0.1") == ("127.0.0.1",) and _url_hosts("::1") == ("[::1]",)
    assert _url_hosts("10.1.2.3") == () and _url_hosts("192.168.0.9") == ()
    assert _url_hosts("fe80::1%eth0") == ()


# An OpenAI-compatible server on an IPv6 address only (IPV6_V6ONLY: `::` takes no IPv4), as `--host ::1` or
# `--host ::` may start one.
V6_SERVER = textwrap.dedent("""
    import http.server, json, socket, sys
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"object": "list", "data": [{"id": "v6-model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    class Server(http.server.HTTPServer):
        address_family = socket.AF_INET6
        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            super().server_bind()
    Server((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
""")


def _ipv6_loopback() -> None:
    """Skip, saying why, only where this machine has no IPv6 loopback to listen on."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python (socket.has_ipv6 is False): a listener on ::1 cannot be started")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"binding ::1 fails here ({exc}): no IPv6 loopback on this machine to test a listener on")


@pytest.mark.parametrize(("bind", "listed"), [("::1", True), ("::", True), ("::1", False)],
                         ids=["on ::1", "on :: IPv6-only", "on ::1, sockets unlisted"])
def test_a_listener_on_ipv6_only_is_found_on_ipv6_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           bind: str, listed: bool) -> None:
    """A real server listening on IPv6 alone (127.0.0.1 refuses) is asked, and found, on [::1]: from the
    socket list, and on a usual port where the sockets cannot be listed (another user's, a container)."""
    _ipv6_loopback()
    port = free_port()
    server = launch([sys.executable, "-c", V6_SERVER, bind, str(port)], tmp_path / "v6.log", cwd=tmp_path)
    try:
        until(lambda: any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                          for c in psutil.net_connections("tcp")), "the IPv6 server listening")
        with pytest.raises(OSError):  # IPv6 only: loopback's IPv4 does not reach it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        if not listed:
            def unlisted(*_a: object, **_k: object) -> None:
                raise psutil.AccessDenied()
            monkeypatch.setattr(psutil, "net_connections", unlisted)
        found = discover(ports=(port,))
        [engine] = [e for e in found.engines if e.port == port]
        assert engine.url == f"http://[::1]:{port}" and engine.name == "v6-model"
        assert engine.how == "usual port"
        assert engine.pid == (server.proc.pid if listed else None)
        if not listed:
            assert found.unreadable is not None and "only the usual ports were asked" in found.unreadable
    finally:
        stop_group(server)


def test_names_say_the_model_or_the_program_and_never_twice() -> None:
    found = _named([
        FoundEngine("", "http://127.0.0.1:8080", 8080, 42, "llama-server", "command line",
                    ("/models/gemma-3-270m-q4_k_m.gguf",)),
        FoundEngine("", "http://127.0.0.1:8081", 8081, 43, "llama-server", "command line",
                    ("/models/gemma-3-270m-q4_k_m.gguf",)),
        FoundEngine("", "http://127.0.0.1:9292", 9292, 44, "llama-swap", "command line", ("a", "b")),
        FoundEngine("", "http://127.0.0.1:11434", 11434, None, "a process whose command line cannot be read",
                    "usual port"),
    ])
    assert [e.name for e in found] == ["gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m:8081", "llama-swap",
                                       "server-11434"]
    assert found[0].words() == "gemma-3-270m-q4_k_m: llama-server pid 42 on :8080, from its command line"
    assert found[2].words().endswith("from its command line, serving 2 models")
    assert "answering as an OpenAI-compatible server on a usual port" in found[3].words()


def test_a_server_that_is_not_openai_compatible_is_not_an_engine(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    server = launch([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                    tmp_path / "http.log", cwd=tmp_path)
    try:
        until(lambda: any(c.laddr and c.laddr.port == port for c in psutil.net_connections("tcp")),
              "the HTTP server listening")
        found = discover(ports=(port,))
        assert all(e.port != port for e in found.engines)
    finally:
        stop_group(server)


def enginetop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, **(env or {})})


def test_snapshot_with_nothing_to_read_says_how_to_go_on() -> None:
    # a clone, its venv not activated: its enginetop is .venv/bin/enginetop (tests/test_install.py)
    proc = enginetop("snapshot", "--no-discover", env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "--no-discover: nothing to read" in proc.stderr
    assert "`.venv/bin/enginetop snapshot --engine NAME=http://HOST:PORT`" in proc.stderr
    assert "or read a fleet: `.venv/bin/enginetop snapshot --prometheus URL`" in proc.stderr
    assert "start the demo: `make demo-llama`" in proc.stderr  # this suite runs in a checkout
    bad = enginetop("snapshot", env={"ENGINETOP_DISCOVER_PORTS": "eighty"})
    assert bad.returncode == 2 and "ENGINETOP_DISCOVER_PORTS" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.engine
def test_finds_real_engines_from_their_command_line_and_on_a_usual_port(llama_server, tmp_path: Path) -> None:
    """The session's llama-server is found from its command line; a llama-server run under another name (its
    command line says nothing) only because its port is listed as usual and it answers /v1/models. Both on
    unusual free ports; `enginetop snapshot` with no --engine reads them both."""
    renamed = tmp_path / "my-openai-server"
    renamed.symlink_to(demo_argv(0)[0])
    other = start_engine("renamed", "my-openai-server",
                         lambda port: [str(renamed), *demo_argv(port, "--threads", "1")[1:]])
    env = {"ENGINETOP_DISCOVER_PORTS": str(other.port)}
    try:
        os.environ.update(env)
        try:
            found = {e.port: e for e in discover().engines}
        finally:
            del os.environ["ENGINETOP_DISCOVER_PORTS"]
        by_line = found[llama_server.port]
        assert (by_line.how, by_line.program, by_line.pid) == ("command line", "llama-server",
                                                               llama_server.launched.proc.pid)
        assert by_line.url == llama_server.url and by_line.name.startswith("gemma-3-270m-q4_k_m")
        assert f"llama-server pid {by_line.pid} on :{llama_server.port}, from its command line" \
            in by_line.words()
        by_port = found[other.port]
        assert (by_port.how, by_port.program, by_port.pid) == ("usual port", "my-openai-server",
                                                               other.launched.proc.pid)
        assert by_port.name != by_line.name  # the same model twice: the second one's port makes it unique

        proc = enginetop("snapshot", "--json", "--interval", "0.2", env=env)
        assert proc.returncode in (0, 3), proc.stderr  # 3: some other engine on this machine was down
        health = {e["url"]: e["health"] for e in json.loads(proc.stdout)["engines"].values()}
        assert health[llama_server.url] == "up" and health[other.url] == "up"
        said = [line for line in proc.stderr.splitlines() if line.startswith("enginetop snapshot: found ")]
        assert any(f"llama-server pid {by_line.pid} on :{llama_server.port}, from its command line" in line
                   for line in said), proc.stderr
        assert any(f"my-openai-server pid {by_port.pid} on :{other.port}, answering as an OpenAI-compatible "
                   "server on a usual port" in line for line in said), proc.stderr
    finally:
        stop_group(other.launched)


@pytest.mark.engine
def test_finds_the_real_vllm_from_its_command_line_on_an_unusual_port(vllm_server) -> None:
    """The session's vLLM (its entrypoint module run by Python, in a Podman container whose port conmon
    holds on a free port no list names) is found from its command line, confirmed by asking it, and named
    after its container."""
    found = {e.port: e for e in discover().engines}
    engine = found[vllm_server.port]
    assert (engine.how, engine.pid) == ("command line", vllm_server.host_pid), engine
    assert engine.program == "vLLM" and engine.url == vllm_server.url
    assert engine.name == vllm_server.container, engine
    assert f"{engine.program} pid {engine.pid} in podman container {vllm_server.container} on " \
        f":{vllm_server.port}, from its command line" in engine.words()


def test_key_flags_name_discovered_engines_by_their_found_name(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.run.targets import TargetError, build_targets, discovered_targets

    found = _named([FoundEngine("", "http://127.0.0.1:8080", 8080, 42, "llama-server", "command line"),
                    FoundEngine("", "http://127.0.0.1:8000", 8000, 43, "vLLM", "command line", ("m",))])
    key_file = tmp_path / "key"
    key_file.write_text("sk-file-1\n")
    monkeypatch.setenv("ENGINETOP_TEST_VLLM_KEY", "sk-env-2")
    # with no --engine, the key flags are not refused before discovery has named the engines
    assert build_targets(None, [f"llama-server={key_file}"], discovering=True) == []
    targets = discovered_targets(found, [f"llama-server={key_file}"], ["m=ENGINETOP_TEST_VLLM_KEY"])
    assert [(t.name, t.api_key) for t in targets] == [("llama-server", "sk-file-1"), ("m", "sk-env-2")]
    assert "sk-" not in repr(targets)
    with pytest.raises(TargetError, match=r"nosuch: neither an --engine given nor an engine found on this "
                                          r"machine \(found: llama-server, m\)"):
        discovered_targets(found, [f"nosuch={key_file}"])
    with pytest.raises(TargetError, match=r"found: none"):
        discovered_targets([], None, ["x=ENGINETOP_TEST_VLLM_KEY"])
    with pytest.raises(TargetError, match="ENGINE_NAME=VALUE"):  # a bare value with two found: whose?
        discovered_targets(found, [str(key_file)])
    [one] = discovered_targets(found[:1], [str(key_file)])  # one found: NAME= may be left out
    assert one.api_key == "sk-file-1"
    with pytest.raises(TargetError, match=r"nosuch \(the --engine names given: e\)"):
        build_targets(["e=http://127.0.0.1:1"], [f"nosuch={key_file}"])


@pytest.mark.engine
def test_a_discovered_engine_behind_a_key_is_given_it_by_its_found_name(tmp_path: Path) -> None:
    """A llama-server with an API key (from its environment: never on a command line) on an unusual port is
    found from its command line; `enginetop snapshot --api-key-file NAME=PATH` with no --engine reads it with
    the key (its /v1/models and /metrics need it), and the key is never printed. A NAME found nowhere is
    refused with the names that were found."""
    key = "sk-discovered-7f3a9"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    keyed = start_engine("keyed", "llama-server", lambda port: demo_argv(port, "--threads", "1"),
                         env={"LLAMA_API_KEY": key}, api_key=key)
    env = {"ENGINETOP_DISCOVER_PORTS": "", "ENGINETOP_TEST_KEY": key}
    try:
        assert key not in " ".join(psutil.Process(keyed.launched.proc.pid).cmdline())
        os.environ["ENGINETOP_DISCOVER_PORTS"] = ""
        try:
            [name] = [e.name for e in discover().engines if e.port == keyed.port]
        finally:
            del os.environ["ENGINETOP_DISCOVER_PORTS"]

        def engine_read(*flags: str) -> dict:
            proc = enginetop("snapshot", "--json", "--interval", "0.3", *flags, env=env)
            assert proc.returncode in (0, 3), proc.stderr
            assert key not in proc.stdout + proc.stderr
            [engine] = [e for e in json.loads(proc.stdout)["engines"].values() if e["url"] == keyed.url]
            return engine

        without = engine_read()
        assert without["health"] == "up" and without["metrics_error"].startswith("unauthorized")
        for flag in (f"--api-key-file={name}={key_file}", f"--api-key-env={name}=ENGINETOP_TEST_KEY"):
            with_key = engine_read(flag)
            assert with_key["metrics_error"] is None and with_key["model"], flag
            assert with_key["generation_tokens_total"] is not None

        refused = enginetop("snapshot", "--api-key-file", f"nosuch={key_file}", env=env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "nosuch: neither an --engine given nor an engine found on this machine (found: " \
            in refused.stderr
        assert name in refused.stderr.rpartition("(found: ")[2]
    finally:
        stop_group(keyed.launched)
