"""The dashboard's own cost: 4 engines polled at 1 Hz, NVML at 1 Hz, default redraw rate, 60 s a run.

Three runs, one after the other:
- typical: two real llama-servers (the demo model) and two loopback servers replaying a real vLLM 0.32
  /metrics capture (614 lines, tests/data/metrics/vllm_cpu_0.32_real.txt);
- heavy: one real llama-server and three loopback servers replaying the 3,012-line vLLM 0.33 body;
- typical again, with the session recorded (tui.record) as the dashboard does unless --no-record.
Loopback servers also answer /health and /v1/models, and /metrics/ as a real vLLM does (prometheus_client's
exposition, honouring the `name[]` filter the poller sends once it has found a vLLM). The app runs headless
in a child process (fake NVML with one H200, since this machine has no GPU); its CPU time and RSS are read
from outside. CPU time is the scheduler's own count (/proc/PID/task/*/schedstat, nanoseconds); the 10 ms
clock-tick figure psutil gives is printed beside it and varies by about ±10 % run to run at these rates.

    .venv/bin/python bench/bench_app.py [--seconds 60] [--warmup 5] [--only typical]
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from tests.conftest import start_llama  # noqa: E402
from tests.prom_filter import restricted  # noqa: E402
from tui.base.process import stop_group  # noqa: E402

DATA = ROOT / "tests/data/metrics"
VLLM_BODY = (DATA / "vllm_0_33.txt").read_bytes()  # what FakeVllm serves; each run sets it


@functools.cache
def filtered(body: bytes, query: str) -> bytes:
    """vLLM's /metrics/ (prometheus_client's exposition, name[] honoured), as the poller asks it."""
    return restricted(body.decode(), query)


class FakeVllm(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn does: a poll reuses its connection

    # uvicorn runs on asyncio, which sets TCP_NODELAY on every TCP connection; without it the body would
    # wait for the client's delayed ACK of the headers (40 ms), which vLLM never makes anyone do
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/metrics/":
            body: bytes | None = filtered(VLLM_BODY, query)
        else:
            body = {"/health": b"", "/v1/models": b'{"object":"list","data":[{"id":"bench-model"}]}',
                    "/metrics": VLLM_BODY}.get(path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A loopback server on a free port, serving in a thread until shut down."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds each thread of `pid` has run (/proc/PID/task/TID/schedstat, the scheduler's own clock).
    psutil's cpu_times counts 10 ms clock ticks: at ~0.6 s of CPU a minute that is ±10 % of the figure
    from sampling alone."""
    runs = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            runs[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return runs


def measure(seconds: float, llamas: int, body: Path, replays: int, record: Path | None = None,
            warmup: float = 5.0, windows: int = 1, profile: Path | None = None
            ) -> tuple[list[tuple[float, float, float]], float, int]:
    """([(CPU s by the scheduler's clock, CPU s in clock ticks, wall s)] for each of `windows` successive
    windows of `seconds`, peak RSS bytes, body lines) of the app watching `llamas` real llama-servers and
    `replays` loopback servers replaying `body`."""
    global VLLM_BODY
    VLLM_BODY = body.read_bytes()
    engines, launched, servers = [], [], []
    try:
        for i in range(llamas):  # ready: /health and a 1-token completion (tests/conftest.py)
            llama = start_llama(f"bench-app-{i}", "--threads", "1")
            launched.append(llama.launched)
            engines.append(f"llama{i}={llama.url}")
        for i in range(replays):
            server = serve(FakeVllm)
            servers.append(server)
            engines.append(f"vllm{i}=http://127.0.0.1:{server.server_address[1]}")
        argv = [sys.executable, str(ROOT / "bench/app_under_test.py")]
        for e in engines:
            argv += ["--engine", e]
        if record is not None:
            argv += ["--record", str(record)]
        if profile is not None:
            argv += ["--profile", str(profile)]
        app = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        proc = psutil.Process(app.pid)
        # Start-up (imports, first layout) is not the steady state being measured; a warm-up past the plots'
        # horizon (300 s) measures them full.
        time.sleep(warmup)
        if app.poll() is not None:
            raise SystemExit(f"app exited: {app.stderr.read().decode()[-2000:]}")
        # Threads that end during the run would take their time with them: the pool's threads stay.
        peak_rss = 0
        measured = []
        for _ in range(windows):
            before, c0, t0 = cpu_ns(app.pid), proc.cpu_times(), time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(1)
                peak_rss = max(peak_rss, proc.memory_info().rss)
            after, c1, t1 = cpu_ns(app.pid), proc.cpu_times(), time.monotonic()
            ran_ns = sum(ns - before.get(tid, 0) for tid, ns in after.items())
            measured.append((ran_ns / 1e9, (c1.user + c1.system) - (c0.user + c0.system), t1 - t0))
        app.terminate()
        app.wait(60)  # a profiled app writes its stats first
        return measured, peak_rss, VLLM_BODY.count(b"\n")
    finally:
        for s in servers:
            s.shutdown()
        for engine in launched:
            stop_group(engine)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=5,
                        help="seconds before measuring; over 300 the plots hold their whole horizon")
    parser.add_argument("--only", choices=["typical", "heavy", "recording"], action="append")
    parser.add_argument("--windows", type=int, default=1,
                        help="successive measuring windows of --seconds in one app run; the median is given")
    parser.add_argument("--profile", type=Path, default=None,
                        help="cProfile the app (its stats to this file; its CPU is then not representative)")
    args = parser.parse_args()
    typical = DATA / "vllm_cpu_0.32_real.txt"
    runs = [("typical", 2, typical, 2, False), ("heavy", 1, DATA / "vllm_0_33.txt", 3, False),
            ("typical, recording on (the dashboard's default)", 2, typical, 2, True)]
    if args.only:
        runs = [r for r, key in zip(runs, ("typical", "heavy", "recording"), strict=True) if key in args.only]
    for label, llamas, body, replays, record in runs:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bench.enginetop.sqlite" if record else None
            measured, rss, lines = measure(args.seconds, llamas, body, replays, out, args.warmup,
                                           args.windows, args.profile)
        print(f"{label}: {llamas} real llama-server(s) + {replays} replays of a {lines}-line vLLM /metrics, "
              f"NVML (fake H200) 1 Hz, redraw every 2 s (the default), measured after {args.warmup:g} s")
        for cpu, ticks, wall in measured:
            share = 100 * cpu / wall
            print(f"  app CPU over {wall:.0f} s: {cpu:.3f} s = {share:.2f}% of one core (target < 1% "
                  f"typical); in 10 ms clock ticks {ticks:.2f} s = {100 * ticks / wall:.2f}%")
        if len(measured) > 1:
            shares = sorted(100 * cpu / wall for cpu, _, wall in measured)
            print(f"  median of {len(shares)} windows: {shares[len(shares) // 2]:.2f}% of one core")
        print(f"  app peak RSS: {rss / 2**20:.0f} MiB (target < 150 MB)")


if __name__ == "__main__":
    main()
