"""Where one poll-and-redraw cycle of the dashboard spends its CPU (issue 51), on vLLM's /metrics and on
llama-server's /slots, in the terminal a user runs it in.

The dashboard runs as a user runs it, its real TUI in a pseudo-terminal of 200×55 (`script`), polling each
second (`--interval 1`, its default) and redrawing every 2 s (its default), for `--seconds`:
- vllm: a loopback server replaying a real vLLM 0.32 CPU /metrics capture (614 lines) whose counters grow
  every second as under traffic (requests finish, tokens flow, histograms fill), answering `/metrics/?name[]=`
  as vLLM's prometheus_client does (tests/prom_filter.py);
- llama: the real llama-server with the demo model, two slots, no --metrics (as llamastat's README starts it),
  under two agents' steady traffic (each pausing 0.5 s between requests), read through /slots;
- vllm-real (only when asked: `--only vllm-real`): the real CPU vLLM of the demo profile under the same two
  agents, its /metrics as they come.
Each is run twice: once plain, its CPU read from outside by the scheduler's own clock (every thread:
the event loop, the samplers' threads, the terminal writer) and its peak RSS; once under cProfile (the event
loop's thread), whose own time per function is summed by the part of the cycle it belongs to. The shares
are of the profiled thread's busy time; cProfile's overhead inflates small calls, so read them as where the
time goes, not as absolute figures (those are the plain run's).

    .venv/bin/python bench/bench_cycle.py [--seconds 60] [--only vllm|llama|vllm-real] [--still] [--no-freeze]
        [--keep DIR]

`--no-freeze`: the dashboard without its freeze of what start-up built (tui.ui.core.AppCore.run), to see
what the freeze saves: Python's full collections then walk every object the process keeps.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from bench.bench_app import cpu_ns, serve  # noqa: E402
from bench.bench_monitors import VLLM_MODEL, Traffic, start_vllm  # noqa: E402
from tests.conftest import start_engine  # noqa: E402
from tests.prom_filter import restricted  # noqa: E402
from tui.base.process import stop_group  # noqa: E402
from tui.engines.install_llamacpp import demo_argv  # noqa: E402

CAPTURE = ROOT / "tests/data/metrics/vllm_cpu_0.32_real.txt"
SIZE = {"COLUMNS": "200", "LINES": "55"}
GROWING = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:_total|_count|_sum|_bucket))(\{[^}]*\})? (\S+)$")
T0 = time.monotonic()
GROW = True  # --still: the capture as it is, every poll (an idle vLLM)
APP_FLAGS: list[str] = []  # passed on to bench/app_under_test.py (--no-freeze)


@functools.lru_cache(maxsize=4)
def grown(second: int) -> str:
    """The capture as it would read `second` seconds into steady traffic: every counter, histogram count,
    sum and bucket grown by the same amount per second (so buckets stay cumulative), the running and
    waiting gauges moving."""
    out = []
    for line in CAPTURE.read_text().splitlines():
        m = GROWING.match(line)
        if m:
            step = 0.35 if m.group(1).endswith("_sum") else 3.0
            line = f"{m.group(1)}{m.group(2) or ''} {float(m.group(3)) + step * second!r}"
        elif line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            name, _, _ = line.rpartition(" ")
            line = f"{name} {float(second % 3)}"
        out.append(line)
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=16)
def answer(second: int, query: str) -> bytes:
    return restricted(grown(second), query) if query else grown(second).encode()


class GrowingVllm(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn does
    disable_nagle_algorithm = True  # as asyncio sets TCP_NODELAY: no 40 ms delayed-ACK stall

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        second = int(time.monotonic() - T0) if GROW else 0
        if path in ("/metrics", "/metrics/"):
            body: bytes | None = answer(second, query if path == "/metrics/" else "")
        else:
            body = {"/health": b"", "/version": b'{"version":"0.32.0"}',
                    "/v1/models": b'{"object":"list","data":[{"id":"bench-model","max_model_len":2048}]}'
                    }.get(path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


# The part of a cycle each function's own time belongs to, by where the function lives (first match wins).
PARTS = [
    ("plotext (charts)", ("site-packages/plotext/", "site-packages/textual_plotext/", "widgets/plots.py")),
    ("parsing the exposition", ("site-packages/prometheus_client/", "tui/sources/metrics.py",
                                "tui/sources/prom")),
    ("HTTP", ("site-packages/httpx/", "site-packages/httpcore/", "site-packages/h11/", "site-packages/anyio/",
              "site-packages/certifi/", "site-packages/idna/", "tui/net/", "socket", "ssl",
              "_socket", "selector_events.py", "streams.py")),
    ("reading the engine (dialects, slots)", ("tui/sources/",)),
    ("store, rates, quantiles", ("tui/live/",)),
    ("findings", ("tui/findings/",)),
    ("building Text (widgets, rich)", ("widgets/", "site-packages/rich/", "tui/ui/")),
    ("Textual (layout, styles, compositor, output)", ("site-packages/textual/",)),
    ("event loop and the rest", ("",)),
]


def part_of(path: str) -> str:
    for name, needles in PARTS:
        if any(n in path for n in needles):
            return name
    return PARTS[-1][0]


def shares(profile: Path) -> tuple[dict[str, float], float, dict[str, list[tuple[float, str]]]]:
    """Seconds of own time per part, the poll wait (epoll) left out; the total; each part's costliest
    functions."""
    stats = pstats.Stats(str(profile))
    parts: dict[str, float] = collections.Counter()
    top: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for (path, line, func), (_cc, _nc, own, _cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "epoll" in func:
            continue  # waiting for the next event: idle, not work
        part = part_of(path if path != "~" else func)
        parts[part] += own
        top[part].append((own, f"{path.rsplit('site-packages/', 1)[-1].replace(str(ROOT) + '/', '')}:{line}"
                                f"({func})"))
    return dict(parts), sum(parts.values()), {k: sorted(v, reverse=True) for k, v in top.items()}


def run_app(engine: str, seconds: float, warmup: float, profile: Path | None, log: Path
            ) -> tuple[float, float, int, dict[int, tuple[int, float]]]:
    """The dashboard in a 200×55 pseudo-terminal: (CPU seconds of all its threads, of its event loop's
    thread, peak RSS, the garbage collector's collections in the window by generation: (count, CPU s))."""
    gc_log = log.with_suffix(".gc")
    argv = [sys.executable, str(ROOT / "bench/app_under_test.py"), "--tty", "--engine", engine, *APP_FLAGS,
            "--gc-log", str(gc_log)]
    if profile is not None:
        argv += ["--profile", str(profile)]
    cmd = ["script", "-qfec", " ".join(argv), "/dev/null"]
    with log.open("wb") as out:
        term = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "TERM": "xterm-256color", **SIZE}, start_new_session=True)
        try:
            time.sleep(warmup)
            apps = [p for p in psutil.Process(term.pid).children(recursive=True) if "python" in p.name()]
            if term.poll() is not None or not apps:
                raise SystemExit(f"the dashboard exited at once: {log.read_text(errors='replace')[-3000:]}")
            app = apps[0]
            if profile is not None:
                app.send_signal(signal.SIGUSR1)  # a profiled app starts its profile now
            before, peak, t0 = cpu_ns(app.pid), 0, time.monotonic()
            while time.monotonic() - t0 < seconds:
                time.sleep(0.5)
                peak = max(peak, app.memory_info().rss)
            after = cpu_ns(app.pid)
            if profile is not None:
                app.send_signal(signal.SIGUSR2)  # the profile ends here: the app's exit is not a cycle either
                time.sleep(0.2)
            app.send_signal(signal.SIGTERM)  # quits as `q` does; a profiled app writes its stats first
            app.wait(60)
        finally:
            if term.poll() is None:
                os.killpg(term.pid, signal.SIGTERM)
            term.wait(30)
    ran = {tid: (ns - before.get(tid, 0)) / 1e9 for tid, ns in after.items()}
    collected: dict[int, tuple[int, float]] = {0: (0, 0.0), 1: (0, 0.0), 2: (0, 0.0)}
    for line in gc_log.read_text().splitlines() if gc_log.exists() else ():
        t, generation, cpu = line.split()
        if t0 <= float(t) <= t0 + seconds:
            n, spent = collected[int(generation)]
            collected[int(generation)] = (n + 1, spent + float(cpu))
    return sum(ran.values()), ran.get(app.pid, 0.0), peak, collected


