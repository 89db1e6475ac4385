"""Ollama watched like llama-server and vLLM: the stand-in built from Ollama's source (tests/standins/ollama,
tests/standins/ollama_shapes.md) in front of the real llama-server, which it starts as its runner exactly as
Ollama does. Found by its command line and named Ollama; its loaded model with its quantization, context,
share on the GPU and keep-alive; its configuration from its OLLAMA_* settings and its runner's command line;
the column at 200×55; and no hint written for another engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tui.base.paths import runs_dir
from tui.base.process import Launched, free_port, launch, stop_group

pytestmark = pytest.mark.engine
STANDIN = Path(__file__).parent / "standins" / "ollama"


@dataclass
class RunningOllama:
    url: str
    port: int
    launched: Launched


@pytest.fixture(scope="module")
def ollama() -> Iterator[RunningOllama]:
    """`ollama serve` with two parallel slots of 2,048 tokens and the model loaded (as `ollama run` leaves
    it), on a free port."""
    port = free_port()
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "2048",
           "OLLAMA_KEEP_ALIVE": "10m"}
    launched = launch([sys.executable, str(STANDIN), "serve", "--preload", "--parameter", "num_thread=2"],
                      runs_dir() / f"test-ollama-{port}.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/api/ps", timeout=2).json().get("models"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert launched.alive(), "\n".join(launched.log_tail(30))
            assert time.monotonic() < deadline, "the Ollama stand-in did not load its model in 120 s"
            time.sleep(0.3)
        yield RunningOllama(url, port, launched)
    finally:
        stop_group(launched)


def _snapshot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", "snapshot", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ})


def test_snapshot_reads_its_model_and_settings(ollama: RunningOllama) -> None:
    done = _snapshot("--json", "--engine", f"o={ollama.url}")
    assert done.returncode == 0, done.stderr
    e = json.loads(done.stdout)["engines"]["o"]
    assert e["health"] == "up" and e["model"] == "Ollama: 1 model, 1 loaded", e
    [m] = e["models"]
    assert (m["id"], m["status"], m["quantization"], m["context_tokens"]) == \
        ("gemma3:270m", "loaded", "Q4_K_M", 2048), m
    assert m["vram_bytes"] == 0 and m["size_bytes"] > 100 * 2**20  # on the CPU: all of it in RAM
    assert m["expires_wall"] > time.time() + 60  # a keep-alive of 10 minutes, counting down
    config = e["config"]
    assert config["engine"] == "Ollama" and config["version"]
    assert (config["context_tokens"], config["slots"], config["kv_pool_tokens"]) == (2048, 2, 4096), config
    assert dict(config["published"])["OLLAMA_NUM_PARALLEL"] == "2"
    assert any(s.startswith("argv of its runner (PID ") for s in config["sources"]), config["sources"]
    assert "-np" in config["argv"] or "--parallel" in config["argv"]
    # the model's own facts, from POST /api/show's model_info (the GGUF's): the context it was trained for
    assert (config["train_context"], config["params"]) == (32768, 268098176), config
    assert e["metrics_error"] is None
    table = _snapshot("--engine", f"o={ollama.url}")
    assert table.returncode == 0 and "SGLang" not in table.stdout + table.stderr


def test_found_by_its_command_line_and_named_ollama(ollama: RunningOllama) -> None:
    from tui.sources.discover import discover

    engine = {e.port: e for e in discover().engines}[ollama.port]
    assert (engine.program, engine.how, engine.pid) == ("Ollama", "command line", ollama.launched.pid)
    assert engine.name == "gemma3:270m"
    # its runner (the llama-server it started) is part of it, never an engine of its own
    assert [c.program for c in engine.children] == ["llama-server"], engine.children


async def test_the_column_at_200_by_55(ollama: RunningOllama, tmp_path: Path) -> None:
    from tests.screen import screen_text
    from tests.test_dashboard import make_app, wait_for
    from tui.model.targets import EngineTarget

    app = make_app([EngineTarget("ollama", ollama.url)], tmp_path)
    async with app.run_test(size=(200, 55)) as pilot:
        state = app.store.engines["ollama"]
        await wait_for(pilot, lambda: state.sample is not None and state.sample.router == "ollama",
                       timeout=30, what="Ollama read")
        await wait_for(pilot, lambda: "100% CPU" in screen_text(app), what="its model drawn")
        text = screen_text(app)
        print(text)
        assert re.search(r"Ollama +1 model, 1 loaded", text) and "gemma3:270m" in text
        assert "Q4_K_M" in text and "ctx 2,048" in text and "unloads in" in text
        assert "SGLang" not in text


class _Recording:
    """A relay in front of Ollama that keeps the last line of every answer it passed on unchanged."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.last_line, self.url = upstream, {}, ""

    async def __aenter__(self) -> _Recording:
        from aiohttp import web

        async def relay(request: web.Request) -> web.Response:
            async with httpx.AsyncClient(timeout=120) as client:
                reply = await client.request(request.method, self.upstream + request.path_qs,
                                             content=await request.read())
            lines = [line for line in reply.text.splitlines() if line.strip()]
            if lines and request.path in ("/api/chat", "/api/generate"):
                self.last_line = json.loads(lines[-1])
            return web.Response(status=reply.status_code, body=reply.content,
                                content_type=reply.headers.get("content-type", "").split(";")[0] or None)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", relay)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


