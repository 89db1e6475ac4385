"""LM Studio watched without a wrong hint: the stand-in built from LM Studio's docs
(tests/standins/lmstudio.py, tests/standins/lmstudio_shapes.md) in front of the session's real llama-server.
It answers every unknown path, /health and /metrics among them, with HTTP 200 and an error in JSON, as LM
Studio does: its models come from its own REST API, it is found on its port by that API and named LM Studio,
and nothing says a flag of another engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tui.base.paths import runs_dir
from tui.base.process import free_port, launch, stop_group

pytestmark = pytest.mark.engine
STANDIN = Path(__file__).parent / "standins" / "lmstudio.py"


@pytest.fixture
def lmstudio(llama_server) -> Iterator[tuple[str, int]]:
    port = free_port()
    launched = launch([sys.executable, str(STANDIN), "--port", str(port), "--upstream", llama_server.url,
                       "--model-id", "google/gemma-3-270m"], runs_dir() / f"test-lmstudio-{port}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/api/v0/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert launched.alive() and time.monotonic() < deadline, "\n".join(launched.log_tail(20))
            time.sleep(0.2)
        yield url, port
    finally:
        stop_group(launched)


def test_lm_studio_is_read_from_its_own_api_with_no_wrong_hint(lmstudio: tuple[str, int]) -> None:
    url, port = lmstudio
    env = {**os.environ, "ENGINETOP_DISCOVER_PORTS": str(port)}
    done = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--engine", f"lms={url}"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    e = json.loads(done.stdout)["engines"]["lms"]
    assert e["health"] == "up" and e["model"] == "LM Studio: 1 model, 1 loaded", e
    [m] = e["models"]
    assert (m["id"], m["status"], m["quantization"], m["family"]) == \
        ("google/gemma-3-270m", "loaded", "Q4_K_M", "gemma3"), m
    assert e["metrics_error"] is None and "SGLang" not in done.stdout + done.stderr
    table = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--engine", f"lms={url}"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert table.returncode == 0 and "SGLang" not in table.stdout + table.stderr and "--metrics" not in \
        table.stdout

    # found with no flags on its port (ENGINETOP_DISCOVER_PORTS: its usual 1234 here), by its own API
    found = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json"], capture_output=True,
                           text=True, timeout=60, env=env)
    assert "LM Studio" in found.stderr and f"on :{port}, answering as an OpenAI-compatible server" in \
        found.stderr, found.stderr


async def test_the_proxy_reads_lm_studios_own_stats(lmstudio: tuple[str, int], tmp_path: Path) -> None:
    """Requests to LM Studio's REST API through enginetop's proxy: each answer's `stats` (its own
    time_to_first_token and generation_time) are the request's prefill and decode."""
    from tui.base.process import free_port as port_for
    from tui.model.targets import EngineTarget
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions, build_proxy

    url, _ = lmstudio
    proxy = build_proxy(ProxyOptions({"lms": Listen("127.0.0.1", port_for())}, key_file=tmp_path / "k"),
                        [EngineTarget("lms", url)])
    await proxy.start()
    stats = []
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            for n in (6, 10, 14):
                body = {"model": "google/gemma-3-270m", "max_tokens": n,
                        "messages": [{"role": "user", "content": "Tell a story."}]}
                reply = await client.post(proxy.routes[0].proxy_url + "/api/v0/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                stats.append(reply.json()["stats"])
        lives = proxy.samples()[0].stats.per_request
    finally:
        await proxy.stop()
    assert lives is not None and lives.ended == 3
    assert lives.decode_s is not None and lives.prefill_s is not None
    assert lives.decode_s[0] == pytest.approx(sorted(s["generation_time"] for s in stats)[1])
    assert lives.prefill_s[0] == pytest.approx(sorted(s["time_to_first_token"] for s in stats)[1])
