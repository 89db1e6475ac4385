"""What the traffic proxy adds: TTFT on the real llama-server, and CPU per relayed event under load.

    .venv/bin/python bench/bench_proxy.py [--sections ttft,floor,load] [--pairs 40] [--rounds 200]
                                          [--streams 64] [--tokens 200]

TTFT (a): the real llama-server (demo model, --parallel 1, started here) and `enginetop proxy` in front of it
(its own process, as a user runs it), twice: the engine as it comes, and with a core left to the client and
the proxy (see ENGINES). --pairs rounds of three streamed requests in a rotating order: direct, and through
the proxy by a client that keeps its connection (as the OpenAI SDK, aiohttp and benchmark clients do) and by
one that connects for every request (`Connection: close`); the same short prompt every time (so prefill is
the prompt cache's, and the engine's own noise is as small as it gets). llama-server closes its connection
after every stream, so a client of the engine connects for every request either way. TTFT is measured by a
raw-socket client as the time to the first event that carries text. Printed: each path's TTFT p50/p99 and
how often its connection was reused, and for each proxied path the per-round difference's p50/p99 (targets:
p50 <= 1 ms, p99 <= 5 ms) and the same difference with each request's own prefill time taken out (the
engine's `timings.prompt_ms`, which varies by milliseconds from one request to the next whoever sends it):
what the proxy adds, with the engine's noise removed. Printed first: what waking a sleeping process costs
on this machine (a socketpair round trip after 10 ms of quiet against back to back), since a proxy sleeps
between the events of each request and the direct path does not wake it.

Floor: direct, a bare byte pipe, a bare aiohttp relay and a bare uvicorn relay (bench/relay_floor.py) and
`enginetop proxy`, each its own process on uvloop, --rounds rounds in a shuffled order against the loopback
SSE server (no engine noise). Printed: each one's added TTFT over direct: what any Python process in the path
costs on this machine, what an HTTP library costs on top (aiohttp's server, or uvicorn's), and what is the
proxy's own.

Peers (with floor and load): LiteLLM's proxy (PyPI `litellm[proxy]`, installed into its own venv on first
use), configured to pass every request through to the same loopback engine, measured beside the floors and
`enginetop proxy`: its added TTFT, its CPU per relayed event, and each relay's whole process tree's CPU and
peak RSS.

Load (b): a loopback SSE server streaming as fast as it can (tests/sse_server.py, its own process),
--streams concurrent streams of --tokens one-token events each, from an asyncio client reading raw sockets,
direct, then through `enginetop proxy`. Printed: events/s each way and their ratio, and the proxy process's
CPU time per relayed event (goal <= 25 us).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_probe import start_llama, start_server  # noqa: E402
from bench.meter import TreeMeter  # noqa: E402
from bench.tools import ensure_tool  # noqa: E402
from tui.base.paths import cache_dir  # noqa: E402
from tui.base.process import free_port, stop_group  # noqa: E402
from tui.base.stats import quantile  # noqa: E402

# an event with text: llama.cpp writes no space after the colon, the test server one
CONTENT = re.compile(rb'"content": ?"[^"]')


PROMPT_MS = re.compile(rb'"prompt_ms": ?([0-9.]+)')


def start_proxy(upstream: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tui", "proxy", "--engine", f"e={upstream}", "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if " on http://" not in line:
        proc.kill()
        raise SystemExit(f"enginetop proxy did not start: {line!r}")
    return proc, f"http://127.0.0.1:{port}"


# What a peer proxy wants beside the request: LiteLLM its master key (the engines and enginetop's proxy
# ignore it). Every body names the model LiteLLM routes ("gemma"), which the others ignore too.
AUTH: dict[str, str] = {}


def request_bytes(url: str, body: dict, close: bool = True) -> bytes:
    parts = urlsplit(url)
    payload = json.dumps({"model": "gemma", **body}).encode()
    auth = AUTH.get(parts.netloc)
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            + (f"Authorization: Bearer {auth}\r\n" if auth else "")
            + ("Connection: close\r\n" if close else "") + "\r\n").encode() + payload


class Client:
    """A streaming client on a raw socket. `keep`: it keeps its connection between requests, as the OpenAI
    SDK (httpx), aiohttp and every benchmark client do, and, as they do, checks before reusing it that the
    server has not closed it meanwhile (llama-server closes its connection after every stream); otherwise
    it asks `Connection: close` and connects for every request."""

    def __init__(self, url: str, keep: bool) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname, parts.port)
        self.url, self.keep = url, keep
        self.sock: socket.socket | None = None
        self.reused = 0

    def ttft(self, body: dict) -> tuple[float, float | None]:
        """Seconds from sending the request to the first event with text; and the engine's own prefill
        time of the request (llama.cpp's timings.prompt_ms, in seconds), when it sends it."""
        if self.sock is not None and select.select([self.sock], [], [], 0)[0]:
            self.close()  # readable while idle: the server closed it
        if self.sock is None:
            self.sock = socket.create_connection(self.address)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            self.reused += 1
        data = request_bytes(self.url, body, close=not self.keep)
        started = time.perf_counter()
        self.sock.sendall(data)
        seen = b""
        first = None
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                self.close()
                break
            seen += chunk
            if first is None and CONTENT.search(seen):
                first = time.perf_counter() - started
            if seen.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end: the connection stays
                break
        if not self.keep:
            self.close()
        assert first is not None, seen[:300]
        prompt_ms = PROMPT_MS.findall(seen)
        return first, float(prompt_ms[-1]) / 1000 if prompt_ms else None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


# The engine as started for (a): as it comes, and with one of the 2 cores left to the client and the proxy
# and its threads sleeping between batches instead of spinning (llama.cpp --poll 0), as the CPU of a GPU
# server is: there the engine's CPU threads wait on the GPU, not on the proxy's core.
ENGINES = {"as it comes (2 threads, --poll 50: its threads spin on both cores)": (),
           "--threads 1 --poll 0 (a core left to client and proxy)": ("--threads", "1", "--poll", "0")}


def wake_rtt_us(idle_s: float, rounds: int = 300) -> float:
    """Median round trip (us) of one byte to another process and back over a socketpair, each after
    `idle_s` of quiet: with a pause both processes sleep, so it prices waking a sleeping process twice.
    A proxy is such a process: it sleeps between the events of a request (the client's bytes, the upstream
    connection made, the engine's first chunk), and the direct path has none of those wake-ups."""
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo: blocks in recv, as a proxy blocks in epoll
        mine.close()
        while byte := theirs.recv(1):
            theirs.send(byte)
        os._exit(0)
    theirs.close()
    times = []
    try:
        for _ in range(rounds):
            if idle_s:
                time.sleep(idle_s)
            started = time.perf_counter()
            mine.send(b"x")
            mine.recv(1)
            times.append(time.perf_counter() - started)
    finally:
        mine.close()
        os.waitpid(pid, 0)
    return quantile(sorted(times), 0.5) * 1e6


def section_wake() -> None:
    hot, cold = wake_rtt_us(0.0), wake_rtt_us(0.01)
    print("Waking a sleeping process on this machine (a socketpair round trip, median of 300):")
    print(f"  back to back {hot:6.1f} us; after 10 ms of quiet {cold:6.1f} us: "
          f"~{(cold - hot) / 2:.0f} us per wake-up from idle")


def section_ttft(pairs: int, label: str, engine_args: tuple[str, ...]) -> None:
    """Rounds of three requests in a rotating order: direct, and through the proxy by a client that keeps its
    connection and by one that connects every time. The direct client keeps its connection too, which
    llama-server closes after each stream: a client of the engine connects for every request either way."""
    launched, engine = start_llama(*engine_args)
    proxy, via = start_proxy(engine)
    body = {"messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 4, "stream": True,
            "temperature": 0}
    clients = {"direct": Client(engine, keep=True), "proxied, client keeps its connection": Client(via, True),
               "proxied, client connects every time": Client(via, keep=False)}
    times: dict[str, list[tuple[float, float | None]]] = {name: [] for name in clients}
    try:
        for _ in range(3):  # warm the prompt cache and every path
            for client in clients.values():
                client.ttft(body)
        reused = {name: client.reused for name, client in clients.items()}
        names = list(clients)
        for i in range(pairs):
            for name in names[i % 3:] + names[:i % 3]:
                time.sleep(0.01)  # quiet between requests, as between a client's turns
                times[name].append(clients[name].ttft(body))
    finally:
        for client in clients.values():
            client.close()
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(10)
        stop_group(launched)
    ms = 1000.0
    direct = times["direct"]
    print(f"TTFT on the real llama-server {label}, {pairs} rounds (ms):")
    for name, got in times.items():
        t = sorted(x[0] for x in got)
        print(f"  {name:38s} p50 {quantile(t, 0.5) * ms:7.2f}  p99 {quantile(t, 0.99) * ms:7.2f}   "
              f"connection reused {clients[name].reused - reused[name]} of {pairs}")
    for name, got in times.items():
        if name == "direct":
            continue
        pairs_ = list(zip(got, direct, strict=True))
        added = sorted(p[0] - d[0] for p, d in pairs_)
        # what is left of each TTFT once the engine's own prefill of that request is taken out
        beside = sorted((p[0] - (p[1] or 0.0)) - (d[0] - (d[1] or 0.0)) for p, d in pairs_)
        print(f"  added, {name[9:]}: per round p50 {quantile(added, 0.5) * ms:6.2f}  "
              f"p99 {quantile(added, 0.99) * ms:6.2f};  each request's own prefill (timings.prompt_ms) "
              f"taken out p50 {quantile(beside, 0.5) * ms:6.2f}  p99 {quantile(beside, 0.99) * ms:6.2f}"
              "   (targets: p50 <= 1, p99 <= 5)")


async def stream_events(url: str, body: bytes) -> int:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(body)
    events = 0
    while chunk := await reader.read(65536):
        events += len(CONTENT.findall(chunk))
    writer.close()
    return events


async def load(url: str, streams: int, tokens: int) -> tuple[int, float]:
    body = request_bytes(url, {"messages": [{"role": "user", "content": "x"}], "max_tokens": tokens,
                               "stream": True, "stream_options": {"include_usage": True}})
    started = time.perf_counter()
    counts = await asyncio.gather(*(stream_events(url, body) for _ in range(streams)))
    return sum(counts), time.perf_counter() - started


def section_load(streams: int, tokens: int, peers: bool, work: Path) -> None:
    server, upstream = start_server()
    relays = {"enginetop proxy": start_proxy(upstream)}
    if peers:
        relays["LiteLLM proxy"] = start_litellm(upstream, work)
    measured: dict[str, tuple[int, float, float, int]] = {}
    try:
        asyncio.run(load(upstream, 4, 20))
        for _, via in relays.values():
            asyncio.run(load(via, 4, 20))
        d_events, d_s = asyncio.run(load(upstream, streams, tokens))
        for name, (proc, via) in relays.items():
            with TreeMeter(proc.pid) as meter:
                events, seconds = asyncio.run(load(via, streams, tokens))
            measured[name] = (events, seconds, meter.cpu_s, meter.peak)
    finally:
        for proc, _ in relays.values():
            stop_proc(proc)
        server.kill()
    print(f"{streams} concurrent streams x {tokens} events, loopback SSE server at full speed:")
    print(f"  direct   {d_events} events in {d_s:.2f} s = {d_events / d_s:9.0f} events/s")
    for name, (events, seconds, cpu, peak) in measured.items():
        print(f"  {name:16s} {events} events in {seconds:.2f} s = {events / seconds:9.0f} events/s, ratio to "
              f"direct {events / seconds / (d_events / d_s):.2f}; its CPU {cpu:.2f} s = "
              f"{cpu / max(1, events) * 1e6:.1f} us per relayed event, peak RSS {peak / 2**20:.0f} MiB"
              + ("   (goal <= 25 us)" if name == "enginetop proxy" else ""))


LITELLM_VERSION = "1.*"
LITELLM_KEY = "sk-enginetop-bench"  # LiteLLM's proxy refuses to start without a master key


def ensure_litellm() -> Path:
    """LiteLLM's proxy, installed on first use into its own venv (cache_dir()/litellm-venv), never into
    enginetop's."""
    return ensure_tool(cache_dir() / "litellm-venv", f"litellm[proxy]=={LITELLM_VERSION}", "litellm",
                       "minutes, ~760 MB")


def start_litellm(upstream: str, work: Path) -> tuple[subprocess.Popen[str], str]:
    """LiteLLM's proxy passing every request through to `upstream` as an OpenAI-compatible model, offline
    (its model cost map from the package, no telemetry), one worker process."""
    exe = ensure_litellm()
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(f"model_list:\n  - model_name: gemma\n    litellm_params:\n      model: openai/gemma\n"
                      f"      api_base: {upstream}/v1\n      api_key: none\nlitellm_settings:\n"
                      "  telemetry: false\n")
    env = {**os.environ, "LITELLM_MASTER_KEY": LITELLM_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen([str(exe), "--config", str(config), "--port", str(port), "--num_workers", "1"],
                            stdout=(work / "litellm.log").open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"LiteLLM exited: see {work / 'litellm.log'}") from None
            time.sleep(0.5)
    AUTH[f"127.0.0.1:{port}"] = LITELLM_KEY
    return proc, url


def stop_proc(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to a relay (to its whole session when it leads one: LiteLLM's uvicorn workers)."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start_floor(kind: str, upstream: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench/relay_floor.py"), kind, upstream, str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise SystemExit(f"relay_floor.py {kind} did not start")
    return proc, f"http://127.0.0.1:{port}"


def section_floor(rounds: int, peers: bool, work: Path) -> None:
    """Direct, a bare byte pipe, bare aiohttp and uvicorn relays and `enginetop proxy`, in a shuffled order
    each round, 10 ms of quiet before every request (as between a client's requests), against the loopback
    SSE server: what any Python process in the path adds on this machine, what an HTTP library adds, and
    what is the proxy's own (its measuring, accounting and header handling)."""
    server, upstream = start_server()
    floors = {"byte pipe (asyncio streams)": "pipe", "bare aiohttp relay": "aiohttp",
              "bare uvicorn relay (httptools)": "uvicorn"}
    started = {name: start_floor(kind, upstream) for name, kind in floors.items()}
    started["enginetop proxy"] = start_proxy(upstream)
    if peers:
        started["LiteLLM proxy"] = start_litellm(upstream, work)
    meters = {name: TreeMeter(proc.pid).__enter__() for name, (proc, _) in started.items()}
    urls = {"direct": upstream, **{name: url for name, (_, url) in started.items()}}
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True}
    ttft: dict[str, list[float]] = {name: [] for name in urls}
    order = random.Random(0)
    try:
        for i in range(rounds + 5):  # the first 5 rounds warm every path
            names = list(urls)
            order.shuffle(names)
            for name in names:
                time.sleep(0.01)
                first, _ = Client(urls[name], keep=False).ttft(body)
                if i >= 5:
                    ttft[name].append(first)
    finally:
        for meter in meters.values():
            meter.__exit__()
        for proc, _ in started.values():
            stop_proc(proc)
        server.kill()
    ms = 1000.0
    print(f"The floor: TTFT from the loopback SSE server, {rounds} rounds, added over direct per round (ms); "
          "each relay's whole process tree: CPU over the section, peak RSS:")
    for name, times in ttft.items():
        if name == "direct":
            d = sorted(times)
            print(f"  {name:30s} p50 {quantile(d, 0.5) * ms:6.2f}  p99 {quantile(d, 0.99) * ms:6.2f}")
            continue
        added = sorted(t - d for t, d in zip(times, ttft["direct"], strict=True))
        meter = meters[name]
        print(f"  {name:30s} added p50 {quantile(added, 0.5) * ms:6.2f}  "
              f"p99 {quantile(added, 0.99) * ms:6.2f}   CPU {meter.cpu_s:5.2f} s, peak RSS "
              f"{meter.peak / 2**20:5.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="ttft,floor,load,peers",
                        help="ttft, floor, load; peers: LiteLLM's proxy beside enginetop's in floor and load")
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the floor section")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    sections = args.sections.split(",")
    if "ttft" in sections:
        section_wake()
        for label, engine_args in ENGINES.items():
            section_ttft(args.pairs, label, engine_args)
    with tempfile.TemporaryDirectory() as work:
        if "floor" in sections:
            section_floor(args.rounds, "peers" in sections, Path(work))
        if "load" in sections:
            section_load(args.streams, args.tokens, "peers" in sections, Path(work))


if __name__ == "__main__":
    main()