async def test_probes_speak_its_native_api_and_a_reload_is_a_finding(ollama: RunningOllama) -> None:
    """A probe's server side is Ollama's own final answer (eval_count / eval_duration); after the model was
    unloaded (keep_alive 0), the next probe's load_duration says it was loaded again: a finding."""
    from tui.live.store import Store
    from tui.model.targets import EngineTarget
    from tui.probe.client import ProbeClient
    from tui.sources.engine_source import read_once

    body = {"messages": [{"role": "user", "content": "Count from one to twenty."}], "max_tokens": 24,
            "temperature": 0}
    async with _Recording(ollama.url) as seen, ProbeClient() as client:
        first = await client.chat(EngineTarget("o", seen.url), body, workload="chat")
        assert first.ok and first.server is not None and first.server.source == "ollama", first.error
        final = seen.last_line  # Ollama's own final answer, as it came over the wire
        assert final["done"] is True and first.completion_tokens == final["eval_count"]
        assert first.server.predicted_per_second == pytest.approx(final["eval_count"] / final["eval_duration"]
                                                                  * 1e9)
        assert first.server_label == "server (Ollama)"
    target = EngineTarget("o", ollama.url)
    async with ProbeClient() as client:
        async with httpx.AsyncClient(timeout=60) as http:  # unload it, as `ollama stop` does
            await http.post(f"{ollama.url}/api/generate", json={"model": "gemma3:270m", "keep_alive": 0})
            deadline = time.monotonic() + 30
            while (await http.get(f"{ollama.url}/api/ps")).json()["models"]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        second = await client.chat(target, body, workload="chat")
    assert second.ok and second.server is not None and (second.server.load_ms or 0) > 100, second.server
    store = Store()
    store.add(await read_once(target))
    for result in (first, second):
        store.add_probe("o", result)
    assert "model-reloaded" in {f.id for f in store.engines["o"].findings}


async def test_the_proxy_reads_each_native_request_as_ollama_answered_it(ollama: RunningOllama,
                                                                          tmp_path: Path) -> None:
    """Ollama publishes no per-request series: enginetop's proxy in front of it reads each answer of its
    native API (streamed NDJSON by default, or one object), finish reasons from done_reason, lengths and
    phases from Ollama's own counts and durations, and relays every byte unchanged."""
    from tui.model.targets import EngineTarget
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions, build_proxy

    proxy = build_proxy(ProxyOptions({"o": Listen("127.0.0.1", free_port())}, key_file=tmp_path / "k"),
                        [EngineTarget("o", ollama.url)])
    await proxy.start()
    via = proxy.routes[0].proxy_url
    said: list[dict] = []
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for n, stream in ((6, True), (9, False), (40, True)):
                body = {"model": "gemma3:270m", "prompt": "The capital of France is", "stream": stream,
                        "options": {"num_predict": n, "temperature": 0}}
                if n == 40:
                    body["options"]["stop"] = [" "]  # ends at its first space: "stop"
                reply = await client.post(f"{via}/api/generate", json=body)
                assert reply.status_code == 200, reply.text
                lines = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
                assert all("done" in line for line in lines)  # relayed line by line, unchanged
                said.append(lines[-1])
        lives = proxy.samples()[0].stats.per_request
    finally:
        await proxy.stop()
    assert lives is not None and lives.origin == "proxy" and lives.ended == 3
    reasons = [s["done_reason"] for s in said]
    assert sorted(reasons) == ["length", "length", "stop"], reasons
    assert dict(lives.finish_window) == {"length": 2.0, "stop": 1.0}
    generated = sum(s["eval_count"] for s in said) / 3
    assert lives.gen_len is not None and lives.gen_len[0] == pytest.approx(generated)
    decode = sorted(s["eval_duration"] / 1e9 for s in said)
    assert lives.decode_s is not None and lives.decode_s[0] == pytest.approx(decode[1])


def test_bench_runs_on_ollama_like_any_engine(ollama: RunningOllama) -> None:
    """A workload replayed on Ollama (its native API: tui.probe.ollama), every request answered."""
    workload = Path(__file__).parent / "data" / "workloads" / "aiperf_multi_turn.jsonl"
    done = subprocess.run([sys.executable, "-m", "tui", "bench", str(workload), "--engine", f"o={ollama.url}",
                           "--concurrency", "1"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert re.search(r"requests ok / sent +5 / 5", done.stdout) and re.search(r"errors +0", done.stdout), \
        done.stdout
