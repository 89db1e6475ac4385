"""A loopback OpenAI-style SSE chat server with controlled timing and misbehaviour, for tests and benches.

It is deliberately raw asyncio (not a web framework): the point is to send exactly the bytes a broken or
slow server would send, down to dropping a connection mid-chunk.

The behaviour is picked by URL path: a target URL of `server.url_for("drop")` makes the client post to
`/s/drop/v1/chat/completions`. Each scenario is a `Scenario`; `SSEServer(scenarios={...})` adds or
replaces them. Timing knobs (first-token delay, per-token delay, jitter with a seed) make it usable as a
"noisy" engine in A/B tests. Server-side timings in the final chunk are measured on the server's clock,
like llama.cpp's, so a client can be checked against them.

`accept_after_s` starts the server with its accept queue full and accepts nothing for that long: a client
connecting meanwhile has its SYN dropped and retried by the kernel (about 1 s later), the real shape of a
slow connect to an overloaded listener. `ForwardProxy` is a minimal HTTP forward proxy that records what
passed through it.

Run standalone (for benches, in its own process): python -m tests.sse_server --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import ssl
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

Mode = Literal["ok", "http500", "error_mid", "drop", "hang", "oversized", "bad_json", "echo_key_401"]

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta")


@dataclass(frozen=True)
class Scenario:
    mode: Mode = "ok"
    tokens: int | None = None  # None: honour the request's max_tokens (default 16)
    tokens_per_chunk: int = 1
    first_token_delay_s: float = 0.0  # "prefill" time before the first content chunk
    queue_s: float = 0.0  # waited before "scheduling"; reported as vLLM's queue_time_ms, not in its TTFT
    # The frontend holds the first token this long after the engine made it (vLLM's frontend was seen
    # writing a stream out late): the server's own TTFT stays small, the client's grows.
    write_delay_s: float = 0.0
    per_token_delay_s: float = 0.0
    jitter_s: float = 0.0  # uniform +-jitter on every delay, from a seeded generator
    seed: int = 0
    role_chunk: bool = True  # a first chunk with only {"role": "assistant"} (vLLM, llama.cpp)
    empty_chunk_every: int = 0  # after every k content chunks, one chunk with content "" (0: never)
    comment_every: int = 0  # after every k content chunks, an SSE comment line (0: never)
    usage: bool = True  # honour stream_options.include_usage
    timings: bool = True  # llama.cpp `timings` on the last chunk
    vllm_metrics: bool = False  # vLLM per-request `metrics` on the usage chunk instead
    done: bool = True  # send data: [DONE]
    fail_after_chunks: int = 3  # error_mid / drop / bad_json: content chunks before the failure
    oversized_bytes: int = 2 << 20
    require_key: str | None = None  # answer 401 unless `Authorization: Bearer <key>`
    status: int = 500  # http500
    fail_every: int = 0  # every k-th request to this scenario answers HTTP 500 (0: never)
    # A scheduler of this many slots (0: no limit): a request waits for a free slot before anything is sent
    # (its TTFT grows with the queue) and holds it until its last token, so with a fixed service time the
    # server's capacity is slots / (first_token_delay_s + tokens x per_token_delay_s) requests per second.
    # A client that goes away, queued or served, gives its place back at once.
    slots: int = 0


@dataclass(frozen=True)
class RecordedRequest:
    peer_port: int  # the client's source port: a new one per request means a fresh connection
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


def _chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": "sse-test", "choices": choices,
            **extra}


def _event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _tokenize(body: dict[str, Any] | None) -> dict[str, Any]:
    """llama.cpp's /tokenize, as this server counts tokens: a word each (with its leading space), BOS 1."""
    body = body or {}
    words = str(body.get("content", "")).split()
    ids = [zlib.crc32(w.encode()) % 30000 + 2 for w in words]
    tokens: list[Any] = [{"id": i, "piece": f" {w}"} for i, w in zip(ids, words, strict=True)] \
        if body.get("with_pieces") else ids
    return {"tokens": ([1] if body.get("add_special") else []) + tokens}


def _prompt_words(body: dict[str, Any] | None) -> list[str]:
    words: list[str] = []
    if isinstance((body or {}).get("prompt"), str):  # /v1/completions: a raw prompt, a token a word
        words.extend(body["prompt"].split())  # type: ignore[index]
    for msg in (body or {}).get("messages") or []:
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            words.append(f"<{msg.get('role')}>")
            words.extend(msg["content"].split())
    return words


