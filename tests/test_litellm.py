"""LiteLLM's real proxy (`make litellm`) in front of the session's real llama-server, with a master key: an
OpenAI-compatible gateway watched with what it gives and never a hint written for another engine. Without
its key it is said to answer and need one, with the flags that give it; with the key it is up, its model
listed, and its slow /health (it asks every model behind it) does not make it "down"."""

from __future__ import annotations

import json
import os
import secrets
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
LITELLM = Path(os.environ.get("ENGINETOP_CACHE", Path.home() / ".cache" / "enginetop")) / "litellm-venv" / \
    "bin" / "litellm"


@pytest.fixture
def litellm(llama_server, tmp_path: Path) -> Iterator[tuple[str, str]]:
    assert LITELLM.exists(), f"{LITELLM} is missing: `make litellm` installs LiteLLM's proxy"
    key = "sk-" + secrets.token_hex(24)
    config = tmp_path / "litellm.yaml"
    config.write_text(f"model_list:\n  - model_name: gemma\n    litellm_params:\n      model: openai/gemma\n"
                      f"      api_base: {llama_server.url}/v1\n      api_key: none\n"
                      "general_settings:\n  master_key: os.environ/LITELLM_MASTER_KEY\n")
    port = free_port()
    launched = launch([str(LITELLM), "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
                      runs_dir() / f"test-litellm-{port}.log",
                      env={"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert launched.alive() and time.monotonic() < deadline, "\n".join(launched.log_tail(30))
            time.sleep(0.5)
        yield url, key
    finally:
        stop_group(launched)


def _snapshot(url: str, key: str | None) -> tuple[dict, str]:
    args = ["--json", "--engine", f"ll={url}"]
    args += ["--api-key-env", "ll=ENGINETOP_TEST_LL_KEY"] if key else []
    done = subprocess.run([sys.executable, "-m", "tui", "snapshot", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ENGINETOP_TEST_LL_KEY": key or ""})
    assert done.returncode in (0, 3), done.stderr  # 3: an engine is down (tui.cli.options)
    return json.loads(done.stdout)["engines"]["ll"], done.stdout + done.stderr


def test_litellm_watched_with_what_it_gives(litellm: tuple[str, str]) -> None:
    url, key = litellm
    e, said = _snapshot(url, None)
    assert e["health"] == "down" and e["health_reason"] == (
        "unauthorized: it answers, and needs an API key: give it with --api-key-file NAME=PATH or "
        "--api-key-env NAME=VAR"), e
    e, said = _snapshot(url, key)
    assert e["health"] == "up" and e["model"] == "gemma", e
    assert e["metrics_error"].startswith("this server publishes no Prometheus metrics"), e["metrics_error"]
    assert "SGLang" not in said and "--enable-metrics" not in said and "--metrics" not in said
    assert key not in said
