"""Refresh screenshots/web-llama.png: `enginetop web` on a real llama-server, in headless Chromium with the
network off, as tests/test_web.py drives it (never written by tests).

    .venv/bin/python scripts/make_web_screenshot.py [--engine URL]   # default: start the demo llama-server

The dashboard probes every 3 s and a little load runs, so the engine column has a model, moving rates
and probe markers when the browser's own rendering is captured.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tui.base.process import free_port, stop_group  # noqa: E402

OUT = ROOT / "screenshots" / "web-llama.png"


async def load(url: str, seconds: float) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
            await client.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Tell a story, part {n}."}], "max_tokens": 64,
                "ignore_eos": True})


async def shoot(engine: str) -> None:
    from web_browser import WebView

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tui", "web", "--listen", f"127.0.0.1:{port}",
                               "--engine", f"llama={engine}", "--probe-every", "3"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
        async with WebView(f"http://127.0.0.1:{port}/", width=1600, height=1000) as view:
            await view.wait_text(lambda t: "gen tok/s" in t, 90, "the engine column")
            await load(engine, 25)
            await view.wait_text(lambda t: "ttft" in t.lower(), 30, "a probe result")
            OUT.parent.mkdir(exist_ok=True)
            await view.screenshot(OUT)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(15)
    print(f"wrote {OUT}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default=None)
    args = parser.parse_args()
    started = None
    engine = args.engine
    if engine is None:
        from conftest import start_llama

        started = start_llama("web-screenshot", "--parallel", "2", "--threads", "2")
        engine = started.url
    try:
        asyncio.run(shoot(engine))
    finally:
        if started is not None:
            stop_group(started.launched)


if __name__ == "__main__":
    main()
