"""What `enginetop exporter` and `enginetop web` cost: exporter CPU at idle and per probe, its RSS, /metrics
response time with 50 engines x 4 workloads, and the TTFT the browser view's dashboard adds over the
terminal's.

    .venv/bin/python bench/bench_exporter.py [--sections idle,probe,scrape,web] [--seconds 60]
        [--engine URL]   # a running llama-server for `web` (default: start the demo one here)

Every exporter runs as users run it (`python -m tui exporter ...`, its own process); its CPU is read from
/proc (psutil) between two instants, start-up excluded; RSS is its resident set at the end. Engines for
the exporter sections are the loopback SSE server (tests/sse_server.py) in its own process, streaming
with a per-token delay like a real engine, so what is measured is the exporter, not an engine.

- idle: 4 engines, --probe-every 3600 (nothing due), one scrape every 15 s like a Prometheus.
- probe: 1 engine, workload short (128 tokens, 2 ms apart), --probe-every 1: CPU per probe.
- scrape: 50 engines x 4 workloads (short, long-prefill, agent with 3 turns, thinking-off), every series
  filled by one round of real probes, then 50 timed GETs of /metrics (median, p95) and the body's size.
- web: the dashboard on the real llama-server probing every 2 s, once in a terminal (a pty) and once as
  the process textual-serve starts for a headless Chromium tab; the TTFTs its probes measured, from the
  dashboard's log, compared (median, p90).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pty
import re
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tui.base.process import free_port  # noqa: E402


def sse_server(per_token_delay: float) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.sse_server", "--port", str(port),
                             "--per-token-delay", str(per_token_delay)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("listening")
    return proc, f"http://127.0.0.1:{port}"


class Exporter:
    def __init__(self, engines: list[str], *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        argv = [sys.executable, "-m", "tui", "exporter", "--listen", f"127.0.0.1:{self.port}",
                "--log-level", "ERROR", *[a for e in engines for a in ("--engine", e)], *args]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url, timeout=2)
                break
            except httpx.HTTPError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "exporter did not start"
                time.sleep(0.1)
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def value(self, name: str) -> float:
        total = 0.0
        for line in httpx.get(self.url, timeout=10).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)


def section_idle(seconds: float) -> None:
    server, url = sse_server(0.002)
    exp = Exporter([f"e{i}={url}/s/e{i}" for i in range(4)], "--probe-every", "3600")
    try:
        time.sleep(3)  # past start-up and the first (staggered) probes' set-up
        wall0, cpu0 = time.monotonic(), exp.cpu()
        while time.monotonic() - wall0 < seconds:
            httpx.get(exp.url, timeout=5)
            time.sleep(15)
        wall, cpu = time.monotonic() - wall0, exp.cpu() - cpu0
        rss = exp.ps.memory_info().rss
        print(f"idle: {cpu / wall * 100:.3f} % of a core over {wall:.0f} s (4 engines, a scrape every 15 s; "
              f"target < 0.2 %), RSS {rss / 2**20:.1f} MiB (target < 100)", flush=True)
    finally:
        exp.stop()
        server.terminate()


def section_probe(seconds: float) -> None:
    server, url = sse_server(0.002)
    exp = Exporter([f"sse={url}"], "--probe-every", "1", "--workload", "short")
    try:
        time.sleep(2)
        n0, cpu0, wall0 = exp.value("enginetop_probe_requests_total"), exp.cpu(), time.monotonic()
        time.sleep(seconds)
        n = exp.value("enginetop_probe_requests_total") - n0
        cpu, wall = exp.cpu() - cpu0, time.monotonic() - wall0
        rss = exp.ps.memory_info().rss
        print(f"probe: {n:.0f} probes of 128 tokens in {wall:.0f} s, exporter CPU {cpu / n * 1000:.1f} ms a "
              f"probe (this bench's two scrapes included), {cpu / wall * 100:.2f} % of a core; "
              f"RSS {rss / 2**20:.1f} MiB", flush=True)
    finally:
        exp.stop()
        server.terminate()


def section_scrape() -> None:
    server, url = sse_server(0.0)
    engines = [f"engine{i:02d}={url}/s/e{i}" for i in range(50)]
    exp = Exporter(engines, "--probe-every", "20", "--workload", "short,long-prefill,agent,thinking-off",
                   "--prompt-tokens", "200", "--max-tokens", "16", "--rounds", "1")
    try:
        want = 50 * (1 + 1 + 3 + 1)
        deadline = time.monotonic() + 120
        while exp.value("enginetop_probe_requests_total") < want:
            assert time.monotonic() < deadline, "the 50 x 4 probes did not finish"
            time.sleep(1)
        body = httpx.get(exp.url).text
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        times = []
        with httpx.Client() as client:
            for _ in range(50):
                t0 = time.perf_counter()
                client.get(exp.url).raise_for_status()
                times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        print(f"scrape: 50 engines x 4 workloads = {series} samples, {len(body) / 1024:.0f} KiB: /metrics in "
              f"{statistics.median(times):.1f} ms median, {times[int(0.95 * len(times))]:.1f} ms p95 "
              f"(target < 20 ms); RSS {exp.ps.memory_info().rss / 2**20:.1f} MiB", flush=True)
    finally:
        exp.stop()
        server.terminate()


PROBE_LINE = re.compile(r"probe \S+ \S+: ttft_ms=([0-9.]+)")


def _ttfts(log: Path, since: int) -> list[float]:
    text = log.read_text(errors="replace")[since:] if log.exists() else ""
    return [float(m.group(1)) for m in PROBE_LINE.finditer(text)]


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def web_terminal(args: list[str], seconds: float, log: Path, env: dict[str, str]) -> list[float]:
    since = _log_size(log)
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.environ.update({"TERM": "xterm-256color", **env})
        os.execv(sys.executable, [sys.executable, "-m", "tui", *args])
    # A terminal of the size the browser's tab gets (1600 x 1000 px is about 160 x 50 cells)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))

    def drain(until: float) -> bool:
        """Read what the dashboard draws, as a terminal would (a full pty would block it); False at EOF."""
        while time.monotonic() < until:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    if not os.read(fd, 65536):
                        return False
                except OSError:  # EIO: the child side closed
                    return False
        return True

    drain(time.monotonic() + seconds)
    os.kill(pid, signal.SIGTERM)
    drain(time.monotonic() + 20)  # it restores the terminal on the way out: keep reading until it is gone
    os.waitpid(pid, 0)
    os.close(fd)
    return _ttfts(log, since)


async def _web_tab(args: list[str], seconds: float, env: dict[str, str]) -> None:
    from web_browser import WebView

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tui", "web", "--listen", f"127.0.0.1:{port}", *args],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        async with WebView(f"http://127.0.0.1:{port}/") as view:
            await asyncio.sleep(seconds)
            assert view.frames > 0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(15)


def section_web(engine: str | None, seconds: float) -> None:
    started = None
    if engine is None:
        from conftest import start_llama

        started = start_llama("bench-web", "--parallel", "1", "--threads", "1")
        engine = started.url
    # The dashboards log into a folder of their own: other enginetops here must not add their probes' lines.
    cache = Path(tempfile.mkdtemp(prefix="enginetop-bench-web-"))
    env = {"ENGINETOP_CACHE": str(cache)}
    log = cache / "runs" / "enginetop.log"
    args = ["--engine", f"llama={engine}", "--probe-every", "2", "--probe-max-tokens", "16"]
    try:
        results = {}
        for mode in ("terminal", "web", "terminal", "web"):  # interleaved: drift hits both alike
            if mode == "terminal":
                got = web_terminal(args, seconds / 2, log, env)
            else:
                since = _log_size(log)
                asyncio.run(_web_tab(args, seconds / 2, env))
                got = _ttfts(log, since)
            results.setdefault(mode, []).extend(got)
            print(f"web: {mode} block: {len(got)} probes", flush=True)
        for mode, values in results.items():
            values.sort()
            print(f"web: dashboard in a {mode}: {len(values)} probes, TTFT median "
                  f"{statistics.median(values):.2f} ms, p90 {values[int(0.9 * (len(values) - 1))]:.2f} ms")
        added = statistics.median(results["web"]) - statistics.median(results["terminal"])
        print(f"web: added TTFT of the browser view's dashboard over the terminal's: {added:+.2f} ms "
              "(median)")
    finally:
        if started is not None:
            from tui.base.process import stop_group

            stop_group(started.launched)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="idle,probe,scrape,web")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--engine", default=None, help="a running llama-server for the web section")
    args = parser.parse_args()
    sections = args.sections.split(",")
    if "idle" in sections:
        section_idle(args.seconds)
    if "probe" in sections:
        section_probe(args.seconds / 2)
    if "scrape" in sections:
        section_scrape()
    if "web" in sections:
        section_web(args.engine, args.seconds)


if __name__ == "__main__":
    main()
