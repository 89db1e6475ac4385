"""`make demo-fleet`: the fleet view over a real Prometheus scraping the demo llama-server (real, Gemma 3
270M, job "demo-llama", with a little traffic) and a labelled SYNTHETIC fleet (tests/synthetic_fleet.py:
200 engines on synthetic-node-NN hosts and 52 dcgm-exporter GPUs). Everything runs on loopback and stops
when the view quits.

    .venv/bin/python scripts/demo_fleet.py [--engines 200] [--no-llama]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from prometheus_server import running_prometheus  # noqa: E402
from synthetic_fleet import make_fleet  # noqa: E402

from tui.base.paths import runs_dir  # noqa: E402
from tui.base.process import free_port, launch, stop_group  # noqa: E402
from tui.engines.install_llamacpp import demo_argv  # noqa: E402


def wait_ready(url: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"llama-server at {url} not ready after {timeout:g}s")


def traffic(url: str, stop: threading.Event) -> None:
    """A request now and then, so the real engine's row moves."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
                "max_tokens": 48})
        stop.wait(1.0)


@contextlib.contextmanager
def demo_fleet(engines: int = 200, llama: bool = True,
               interval_s: float = 2.0) -> Iterator[tuple[str, str | None]]:
    """(Prometheus URL, the real llama-server's instance or None) while the demo fleet runs."""
    fleet = make_fleet(engines).spawn()
    launched = None
    stop = threading.Event()
    try:
        jobs: dict[str, list[str]] = {}
        instance = None
        if llama:
            port = free_port()
            launched = launch(demo_argv(port, "--parallel", "2", "--threads", "1"),
                              runs_dir() / f"demo-fleet-llama-{port}.log")
            url = f"http://127.0.0.1:{port}"
            wait_ready(url)
            jobs["demo-llama"] = [f"127.0.0.1:{port}"]
            instance = f"127.0.0.1:{port}"
            threading.Thread(target=traffic, args=(url, stop), daemon=True).start()
        with running_prometheus(jobs, interval_s=interval_s, scrapes=fleet.scrapes(interval_s)) as prom:
            prom.wait_for("up", min_series=engines, timeout=120)
            yield prom.url, instance
    finally:
        stop.set()
        if launched is not None:
            stop_group(launched)
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="the fleet view: real Prometheus, synthetic fleet")
    parser.add_argument("--engines", type=int, default=200, help="synthetic engines (default 200)")
    parser.add_argument("--no-llama", action="store_true",
                        help="no real llama-server, only the synthetic fleet")
    args = parser.parse_args()
    from tui.fleet.options import FleetOptions
    from tui.ui.app import EnginetopApp
    from tui.ui.config import AppConfig

    print(f"starting the demo fleet: a real llama-server, {args.engines} SYNTHETIC engines, "
          "52 SYNTHETIC GPUs, Prometheus…")
    with demo_fleet(args.engines, llama=not args.no_llama) as (url, _):
        app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=url, refresh_s=2.0), horizon_s=1800.0))
        app.run()


if __name__ == "__main__":
    main()
