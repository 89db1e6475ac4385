"""Probes of an Ollama server speak its native API (tui.probe.ollama): the NDJSON stream is timed like SSE
chunks and Ollama's own final answer is the server side of the probe, labelled "server (Ollama)".

A tiny Ollama in aiohttp answers /api/version, /api/ps, /api/tags, /api/chat and /api/generate in Ollama's
shapes (api/types.go: ChatResponse, GenerateResponse, Metrics, ListResponse, ProcessResponse; the stream as
server/routes.go streamResponse writes it); the loopback SSE server is a server that is not Ollama. The last
test probes the Ollama stand-in (tests/standins/ollama) in front of the real llama-server."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from sse_server import running

from tui.base.process import Launched, free_port, launch, stop_group
from tui.model.targets import EngineTarget
from tui.probe.client import COMPLETIONS_PATH, ProbeClient, ProbeLimits
from tui.probe.ollama import request_body as ollama_body
from tui.probe.results import ProbeResult, ProbeSummary
from tui.probe.timings import ServerTimings
from tui.probe.workloads import WorkloadParams, short_body

BODY = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "seed": 7}
MODEL = "gemma3:270m"
# A final answer's api.Metrics, in nanoseconds
FINAL_METRICS = {"total_duration": 412_000_000, "load_duration": 31_000_000, "prompt_eval_count": 9,
                 "prompt_eval_duration": 18_000_000, "eval_count": 5, "eval_duration": 240_000_000}


@dataclass(frozen=True)
class Target:
    """A probe target that may say which API its server speaks."""

    name: str
    url: str
    api_key: str | None = None
    model: str | None = None
    api: str | None = None


@dataclass
class FakeOllama:
    """What the fake answers with, and what it was asked."""

    pieces: tuple[str, ...] = ("Once", " upon", " a", " time")
    gap_s: float = 0.05  # between two lines of the stream
    done_reason: str = "stop"
    metrics: dict[str, Any] = field(default_factory=lambda: dict(FINAL_METRICS))
    error_after: int | None = None  # an {"error"} line after this many chunks
    drop_after: int | None = None  # the stream just ends after this many chunks
    status: int = 200  # not 200: {"error": "..."} with it, as routes.go does before a stream
    version_status: int = 200
    models: bool = True  # /api/tags and /api/ps answer {"models": [...]}
    loaded: bool = True  # /api/ps lists the model
    seen: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)  # method, path, body
    sent_at: list[float] = field(default_factory=list)  # time.monotonic() when each chunk line went out
    url: str = ""

    def paths(self, method: str | None = None) -> list[str]:
        return [path for m, path, _ in self.seen if method is None or m == method]


def go_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _app(fake: FakeOllama) -> web.Application:
    async def record(request: web.Request) -> dict[str, Any] | None:
        body = await request.json() if request.can_read_body else None
        fake.seen.append((request.method, request.path, body))
        return body

    async def version(request: web.Request) -> web.Response:
        await record(request)
        if fake.version_status != 200:
            return web.Response(status=fake.version_status, text="404 page not found")
        return web.json_response({"version": "0.32.15"})

    async def tags(request: web.Request) -> web.Response:
        await record(request)
        if not fake.models:
            return web.json_response({"object": "list", "data": []})
        entry = {"name": MODEL, "model": MODEL, "modified_at": "2026-12-01T10:00:00Z", "size": 291_554_930,
                 "digest": "a" * 64, "details": {"format": "gguf", "family": "gemma3"}}
        return web.json_response({"models": [entry, {**entry, "name": "other:1b", "model": "other:1b"}]})

    async def ps(request: web.Request) -> web.Response:
        await record(request)
        if not fake.models:
            return web.Response(status=404, text="404 page not found")
        entry = {"name": MODEL, "model": MODEL, "size": 500_000_000, "digest": "a" * 64,
                 "expires_at": "2026-12-07T01:30:00Z", "size_vram": 0, "context_length": 4096}
        return web.json_response({"models": [entry] if fake.loaded else []})

    async def stream(request: web.Request, chat: bool) -> web.StreamResponse:
        req = await record(request)
        assert req is not None
        if fake.status != 200:
            return web.json_response({"error": f"model '{req.get('model')}' not found"}, status=fake.status)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)

        def line(text: str, done: bool = False) -> dict[str, Any]:
            out: dict[str, Any] = {"model": req["model"], "created_at": "2026-12-07T01:10:00.123456789Z"}
            if chat:
                out["message"] = {"role": "assistant", "content": text}
            else:
                out["response"] = text
            out["done"] = done
            return out

        for i, piece in enumerate(fake.pieces):
            if fake.error_after == i:
                await resp.write(go_json({"error": "an error was encountered while running the model: boom"})
                                 + b"\n")
                return resp
            if fake.drop_after == i:
                return resp
            await asyncio.sleep(fake.gap_s)
            fake.sent_at.append(time.monotonic())
            await resp.write(go_json(line(piece)) + b"\n")
        await asyncio.sleep(fake.gap_s)
        final = {**line("", done=True), "done_reason": fake.done_reason, **fake.metrics}
        if not chat:
            final["context"] = [1, 2, 3]
        await resp.write(go_json(final) + b"\n")
        return resp

    async def chat(request: web.Request) -> web.StreamResponse:
        return await stream(request, chat=True)

    async def generate(request: web.Request) -> web.StreamResponse:
        return await stream(request, chat=False)

    async def openai(request: web.Request) -> web.StreamResponse:
        await record(request)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delta = {"role": "assistant", "content": "hi"}
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL,
                 "system_fingerprint": "fp_ollama",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        await resp.write(b"data: " + go_json(chunk) + b"\n\n")
        chunk["choices"] = [{"index": 0, "delta": {**delta, "content": ""}, "finish_reason": "stop"}]
        await resp.write(b"data: " + go_json(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_post("/v1/chat/completions", openai)
    return app


@pytest.fixture
async def ollama() -> AsyncIterator[FakeOllama]:
    fake = FakeOllama()
    runner = web.AppRunner(_app(fake))
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


async def probe(target: Any, body: dict[str, Any] | None = None, **kw: Any) -> ProbeResult:
    async with ProbeClient(ProbeLimits(read_s=5, total_s=20)) as client:
        return await client.chat(target, body or BODY, workload="test", **kw)


async def test_chat_is_native_and_timed_by_its_lines(ollama: FakeOllama) -> None:
    r = await probe(Target("ollama", ollama.url))
    assert r.ok, r.error
    assert ollama.paths() == ["/api/version", "/api/ps", "/api/chat"]  # a model loaded: /api/tags not asked
    _, _, sent = ollama.seen[-1]
    # The workload's OpenAI body as api.ChatRequest: its options are api.Options; ignore_eos has none
    assert sent == {"model": MODEL, "messages": BODY["messages"], "stream": True,
                    "options": {"num_predict": 12, "temperature": 0, "seed": 7}}
    assert (r.status, r.finish_reason, r.model, r.text) == (200, "stop", MODEL, "Once upon a time")
    # each line with text is a chunk, timed on arrival: four lines 50 ms apart, the first after 50 ms
    assert r.chunks == 4 and len(r.gaps_s) == 3
    assert all(0.01 < gap < 0.5 for gap in r.gaps_s), r.gaps_s  # not all at once at the end
    assert r.ttft_s is not None and 0.04 < r.ttft_s < 1.0
    assert r.decode_s == pytest.approx(ollama.sent_at[-1] - ollama.sent_at[0], abs=0.1)


async def test_the_final_answer_is_the_server_side(ollama: FakeOllama) -> None:
    r = await probe(Target("ollama", ollama.url))
    assert r.ok, r.error
    s = r.server
    assert s is not None and s.source == "ollama" and s.label == "server (Ollama)"
    assert (s.prompt_n, s.predicted_n) == (9, 5)
    assert (s.prompt_ms, s.predicted_ms, s.load_ms, s.total_ms) == (18.0, 240.0, 31.0, 412.0)
    # Ollama's eval rate: eval_count / eval_duration x 1e9, every token counted (llama.cpp's: (n - 1) / ms)
    assert r.server_decode_tps == pytest.approx(5 / 240_000_000 * 1e9) == pytest.approx(20.8333333)
    assert s.prompt_per_second == pytest.approx(9 / 18_000_000 * 1e9)
    assert r.server_prefill_tps == s.prompt_per_second and r.prefill_source == "server"
    assert r.server_ttft_s == pytest.approx(0.018)
    # the counts are Ollama's own: no usage to miss, no chunk estimate, nothing cached said
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (9, 5, None)
    assert r.token_source == "server" and not r.estimated and r.notes == ()
    assert r.chunk_gap == 1
    out = r.to_json()
    assert out["server_timings"] == {"source": "ollama", "prompt_n": 9, "prompt_ms": 18.0,
                                     "prompt_per_second": pytest.approx(500.0), "predicted_n": 5,
                                     "predicted_ms": 240.0, "predicted_per_second": pytest.approx(20.8333333),
                                     "load_ms": 31.0, "total_ms": 412.0}
    assert out["server_decode_tps"] == pytest.approx(20.8333333)
    assert r.server_label == "server (Ollama)" and ProbeSummary.of([r]).server_label == "server (Ollama)"


async def test_done_reason_length_is_the_finish_reason(ollama: FakeOllama) -> None:
    ollama.done_reason = "length"
    r = await probe(Target("ollama", ollama.url))
    assert r.ok and r.finish_reason == "length"


async def test_an_error_line_fails_the_probe_with_its_words(ollama: FakeOllama) -> None:
    ollama.error_after = 2
    r = await probe(Target("ollama", ollama.url))
    assert not r.ok and r.failure == "protocol" and r.status == 200
    assert r.error == ("server error in the stream after 2 chunks: an error was encountered while running "
                       "the model: boom")
    assert r.chunks == 2 and r.server is None


async def test_a_stream_without_its_final_line_was_dropped(ollama: FakeOllama) -> None:
    ollama.drop_after = 3
    r = await probe(Target("ollama", ollama.url))
    assert not r.ok and r.failure == "dropped"
    assert r.error == "stream ended early after 3 chunks (no final line with done: true)"


async def test_an_http_error_is_quoted(ollama: FakeOllama) -> None:
    ollama.status = 404
    r = await probe(Target("ollama", ollama.url), {**BODY, "model": "nope:1b"})
    assert not r.ok and (r.status, r.failure) == (404, "http")
    assert r.error == "HTTP 404: model 'nope:1b' not found"


async def test_a_raw_prompt_is_generate_with_raw(ollama: FakeOllama) -> None:
    body = {"prompt": "alpha beta gamma", "max_tokens": 4, "ignore_eos": True, "min_tokens": 4,
            "model": "other:1b", "stop": "\n"}
    r = await probe(Target("ollama", ollama.url, model="ignored:1b"), body, path=COMPLETIONS_PATH)
    assert r.ok, r.error
    assert ollama.paths("POST") == ["/api/generate"]
    _, _, sent = ollama.seen[-1]
    assert sent == {"model": "other:1b", "prompt": "alpha beta gamma", "raw": True, "stream": True,
                    "options": {"num_predict": 4, "stop": ["\n"]}}
    assert r.text == "Once upon a time" and r.completion_tokens == 5 and r.server is not None


async def test_the_check_is_made_once_per_url_and_client(ollama: FakeOllama) -> None:
    target = Target("ollama", ollama.url + "/v1/")  # the same server, however its URL is written
    async with ProbeClient() as client:
        results = await asyncio.gather(*(client.chat(target, BODY) for _ in range(3)))
        results.append(await client.chat(target, BODY))
    assert all(r.ok for r in results), [r.error for r in results]
    assert ollama.paths("GET") == ["/api/version", "/api/ps"]
    assert ollama.paths("POST") == ["/api/chat"] * 4


async def test_a_model_listed_but_not_loaded_is_named(ollama: FakeOllama) -> None:
    ollama.loaded = False
    r = await probe(Target("ollama", ollama.url))
    assert r.ok, r.error
    assert ollama.paths() == ["/api/version", "/api/ps", "/api/tags", "/api/chat"]
    assert ollama.seen[-1][2]["model"] == MODEL  # type: ignore[index]


async def test_a_model_the_body_or_target_names_is_sent(ollama: FakeOllama) -> None:
    r = await probe(Target("ollama", ollama.url, model="other:1b"))
    assert r.ok and ollama.seen[-1][2]["model"] == "other:1b"  # type: ignore[index]


async def test_api_ollama_skips_the_check(ollama: FakeOllama) -> None:
    r = await probe(Target("ollama", ollama.url, model=MODEL, api="ollama"))
    assert r.ok and r.server is not None and r.server.source == "ollama"
    assert ollama.paths() == ["/api/chat"]
    # without a model to name, Ollama's loaded one is asked for: never /api/version
    ollama.seen.clear()
    r = await probe(Target("ollama", ollama.url, api="ollama"))
    assert r.ok and ollama.paths() == ["/api/ps", "/api/chat"]


async def test_api_openai_is_never_asked(ollama: FakeOllama) -> None:
    r = await probe(Target("ollama", ollama.url, api="openai"))
    assert r.ok, r.error
    assert ollama.paths() == ["/v1/chat/completions"]
    assert r.server is None and r.text == "hi"
    _, _, sent = ollama.seen[-1]
    assert sent == {**BODY, "stream": True, "stream_options": {"include_usage": True}}


async def test_a_version_without_an_ollama_model_list_is_not_ollama(ollama: FakeOllama) -> None:
    ollama.models = False
    r = await probe(Target("ollama", ollama.url))
    assert r.ok, r.error
    assert ollama.paths() == ["/api/version", "/api/ps", "/api/tags", "/v1/chat/completions"]
    assert r.server is None


async def test_a_server_that_is_not_ollama_gets_the_sse_request_unchanged() -> None:
    with running() as server:
        target = EngineTarget(name="sse", url=server.url_for("ok"))
        async with ProbeClient() as client:
            assert await client.speaks_ollama(target) is False  # the check a first probe would make
            first = await client.chat(target, BODY)
            again = await client.chat(target, BODY)
        seen = list(server.requests)
    assert first.ok and again.ok, (first.error, again.error)
    # one GET, once per URL and client: its /api/version is a 404
    sse_body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    assert [(r.path, r.body) for r in seen] == [("/s/ok/api/version", None),
                                               *[("/s/ok/v1/chat/completions", sse_body)] * 2]
    assert seen[1].headers["accept"] == "text/event-stream" and seen[1].headers["connection"] == "close"
    assert first.server is not None and first.server.source == "llamacpp"
    assert first.server.label == "server (llama.cpp)" and first.token_source == "server"
    assert ProbeSummary.of([first, again]).server_label == "server (llama.cpp)"


async def test_a_server_that_does_not_answer_is_asked_again() -> None:
    port = free_port()
    target = Target("gone", f"http://127.0.0.1:{port}")
    async with ProbeClient(ProbeLimits(connect_s=1)) as client:
        r = await client.chat(target, BODY)
        assert not r.ok and r.failure == "refused"
        assert client._ollama == {}  # nothing is known of it: its next probe asks again


def test_ollama_body_translation() -> None:
    body = {"messages": [{"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text",
                                                                                          "text": "brief"}]},
                         {"role": "user", "content": "hi"}],
            "max_completion_tokens": 3, "max_tokens": 99, "top_p": 0.9, "stop": ["a", "b"],
            "chat_template_kwargs": {"enable_thinking": False}, "stream_options": {"include_usage": True},
            "return_progress": True, "ignore_eos": True}
    assert ollama_body(body, False, "m:1") == {
        "model": "m:1",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "think": False, "stream": True, "options": {"num_predict": 3, "top_p": 0.9, "stop": ["a", "b"]}}


def test_from_ollama_reads_go_omitempty() -> None:
    # A reply of no tokens: Go's omitempty left eval_count and eval_duration out; they were 0
    s = ServerTimings.from_ollama({"done": True, "done_reason": "stop", "total_duration": 5_000_000,
                                   "prompt_eval_count": 3, "prompt_eval_duration": 2_000_000})
    assert (s.predicted_n, s.predicted_ms, s.predicted_per_second, s.decode_tps) == (0, None, None, None)
    assert s.prompt_per_second == pytest.approx(1500.0) and s.ttft_s == pytest.approx(0.002)
    # An answer without durations (done_reason "load") says nothing
    s = ServerTimings.from_ollama({"done": True, "done_reason": "load"})
    assert (s.prompt_n, s.predicted_n, s.total_ms) == (None, None, None)


# ---- the Ollama stand-in in front of the real llama-server ----------------------------------------------

STANDIN = Path(__file__).resolve().parent / "standins" / "ollama"


@dataclass
class Standin:
    url: str
    launched: Launched


@pytest.fixture(scope="module")
def ollama_standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    port = free_port()
    env = {"OLLAMA_HOST": f"127.0.0.1:{port}", "OLLAMA_KEEP_ALIVE": "-1"}  # kept loaded for the module
    argv = [sys.executable, str(STANDIN), "serve", "--parameter", "num_thread=2", "--preload"]
    launched = launch(argv, tmp_path_factory.mktemp("ollama") / f"ollama-{port}.log", env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:  # --preload: it listens once the model is loaded
            assert launched.alive(), "\n".join(launched.log_tail(30))
            try:
                if httpx.get(f"{url}/api/version", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Ollama stand-in not answering in 120 s"
            time.sleep(0.2)
        yield Standin(url, launched)
    finally:
        stop_group(launched)


@pytest.mark.engine
async def test_the_standins_own_figures_are_the_server_side(ollama_standin: Standin) -> None:
    body = short_body(WorkloadParams(max_tokens=24, ignore_eos=True), 0)
    async with ProbeClient() as client:
        r = await client.chat(EngineTarget(name="ollama", url=ollama_standin.url), body, workload="short")
    assert r.ok, r.error
    s = r.server
    assert s is not None and s.source == "ollama" and s.label == "server (Ollama)"
    # Ollama's own final answer, as the result keeps it: eval_count and eval_duration (ns) / 1e6
    raw = r.to_json()["server_timings"]
    eval_count, eval_duration_ns = raw["predicted_n"], raw["predicted_ms"] * 1e6
    assert eval_count >= 1 and eval_duration_ns > 0
    assert r.server_decode_tps == pytest.approx(eval_count / eval_duration_ns * 1e9)
    assert r.completion_tokens == eval_count and r.token_source == "server"
    assert r.prompt_tokens is not None and r.prompt_tokens == raw["prompt_n"] and r.prompt_tokens > 10
    assert r.finish_reason in ("stop", "length") and r.model == "gemma3:270m"
    assert 1 <= r.chunks <= eval_count and r.text
    # the server's decode time lies inside the client's span from send to end
    assert r.e2e_s is not None and raw["predicted_ms"] / 1000 <= r.e2e_s
