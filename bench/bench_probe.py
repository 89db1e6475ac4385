"""What the probe client costs: CPU per request on the real llama-server, ingest ceiling, TTFT overhead.

    .venv/bin/python bench/bench_probe.py [--sections cpu,ceiling,ttft] [--engine URL]
        [--cpu-requests 20] [--max-tokens 128] [--rounds 3] [--requests 50] [--tokens 20000]

CPU cost: --cpu-requests sequential streamed requests of --max-tokens tokens (ignore_eos) against the real
llama-server (started here with the demo model, --parallel 1, unless --engine names one), sent by (a)
enginetop's ProbeClient on the loop `enginetop probe` runs it on (tui.net.loop: uvloop), (b) a bare
streaming client (http.client, reading SSE lines, json.loads of every event), (c) the ProbeClient on
asyncio's own loop (as the dashboard's probes run, on Textual's) and (d) the same requests through httpx's
async streaming API, taking turns over --rounds. Each
side's figure is the CPU time (time.process_time) of this process while it sends its block, client
set-up included, interpreter start-up excluded; ratios are to (b). Every request gets its own prompt
(a per-run nonce), so no side is served another's cached prompt. Figures are indicative on a shared
machine: another process's load changes how many reads a stream takes, and so what each read costs.

The loopback SSE server (tests/sse_server.py) runs in its own process, so client and server do not share
one interpreter. Ceiling: tokens/s the client ingests with no delay on the server, at 1 and 32 streams
(one token a chunk, the worst case); the CPU share of both processes says which side was the limit.
TTFT overhead: the probe client against a minimal raw-socket client on the same server, interleaved,
median over N requests each (target: under 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from tests.conftest import start_llama as start_demo_llama  # noqa: E402
from tui.base.process import Launched, stop_group  # noqa: E402
from tui.base.stats import median, quantile  # noqa: E402
from tui.net.loop import run_loop  # noqa: E402
from tui.probe.client import CHAT_PATH, ProbeClient  # noqa: E402
from tui.probe.workloads import WorkloadParams, short_body  # noqa: E402


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    api_key: str | None = None


def start_server(*extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.sse_server", "--port", "0", *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"SSE server did not start: {line!r}")
    return proc, line.split()[1]


def body(max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": "bench"}], "max_tokens": max_tokens}


async def ceiling(url: str, streams: int, tokens: int, server: psutil.Process) -> None:
    me = psutil.Process()
    async with ProbeClient() as client:
        await client.chat(Target("sse", url), body(10))  # warm up imports and the first connection
        server.cpu_percent(None)
        me.cpu_percent(None)
        t0 = time.perf_counter()
        target = Target("sse", url)
        results = await asyncio.gather(*(client.chat(target, body(tokens)) for _ in range(streams)))
        wall = time.perf_counter() - t0
        client_cpu, server_cpu = me.cpu_percent(None), server.cpu_percent(None)
    failed = [r.error for r in results if not r.ok]
    total = sum(r.completion_tokens or 0 for r in results if r.ok)
    print(f"ceiling, {streams:>2} stream(s): {total / wall:>9,.0f} tok/s ingested "
          f"({total} tokens in {wall:.2f} s; client CPU {client_cpu:.0f}%, server CPU {server_cpu:.0f}%)"
          + (f"; {len(failed)} failed: {failed[0]}" if failed else ""))


def raw_ttft(host: str, port: int, path: str) -> float:
    """The least a client can do: connect, send, read until the first content delta; timed from the send,
    as the probe client's TTFT is."""
    payload = json.dumps({**body(4), "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload
    with socket.create_connection((host, port)) as sock:
        t0 = time.perf_counter()
        sock.sendall(request)
        seen = b""
        while True:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError("raw client: stream ended before any content")
            seen += data
            if b'"content": "' in seen:
                t1 = time.perf_counter()
                break
        while sock.recv(65536):  # drain, so both clients leave the server in the same state
            pass
    return t1 - t0


async def ttft_overhead(url: str, n: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    path = "/v1/chat/completions"
    probe_ttft: list[float] = []
    raw: list[float] = []
    async with ProbeClient() as client:
        for _ in range(5):  # warm-up, both sides
            await client.chat(Target("sse", url), body(4))
            raw_ttft(host, int(port), path)
        for _ in range(n):  # interleaved, so drift hits both alike
            r = await client.chat(Target("sse", url), body(4))
            if r.ok and r.ttft_s is not None:
                probe_ttft.append(r.ttft_s)
            raw.append(raw_ttft(host, int(port), path))
    p, q = median(probe_ttft), median(raw)
    assert p is not None and q is not None
    print(f"TTFT over {n} requests: probe client median {p * 1000:.3f} ms (p90 "
          f"{quantile(probe_ttft, 0.9) * 1000:.3f}), raw socket median {q * 1000:.3f} ms (p90 "
          f"{quantile(raw, 0.9) * 1000:.3f})")
    print(f"TTFT overhead of the probe client: {(p - q) * 1000:+.3f} ms (target < 1 ms)")


# ---------------------------------------------------------------- CPU cost on the real llama-server

def start_llama(*extra: str) -> tuple[Launched, str]:
    """The demo llama-server with one slot, ready (tests/conftest.py's ready-wait)."""
    engine = start_demo_llama("bench-probe", "--parallel", "1", *extra)
    return engine.launched, engine.url


def bare_request(url: str, body: dict[str, Any]) -> int:
    """The least a streaming client does: one connection, SSE lines, json.loads per event. Events seen."""
    parts = urlsplit(url)
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request("POST", CHAT_PATH, payload, {"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}")
        events = 0
        for line in resp:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                json.loads(line[6:])
                events += 1
        return events
    finally:
        conn.close()


async def probe_block(url: str, bodies: list[dict[str, Any]]) -> list[str]:
    target = Target("llama-server", url)
    async with ProbeClient() as client:
        results = [await client.chat(target, body) for body in bodies]
    expected = bodies[0]["max_tokens"]
    return [r.error or "failed" if not r.ok else f"{r.completion_tokens} tokens" for r in results
            if not r.ok or r.completion_tokens != expected]


async def httpx_block(url: str, bodies: list[dict[str, Any]]) -> list[str]:
    """The same requests through httpx's async streaming API, as the probe client was built before:
    SSE lines, json.loads per event, a fresh connection per request."""
    import httpx

    problems = []
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for body in bodies:
            payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
            events = 0
            async with client.stream("POST", CHAT_PATH, json=payload) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and not line.startswith("data: [DONE]"):
                        json.loads(line[6:])
                        events += 1
            if events < body["max_tokens"]:
                problems.append(f"{events} events")
    return problems


def cpu_cost(url: str, n: int, max_tokens: int, rounds: int) -> None:
    params = WorkloadParams(max_tokens=max_tokens)
    index = iter(range(1_000_000))

    def bare_block(bodies: list[dict[str, Any]]) -> list[str]:
        return [f"{e} events" for b in bodies if (e := bare_request(url, b)) < max_tokens]

    sides = {"enginetop probe's ProbeClient": lambda bodies: run_loop(probe_block(url, bodies)),
             "bare client": bare_block,
             "ProbeClient on asyncio's loop": lambda bodies: asyncio.run(probe_block(url, bodies)),
             "httpx client": lambda bodies: asyncio.run(httpx_block(url, bodies))}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for run in sides.values():  # warm up imports and first connections, every side
        run([short_body(params, next(index))])
    for r in range(rounds):
        names = list(sides)
        for name in names[r % len(names):] + names[: r % len(names)]:  # each side takes its turn first
            bodies = [short_body(params, next(index)) for _ in range(n)]
            cpu0 = time.process_time()
            problems = sides[name](bodies)
            cpu[name].append(time.process_time() - cpu0)
            if problems:
                raise SystemExit(f"{name}, round {r + 1}: {problems[:3]}")
    mid = {name: median(values) or 0.0 for name, values in cpu.items()}
    bare = mid["bare client"]
    print(f"CPU for {n} streamed requests of {max_tokens} tokens, median of {rounds} round(s): "
          + ", ".join(f"{name} {m:.3f} s ({m / bare:.2f}x bare)" for name, m in mid.items())
          + " (per round: " + "; ".join(f"{name} {', '.join(f'{c:.3f}' for c in values)}"
                                         for name, values in cpu.items()) + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="cpu,ceiling,ttft", help="comma-separated: cpu, ceiling, ttft")
    parser.add_argument("--engine", default=None, help="llama-server base URL for the CPU section "
                                                      "(default: start one with the demo model)")
    parser.add_argument("--cpu-requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=50, help="requests each side in the TTFT section")
    parser.add_argument("--tokens", type=int, default=20000, help="tokens in the 1-stream ceiling run")
    args = parser.parse_args()
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if unknown := sections - {"cpu", "ceiling", "ttft"}:
        raise SystemExit(f"unknown section(s): {', '.join(sorted(unknown))}")
    if "cpu" in sections:
        launched, url = (None, args.engine) if args.engine else start_llama()
        try:
            cpu_cost(url, args.cpu_requests, args.max_tokens, args.rounds)
        finally:
            if launched is not None:
                stop_group(launched)
    if sections & {"ceiling", "ttft"}:
        proc, url = start_server()
        try:
            server = psutil.Process(proc.pid)
            if "ceiling" in sections:
                asyncio.run(ceiling(url, 1, args.tokens, server))
                asyncio.run(ceiling(url, 32, max(100, args.tokens // 32), server))
            if "ttft" in sections:
                asyncio.run(ttft_overhead(url, args.requests))
        finally:
            proc.terminate()
            proc.wait(5)


if __name__ == "__main__":
    main()