def report(label: str, engine: str, seconds: float, warmup: float, work: Path, functions: int) -> None:
    cpu, loop, rss, collected = run_app(engine, seconds, warmup, None, work / f"{label}.log")
    print(f"\n== {label}: {engine.split('=', 1)[1]}")
    print(f"  plain: {100 * cpu / seconds:.2f} % of a core ({1000 * cpu / seconds:.1f} ms of CPU a second, "
          f"every thread; {1000 * loop / seconds:.1f} ms the event loop's), peak RSS {rss / 2**20:.0f} MiB, "
          f"over {seconds:.0f} s after {warmup:.0f} s")
    print("  garbage collections in it (their own CPU): " + ", ".join(
        f"generation {g}: {n} ({1000 * spent / seconds:.2f} ms a second)"
        for g, (n, spent) in collected.items()))
    prof = work / f"{label}.prof"
    run_app(engine, seconds, warmup, prof, work / f"{label}-profiled.log")
    parts, total, top = shares(prof)
    print(f"  profiled (the event loop's thread, steady state): {total:.2f} s busy; each part's share:")
    for name, own in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<46} {100 * own / total:5.1f} %  {own:6.2f} s")
        for spent, where in top[name][:functions]:
            print(f"        {100 * spent / total:5.1f} %  {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--only", choices=["vllm", "llama", "vllm-real"], action="append")
    ap.add_argument("--functions", type=int, default=3, help="each part's costliest functions shown")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the profiles and the terminals' logs in this folder (pstats files)")
    ap.add_argument("--still", action="store_true", help="vLLM's counters do not move (an idle engine)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="the dashboard without its freeze of what start-up built (what the freeze saves)")
    args = ap.parse_args()
    global GROW
    GROW = not args.still
    if args.no_freeze:
        APP_FLAGS.append("--no-freeze")
    only = args.only or ["vllm", "llama"]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "vllm" in only:
            server = serve(GrowingVllm)
            try:
                report("vllm", f"vllm=http://127.0.0.1:{server.server_address[1]}", args.seconds,
                       args.warmup, work, args.functions)
            finally:
                server.shutdown()
        if "vllm-real" in only:
            launched, url = start_vllm()
            try:
                with Traffic(url, VLLM_MODEL):
                    report("vllm-real", f"vllm={url}", args.seconds, args.warmup, work, args.functions)
            finally:
                stop_group(launched)
        if "llama" in only:
            engine = start_engine("cycle", "llama-server", lambda port: [
                a for a in demo_argv(port, "--parallel", "2") if a != "--metrics"])
            try:
                with Traffic(engine.url, None):
                    report("llama", f"llama={engine.url}", args.seconds, args.warmup, work, args.functions)
            finally:
                stop_group(engine.launched)


if __name__ == "__main__":
    main()
