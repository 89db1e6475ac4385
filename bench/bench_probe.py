"""How fast the probe client can ingest a stream, and what it adds to TTFT. Prints figures.

    .venv/bin/python bench/bench_probe.py [--requests 50] [--tokens 20000]

The loopback SSE server (tests/sse_server.py) runs in its own process, so client and server do not share
one interpreter. Ceiling: tokens/s the client ingests with no delay on the server, at 1 and 32 streams
(one token a chunk, the worst case); the CPU share of both processes says which side was the limit.
TTFT overhead: the probe client against a minimal raw-socket client on the same server, interleaved,
median over N requests each (target: under 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.probe.client import ProbeClient  # noqa: E402
from tui.probe.stats import median, quantile  # noqa: E402


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    api_key: str | None = None


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.sse_server", "--port", "0"], cwd=ROOT,
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
    """The least a client can do: connect, send, read until the first content delta."""
    payload = json.dumps({**body(4), "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload
    t0 = time.perf_counter()
    with socket.create_connection((host, port)) as sock:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=20000, help="tokens in the 1-stream ceiling run")
    args = parser.parse_args()
    proc, url = start_server()
    try:
        server = psutil.Process(proc.pid)
        asyncio.run(ceiling(url, 1, args.tokens, server))
        asyncio.run(ceiling(url, 32, max(100, args.tokens // 32), server))
        asyncio.run(ttft_overhead(url, args.requests))
    finally:
        proc.terminate()
        proc.wait(5)


if __name__ == "__main__":
    main()