class SSEServer:
    """Threaded loopback server; use as a context manager or start()/stop()."""

    def __init__(self, scenarios: dict[str, Scenario] | None = None, *, default: Scenario | None = None,
                 host: str = "127.0.0.1", port: int = 0, record: int = 1000,
                 accept_after_s: float = 0.0, tls: ssl.SSLContext | None = None,
                 tokenize: bool = True) -> None:
        self.scenarios: dict[str, Scenario] = {
            "ok": Scenario(),
            "multi": Scenario(tokens_per_chunk=3),
            "empty_chunks": Scenario(empty_chunk_every=2),
            "no_role": Scenario(role_chunk=False),
            "comments": Scenario(comment_every=1),
            "no_usage": Scenario(usage=False, timings=False),
            "usage_no_timings": Scenario(timings=False),
            "vllm": Scenario(timings=False, vllm_metrics=True, empty_chunk_every=4),
            "http500": Scenario(mode="http500"),
            "error_mid": Scenario(mode="error_mid"),
            "drop": Scenario(mode="drop"),
            "hang": Scenario(mode="hang"),
            "oversized": Scenario(mode="oversized"),
            "bad_json": Scenario(mode="bad_json"),
        }
        self.scenarios.update(scenarios or {})
        self.default = default or self.scenarios["ok"]
        self.host = host
        self.port = port
        self.accept_after_s = accept_after_s
        self.tls = tls  # a server context: https:// on the same port
        self.tokenize = tokenize  # False: no /tokenize at all (a gateway, a hosted API)
        self._opener: asyncio.Task[None] | None = None
        self.requests: deque[RecordedRequest] = deque(maxlen=record)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._rng_lock = threading.Lock()
        self._rngs: dict[str, random.Random] = {}
        self._counts: dict[str, int] = {}
        self._recent_prompts: deque[list[str]] = deque(maxlen=8)
        self._slots: dict[str, asyncio.Semaphore] = {}

    # --- lifecycle -------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url_for(self, scenario: str) -> str:
        return f"{self.url}/s/{scenario}"

    def start(self) -> SSEServer:
        self._thread = threading.Thread(target=self._run, name="sse-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("SSE test server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> SSEServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        if self.accept_after_s:
            self._server = loop.run_until_complete(self._start_late(loop))
        else:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.host, self.port, ssl=self.tls))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _start_late(self, loop: asyncio.AbstractEventLoop) -> asyncio.Server:
        """Listen with a full accept queue (backlog 0 and connections nobody accepts) for accept_after_s."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, self.port))
        sock.listen(0)
        fillers = []
        for _ in range(3):
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(sock.getsockname())
            fillers.append(filler)
        server = await asyncio.start_server(self._handle, sock=sock, start_serving=False)

        async def open_later() -> None:
            await asyncio.sleep(self.accept_after_s)
            for filler in fillers:
                filler.close()
            await server.start_serving()

        self._opener = loop.create_task(open_later())
        return server

    async def serve_forever(self) -> None:
        """For standalone use in the current loop (see __main__)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        async with self._server:
            await self._server.serve_forever()

    # --- HTTP --------------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            peer = writer.get_extra_info("peername")
            self.requests.append(RecordedRequest(peer_port=peer[1] if peer else 0, path=path, headers=headers,
                                                 body=body))
            scenario_name, scenario = self._scenario_for(path)
            sent_auth = headers.get("authorization")
            if scenario.require_key is not None and sent_auth != f"Bearer {scenario.require_key}":
                # Echo what was sent, as a careless server might: the client must redact it.
                error = {"message": f"Invalid API key: {sent_auth}", "type": "authentication_error"}
                await self._plain(writer, 401, {"error": error})
                return
            if method == "POST" and path.endswith("/tokenize") and self.tokenize:
                await self._plain(writer, 200, _tokenize(body))
                return
            if method != "POST" or not path.endswith(("/v1/chat/completions", "/v1/completions")):
                await self._plain(writer, 404, {"error": {"message": f"no route {method} {path}"}})
                return
            if scenario.slots:
                await self._in_slot(reader, writer, scenario_name, scenario, body)
            else:
                await self._respond(writer, scenario_name, scenario, body)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass  # the server is stopping; asyncio's stream callback would log a cancelled handler
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _scenario_for(self, path: str) -> tuple[str, Scenario]:
        parts = path.split("/")
        if len(parts) > 2 and parts[1] == "s":
            name = parts[2]
            if name in self.scenarios:
                return name, self.scenarios[name]
        return "default", self.default

    async def _plain(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n")
        writer.write(head.encode() + data)
        await writer.drain()

    def _rng(self, name: str, seed: int) -> random.Random:
        with self._rng_lock:
            if name not in self._rngs:
                self._rngs[name] = random.Random(seed)
            return self._rngs[name]

    def _delay(self, rng: random.Random, base: float, jitter: float) -> float:
        if jitter:
            with self._rng_lock:
                base += rng.uniform(-jitter, jitter)
        return max(0.0, base)

    def _cached(self, words: list[str]) -> int:
        """Longest common prefix with a recent prompt: a word-level imitation of a prefix cache."""
        best = 0
        for old in self._recent_prompts:
            n = 0
            for a, b in zip(old, words, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._recent_prompts.append(words)
        return best

    async def _in_slot(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str,
                       sc: Scenario, body: dict[str, Any] | None) -> None:
        """Wait for one of the scenario's slots, respond holding it; the client closing ends both."""
        slots = self._slots.setdefault(name, asyncio.Semaphore(sc.slots))
        gone = asyncio.ensure_future(reader.read(1))  # b"" when the client closes its side
        acquire = asyncio.ensure_future(slots.acquire())
        try:
            await asyncio.wait({gone, acquire}, return_when=asyncio.FIRST_COMPLETED)
            if not acquire.done():
                acquire.cancel()
                return
            try:
                respond = asyncio.ensure_future(self._respond(writer, name, sc, body))
                await asyncio.wait({gone, respond}, return_when=asyncio.FIRST_COMPLETED)
                respond.cancel()
            finally:
                slots.release()
        finally:
            gone.cancel()

    async def _respond(self, writer: asyncio.StreamWriter, name: str, sc: Scenario,
                       body: dict[str, Any] | None) -> None:
        if sc.mode == "hang":
            await asyncio.sleep(3600)
            return
        self._counts[name] = count = self._counts.get(name, 0) + 1
        if sc.mode == "http500" or (sc.fail_every and count % sc.fail_every == 0):
            error = {"error": {"message": "simulated failure", "code": sc.status}}
            await self._plain(writer, sc.status, error)
            return
        rng = self._rng(name, sc.seed)
        body = body or {}
        n_tokens = sc.tokens if sc.tokens is not None else int(body.get("max_tokens") or 16)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and sc.usage
        words = _prompt_words(body)
        prompt_n = len(words) + ("prompt" in body and "messages" not in body)  # a raw prompt gets a BOS
        cached = self._cached(words)
        await asyncio.sleep(sc.queue_s)
        t0 = time.perf_counter()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")

        async def send(data: bytes) -> None:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        completions = "prompt" in body and "messages" not in body  # /v1/completions: its own chunk shape

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
            if completions and delta is not None:
                return {"id": "cmpl-test", "object": "text_completion", "model": "sse-test", "choices": [
                    {"index": 0, "text": delta.get("content") or "", "finish_reason": finish}], **extra}
            return _chunk(delta, finish, **extra)

        if sc.role_chunk and not completions:
            await send(_event(chunk({"role": "assistant", "content": None})))
        await asyncio.sleep(self._delay(rng, sc.first_token_delay_s, sc.jitter_s))
        t_first: float | None = None
        t_last = time.perf_counter()
        sent = 0
        n_chunks = 0
        while sent < n_tokens:
            if n_chunks and sc.per_token_delay_s:
                await asyncio.sleep(self._delay(rng, sc.per_token_delay_s * sc.tokens_per_chunk, sc.jitter_s))
            take = min(sc.tokens_per_chunk, n_tokens - sent)
            text = "".join(f" {WORDS[(sent + i) % len(WORDS)]}" for i in range(take))
            if sc.mode in ("error_mid", "drop", "bad_json") and n_chunks == sc.fail_after_chunks:
                if sc.mode == "error_mid":
                    crash = {"error": {"message": "simulated engine crash mid-stream", "code": 500}}
                    await send(_event(crash))
                    writer.write(b"0\r\n\r\n")
                elif sc.mode == "bad_json":
                    await send(b'data: {"choices": [{"delta": {"content": "x"}\n\n')
                    writer.write(b"0\r\n\r\n")
                else:
                    # Half an HTTP chunk, then the socket goes away.
                    writer.write(b"%x\r\ndata: {\"cho" % 200)
                await writer.drain()
                return
            if sc.mode == "oversized" and n_chunks == 1:
                await send(_event(chunk({"content": "x" * sc.oversized_bytes})))
            # An engine times a token when it is made, before writing it: a write that stalls (a loaded
            # machine) must not put the engine's own TTFT after the client's.
            t_last = time.perf_counter()
            if t_first is None:
                t_first = t_last
                if sc.write_delay_s:
                    await asyncio.sleep(sc.write_delay_s)  # made now, written late
            await send(_event(chunk({"content": text})))
            sent += take
            n_chunks += 1
            if sc.empty_chunk_every and n_chunks % sc.empty_chunk_every == 0:
                await send(_event(chunk({"content": ""})))
            if sc.comment_every and n_chunks % sc.comment_every == 0:
                await send(b": ping\n\n")
        first = t_first if t_first is not None else t_last
        timings = {
            "cache_n": cached, "prompt_n": prompt_n - cached, "prompt_ms": (first - t0) * 1000,
            "prompt_per_token_ms": (first - t0) * 1000 / max(1, prompt_n - cached),
            "prompt_per_second": max(1, prompt_n - cached) / max(1e-9, first - t0),
            "predicted_n": n_tokens, "predicted_ms": (t_last - first) * 1000,
            "predicted_per_token_ms": (t_last - first) * 1000 / max(1, n_tokens - 1),
            "predicted_per_second": (n_tokens - 1) / (t_last - first) if t_last > first else 0.0,
        }
        finish = chunk({}, "length")
        if sc.timings and not include_usage:
            finish["timings"] = timings
        await send(_event(finish))
        if include_usage:
            usage_chunk = chunk(None, usage={
                "prompt_tokens": prompt_n, "completion_tokens": n_tokens, "total_tokens": prompt_n + n_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}})
            if sc.timings:
                usage_chunk["timings"] = timings
            if sc.vllm_metrics:
                usage_chunk["metrics"] = {
                    "time_to_first_token_ms": (first - t0) * 1000, "generation_time_ms": (t_last - t0) * 1000,
                    "queue_time_ms": sc.queue_s * 1000,
                    "mean_itl_ms": (t_last - first) * 1000 / max(1, n_tokens - 1),
                    "tokens_per_second": n_tokens / max(1e-9, t_last - t0)}
            await send(_event(usage_chunk))
        if sc.done:
            await send(_event(b"[DONE]"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()


@dataclass(frozen=True)
class ProxiedRequest:
    method: str
    target: str  # as the client wrote it: an absolute URL for a forward proxy
    headers: dict[str, str]


class ForwardProxy:
    """A minimal HTTP/1.1 proxy on loopback, in a thread: absolute-form requests to http:// URLs are sent
    on in origin form over a new connection; CONNECT opens a tunnel. It records each request and relays
    both ways until either side closes."""

    def __init__(self) -> None:
        self.requests: deque[ProxiedRequest] = deque(maxlen=100)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ForwardProxy:
        self._thread = threading.Thread(target=self._run, name="forward-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("forward proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            first, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, version = first.split(" ", 2)
            pairs = (line.partition(":") for line in header_lines if line)
            headers = {k.strip().lower(): v.strip() for k, _, v in pairs}
            self.requests.append(ProxiedRequest(method=method, target=target, headers=headers))
            if method == "CONNECT":
                host, _, port = target.rpartition(":")
                up_reader, upstream = await asyncio.open_connection(host.strip("[]"), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(self._pipe(reader, upstream), self._pipe(up_reader, writer))
                return
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                writer.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            up_reader, upstream = await asyncio.open_connection(url.hostname, url.port or 80)
            path = url.path + (f"?{url.query}" if url.query else "")
            rest = head.split(b"\r\n", 1)[1]
            upstream.write(f"{method} {path or '/'} {version}\r\n".encode("latin-1") + rest)
            await asyncio.gather(self._pipe(reader, upstream), self._pipe(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                dst.close()


@contextlib.contextmanager
def running(scenarios: dict[str, Scenario] | None = None, **kw: Any) -> Iterator[SSEServer]:
    server = SSEServer(scenarios, **kw).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Loopback SSE chat server for benches")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--per-token-delay", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--uvloop", action="store_true", help="serve on uvloop (cheaper, for load benches)")
    args = parser.parse_args(argv)
    default = Scenario(per_token_delay_s=args.per_token_delay, jitter_s=args.jitter, seed=args.seed,
                       tokens_per_chunk=args.tokens_per_chunk)
    server = SSEServer(default=default, port=args.port)

    async def go() -> None:
        task = asyncio.create_task(server.serve_forever())
        while server._server is None:
            await asyncio.sleep(0.01)
        print(f"listening {server.url}", flush=True)
        await task

    if args.uvloop:
        import uvloop

        uvloop.run(go())
    else:
        asyncio.run(go())


if __name__ == "__main__":
    main()

