"""What discovery never takes for an engine of its own (tui.sources.discover_listeners): the child servers of
a llama-server router and of llama-swap, listed under their parent instead; and enginetop's own proxy, told by
its command line and, where that cannot be read, by what it answers. Real engines: a router-mode
llama-server that loads a model, llama-swap (the loopback stand-in of tests/swap_server.py, run under the name
`llama-swap` as its binary is) starting a real llama-server, and a real `enginetop proxy` in front of the
session's llama-server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from test_discover_answers import listening
from waiting import until

from tui.base.paths import runs_dir
from tui.base.process import Launched, free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_model_path, llama_server_binary
from tui.sources.discover import discover
from tui.sources.discover_found import FoundChild

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def child_servers(parent: int) -> list[tuple[int, int]]:
    """(pid, port) of each listening process under `parent`."""
    out = []
    for child in psutil.Process(parent).children(recursive=True):
        try:
            out += [(child.pid, c.laddr.port) for c in child.net_connections("tcp")
                    if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
    return out


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[Launched, int]]:
    """A llama-server in router mode over the demo Gemma under two names (tests/test_router.py's way)."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("gemma-a", "gemma-b"):
        os.symlink(demo_model_path(), models / f"{name}.gguf")
    port = free_port()
    launched = launch([str(llama_server_binary()), "--models-dir", str(models), "--host", "127.0.0.1",
                       "--port", str(port), "--ctx-size", "1024", "--threads", "1"],
                      runs_dir() / f"test-discover-router-{port}.log")
    try:
        until(lambda: answers(f"http://127.0.0.1:{port}"), "the router answering", timeout=60)
        yield launched, port
    finally:
        stop_group(launched)


def test_a_routers_child_is_shown_under_it_not_as_an_engine(router: tuple[Launched, int]) -> None:
    launched, port = router
    url = f"http://127.0.0.1:{port}"
    assert httpx.post(url + "/models/load", json={"model": "gemma-a"}, timeout=10).status_code == 200

    def loaded() -> bool:
        data = httpx.get(url + "/models", timeout=5).json()["data"]
        return any(m["id"] == "gemma-a" and m["status"]["value"] == "loaded" for m in data)

    until(loaded, "gemma-a loaded by the router", timeout=90)
    [(child_pid, child_port)] = until(lambda: child_servers(launched.proc.pid), "the child listening")

    found = {e.port: e for e in discover(ports=()).engines}
    assert child_port not in found, found[child_port]  # never an engine of its own
    engine = found[port]
    assert (engine.program, engine.pid, engine.how) == ("llama-server", launched.proc.pid, "command line")
    assert set(engine.models) >= {"gemma-a", "gemma-b"}
    assert engine.children == (FoundChild(child_pid, child_port, "llama-server", "gemma-a"),)
    assert engine.words().endswith(f"; its child processes: gemma-a (llama-server pid {child_pid} on "
                                   f":{child_port})"), engine.words()

    snapshot = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--interval", "0.2"],
                              capture_output=True, text=True, timeout=90, cwd=REPO,
                              env={**os.environ, "ENGINETOP_DISCOVER_PORTS": ""})
    assert snapshot.returncode in (0, 3), snapshot.stderr
    urls = {e["url"] for e in json.loads(snapshot.stdout)["engines"].values()}
    assert url in urls and f"http://127.0.0.1:{child_port}" not in urls
    assert f"gemma-a (llama-server pid {child_pid} on :{child_port})" in snapshot.stderr


@pytest.fixture
def llama_swap(tmp_path: Path) -> Iterator[tuple[Launched, int]]:
    """llama-swap, as its binary's name shows on its command line: the stand-in (tests/swap_server.py) run
    through a script named `llama-swap`, with the demo Gemma as its model."""
    script = tmp_path / "llama-swap"
    script.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.path.insert(0, {str(REPO)!r})\n"
                      "runpy.run_module('tests.swap_server', run_name='__main__')\n")
    script.chmod(0o755)
    port = free_port()
    upstream = [str(llama_server_binary()), "--host", "127.0.0.1", "--port", "${PORT}", "--ctx-size", "1024",
                "--threads", "1", "-m", str(demo_model_path()), "--alias", "gemma-a"]
    launched = launch([str(script), "--port", str(port), "--models", json.dumps({"gemma-a": upstream}),
                       "--log-dir", str(runs_dir())], runs_dir() / f"test-discover-swap-{port}.log", cwd=REPO)
    try:
        until(lambda: answers(f"http://127.0.0.1:{port}"), "llama-swap answering", timeout=30)
        yield launched, port
    finally:
        # SIGTERM: llama-swap stops its upstreams (each in its own session) before it exits
        kids = psutil.Process(launched.proc.pid).children(recursive=True)
        launched.proc.send_signal(signal.SIGTERM)
        try:
            launched.proc.wait(30)
        finally:
            stop_group(launched)
            for kid in kids:
                if kid.is_running():
                    kid.kill()


def test_llama_swaps_child_is_shown_under_it_not_as_an_engine(llama_swap: tuple[Launched, int]) -> None:
    launched, port = llama_swap
    url = f"http://127.0.0.1:{port}"
    reply = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": "gemma-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert reply.status_code == 200, reply.text  # a request naming the model starts its server
    [(child_pid, child_port)] = child_servers(launched.proc.pid)

    found = {e.port: e for e in discover(ports=()).engines}
    assert child_port not in found, found[child_port]
    engine = found[port]
    assert (engine.program, engine.pid, engine.how) == ("llama-swap", launched.proc.pid, "command line")
    assert engine.children == (FoundChild(child_pid, child_port, "llama-server", "gemma-a"),)


@pytest.mark.parametrize("how", ["python -m tui", "enginetop script"])
@pytest.mark.parametrize("listed", [True, False], ids=["sockets listed", "sockets unlisted"])
def test_enginetops_own_proxy_is_never_an_engine(llama_server, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, how: str, listed: bool
                                                  ) -> None:
    """A real `enginetop proxy` in front of the session's llama-server, on a port discovery asks as usual:
    it relays the engine's /health and /v1/models, and is not found as a second copy of it; from its command
    line, or (its sockets unlisted: another user's, a container's) from what only it answers."""
    script = Path(sys.executable).parent / "enginetop"  # as pip installs it: `enginetop proxy`
    run = [sys.executable, "-m", "tui"] if how == "python -m tui" else [str(script)]
    port = free_port()
    proxy = launch([*run, "proxy", "--engine", f"llama={llama_server.url}", "--listen", f"127.0.0.1:{port}"],
                   tmp_path / "proxy.log", cwd=REPO)
    try:
        until(lambda: listening(port), "the proxy listening", timeout=60)
        relayed = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert relayed["data"][0]["id"]  # it answers as the engine does
        if not listed:
            def unlisted(*_a: object, **_k: object) -> None:
                raise psutil.AccessDenied()
            monkeypatch.setattr(psutil, "net_connections", unlisted)
        found = discover(ports=(port,))
        assert all(e.port != port for e in found.engines), found.report()
        if listed:
            assert any(e.port == llama_server.port for e in found.engines)  # the engine itself is found
    finally:
        stop_group(proxy)
