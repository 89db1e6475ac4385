"""The dashboard's own cost: 4 engines polled at 1 Hz, NVML at 1 Hz, default redraw rate, 60 s.

Engines: one real llama-server (the demo model) and three loopback servers that answer /health,
/v1/models and a ~3,000-line vLLM /metrics body (the heaviest parse). The app runs headless in a
child process; its CPU time and RSS are read from outside with psutil.

    .venv/bin/python bench/bench_app.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.engines.llamacpp import demo_argv  # noqa: E402
from tui.lifecycle.process import free_port, launch, stop_group  # noqa: E402
from tui.paths import runs_dir  # noqa: E402

VLLM_BODY = next((ROOT / "tests/data/metrics").glob("vllm_0_33*.txt")).read_bytes()
VLLM_LINES = VLLM_BODY.count(b"\n")


class FakeVllm(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"/health": b"", "/v1/models": b'{"object":"list","data":[{"id":"bench-model"}]}',
                "/metrics": VLLM_BODY}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def wait_http(url: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not up")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()

    port = free_port()
    llama = launch(demo_argv(port, "--threads", "1"), runs_dir() / f"bench-app-{port}.log")
    servers = []
    engines = [f"llama=http://127.0.0.1:{port}"]
    for i in range(3):
        server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        engines.append(f"vllm{i}=http://127.0.0.1:{server.server_address[1]}")
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        argv = [sys.executable, str(ROOT / "bench/app_under_test.py")]
        for e in engines:
            argv += ["--engine", e]
        app = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        proc = psutil.Process(app.pid)
        time.sleep(5)  # start-up (imports, first layout) is not the steady state being measured
        if app.poll() is not None:
            raise SystemExit(f"app exited: {app.stderr.read().decode()[-2000:]}")
        c0, t0 = proc.cpu_times(), time.monotonic()
        peak_rss = 0
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1)
            peak_rss = max(peak_rss, proc.memory_info().rss)
        c1, t1 = proc.cpu_times(), time.monotonic()
        cpu = (c1.user + c1.system) - (c0.user + c0.system)
        app.terminate()
        app.wait(10)
        print(f"app CPU over {t1 - t0:.0f} s: {cpu:.2f} s = {100 * cpu / (t1 - t0):.2f}% of one core "
              f"(target < 2%)")
        print(f"app peak RSS: {peak_rss / 2**20:.0f} MiB (target < 150 MB)")
        print(f"engines: 1 real llama-server + 3 loopback vLLM bodies of {VLLM_LINES} lines; "
              f"fake NVML H200 at 1 Hz")
    finally:
        for s in servers:
            s.shutdown()
        stop_group(llama)


if __name__ == "__main__":
    main()
