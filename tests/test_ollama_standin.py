"""The Ollama stand-in (tests/standins/ollama) in front of the real llama-server: every route answers with the
field names and types of Ollama's own source (tests/standins/ollama_shapes.md), the stats are the engine's
own, the runner is a child of `ollama serve`, and keep-alive loads and unloads it as Ollama does."""

from __future__ import annotations

import datetime as dt
import importlib.machinery
import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psutil
import pytest

from tests.waiting import until
from tui.base.paths import runs_dir
from tui.base.process import Launched, free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_model_path

pytestmark = pytest.mark.engine  # every test here starts the stand-in, and through it a real llama-server

STANDIN = Path(__file__).parent / "standins" / "ollama"
NAME = "gemma3:270m"
GO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
DETAILS = {"parent_model", "format", "family", "families", "parameter_size", "quantization_level"}
FINAL_CHAT = {"model", "created_at", "message", "done", "done_reason", "total_duration", "load_duration",
              "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@dataclass
class Ollama:
    url: str
    launched: Launched

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def post(self, path: str, body: dict[str, Any], timeout: float = 120) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=timeout)

    def ps(self) -> list[dict[str, Any]]:
        return self.get("/api/ps").json()["models"]

    def runners(self) -> list[psutil.Process]:
        """The stand-in's children that are llama-server (its runner)."""
        kids = psutil.Process(self.launched.pid).children()
        return [p for p in kids if p.name().startswith("llama-server")]


def start_ollama(*args: str, env: dict[str, str] | None = None) -> Ollama:
    """`python tests/standins/ollama serve` on a free loopback port, the demo model, two threads."""
    port = free_port()
    argv = [sys.executable, str(STANDIN), "serve", "--model-file", str(demo_model_path()),
            "--parameter", "num_thread=2", *args]
    launched = launch(argv, runs_dir() / f"test-ollama-{port}.log",
                      env={"OLLAMA_HOST": f"127.0.0.1:{port}", **(env or {})})
    server = Ollama(f"http://127.0.0.1:{port}", launched)

    def up() -> bool:
        if not launched.alive():
            raise RuntimeError("the stand-in exited:\n" + "\n".join(launched.log_tail(30)))
        try:
            return server.get("/").text == "Ollama is running"
        except httpx.HTTPError:
            return False

    try:
        until(up, "the Ollama stand-in to answer", timeout=60, every=0.1)
    except BaseException:
        stop_group(launched)
        raise
    return server


@pytest.fixture(scope="module")
def ollama() -> Iterator[Ollama]:
    server = start_ollama(env={"OLLAMA_KEEP_ALIVE": "10m"})
    try:
        yield server
    finally:
        stop_group(server.launched)


def load_standin() -> ModuleType:
    """The script as a module (it has no .py), for its parsers."""
    loader = importlib.machinery.SourceFileLoader("ollama_standin", str(STANDIN))
    spec = importlib.util.spec_from_loader("ollama_standin", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ollama_standin"] = module
    loader.exec_module(module)
    return module


def go_time(stamp: str) -> dt.datetime:
    assert GO_TIME.match(stamp), stamp
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", stamp).replace("Z", "+00:00")
    return dt.datetime.fromisoformat(stamp)


def ndjson(reply: httpx.Response) -> list[dict[str, Any]]:
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in reply.text.splitlines() if line]


def sse(reply: httpx.Response) -> list[Any]:
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [e for e in reply.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


def assert_final_stats(final: dict[str, Any], max_tokens: int) -> None:
    for key in (*DURATIONS, "prompt_eval_count", "eval_count"):
        assert isinstance(final[key], int) and final[key] > 0, (key, final)
    assert 1 <= final["eval_count"] <= max_tokens
    assert final["done_reason"] == ("length" if final["eval_count"] == max_tokens else "stop")
    rate = final["eval_count"] / final["eval_duration"] * 1e9
    assert 0.5 < rate < 5000, f"{rate:.1f} tok/s is no decode rate of a 270M model on a CPU"
    assert final["total_duration"] >= final["eval_duration"] + final["load_duration"]


# ---- pure parsing, as envconfig/config.go and api/types.go parse ------------------------------------------


def test_host_keep_alive_and_sizes_parse_as_ollama() -> None:
    m = load_standin()
    # envconfig/config_test.go TestHost
    assert m.parse_host("") == ("127.0.0.1", 11434)
    assert m.parse_host(":1234") == ("", 1234)
    assert m.parse_host("1.2.3.4:1234") == ("1.2.3.4", 1234)
    assert m.parse_host("example.com") == ("example.com", 11434)
    assert m.parse_host(":66000") == ("", 11434)
    assert m.parse_host("::1") == ("::1", 11434)
    assert m.parse_host("[::1]:1337") == ("::1", 1337)
    assert m.parse_host("http://1.2.3.4") == ("1.2.3.4", 80)
    assert m.parse_host("https://example.com/ollama") == ("example.com", 443)
    assert m.parse_go_duration("1h30m") == 5400 * 10**9
    assert m.parse_go_duration("300ms") == 300 * 10**6
    with pytest.raises(ValueError, match="missing unit"):
        m.parse_go_duration("10")
    assert m.keep_alive_value(0) == 0
    assert m.keep_alive_value(-1) == m.keep_alive_value("-1s") == 2**63 - 1
    assert m.keep_alive_value("5m") == 300 * 10**9
    assert m.human_number(268_098_176) == "268.10M"
    assert m.human_number(7_000_000_000) == "7B"


# ---- the routes, on one stand-in --------------------------------------------------------------------------


def test_plain_routes_and_unknown_paths(ollama: Ollama) -> None:
    root = ollama.get("/")
    assert (root.status_code, root.text) == (200, "Ollama is running")
    assert httpx.head(ollama.url + "/", timeout=10).status_code == 200
    assert ollama.get("/api/version").json() == {"version": "0.32.15"}
    for path in ("/metrics", "/health", "/api/nothing"):
        reply = ollama.get(path)
        assert (reply.status_code, reply.text) == (404, "404 page not found"), path
        assert reply.headers["content-type"] == "text/plain"
    hello = [{"role": "user", "content": "hi"}]
    missing = ollama.post("/api/chat", {"model": "llama9:1b", "messages": hello})
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'llama9:1b' not found"})
    oai = ollama.post("/v1/chat/completions", {"model": "llama9:1b", "messages": hello})
    assert oai.status_code == 404
    assert oai.json() == {"error": {"message": "model 'llama9:1b' not found", "type": "not_found_error",
                                    "param": None, "code": None}}


def test_tags_and_show_carry_the_ggufs_facts(ollama: Ollama) -> None:
    tags = ollama.get("/api/tags").json()
    assert list(tags) == ["models"] and len(tags["models"]) == 1
    entry = tags["models"][0]
    assert list(entry) == ["name", "model", "modified_at", "size", "digest", "details", "capabilities"]
    assert entry["name"] == entry["model"] == NAME
    go_time(entry["modified_at"])
    assert entry["size"] > demo_model_path().stat().st_size  # the GGUF layer and the config blob
    assert re.fullmatch(r"[0-9a-f]{64}", entry["digest"])
    details = entry["details"]
    assert set(details) == DETAILS | {"context_length", "embedding_length"}
    assert details == {"parent_model": "", "format": "gguf", "family": "gemma3", "families": ["gemma3"],
                       "parameter_size": "268.10M", "quantization_level": "Q4_K_M", "context_length": 32768,
                       "embedding_length": 640}
    assert entry["capabilities"] == ["completion"]

    show = ollama.post("/api/show", {"model": NAME}).json()
    assert list(show) == ["modelfile", "parameters", "template", "details", "model_info", "tensors",
                          "capabilities", "modified_at"]
    assert show["modelfile"].startswith('# Modelfile generated by "ollama show"')
    assert "PARAMETER num_thread 2" in show["modelfile"]
    assert re.fullmatch(r"num_thread +2", show["parameters"])
    assert show["template"] == "{{ .Prompt }}"  # this GGUF has no chat template of its own
    assert set(show["details"]) == DETAILS and show["details"]["family"] == "gemma3"
    info = show["model_info"]
    assert info["general.architecture"] == "gemma3"
    assert info["general.parameter_count"] == 268_098_176
    assert info["gemma3.context_length"] == 32768
    assert info["gemma3.embedding_length"] == 640
    assert info["tokenizer.ggml.tokens"] is None  # arrays keep no values without verbose
    assert "general.name" not in info and list(info) == sorted(info)
    tensors = {t["name"]: t for t in show["tensors"]}
    assert len(tensors) == 236 and all(list(t) == ["name", "type", "shape"] for t in show["tensors"])
    assert tensors["token_embd.weight"]["shape"] == [640, 262144]
    assert tensors["output_norm.weight"] == {"name": "output_norm.weight", "type": "F32", "shape": [640]}
    assert tensors["blk.0.attn_output.weight"]["type"] == "Q4_K"
    assert show["capabilities"] == ["completion"]
    assert ollama.post("/api/show", {"model": "nope"}).status_code == 404


def test_streamed_chat_reports_the_engines_own_stats(ollama: Ollama) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "Count from one to ten."}],
            "options": {"num_predict": 16, "temperature": 0, "seed": 42}}
    lines = ndjson(ollama.post("/api/chat", body))
    *chunks, final = lines
    assert chunks, "no token came before the final message"
    for chunk in chunks:
        assert list(chunk) == ["model", "created_at", "message", "done"]
        assert chunk["done"] is False and chunk["message"]["role"] == "assistant"
        assert isinstance(chunk["message"]["content"], str) and chunk["message"]["content"]
        go_time(chunk["created_at"])
    assert list(final) == ["model", "created_at", "message", "done", "done_reason", *DURATIONS[:2],
                           "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"]
    assert set(final) == FINAL_CHAT and final["done"] is True and final["model"] == NAME
    assert final["message"] == {"role": "assistant", "content": final["message"]["content"]}
    assert_final_stats(final, 16)
    assert len(chunks) <= final["eval_count"]

    loaded = ollama.ps()  # still loaded: 10 minutes of keep-alive
    assert len(loaded) == 1
    entry = loaded[0]
    assert list(entry) == ["name", "model", "size", "digest", "details", "expires_at", "size_vram",
                           "context_length"]
    assert entry["name"] == entry["model"] == NAME
    assert set(entry["details"]) == DETAILS
    assert entry["context_length"] == 4096  # Ollama's default without a GPU
    assert entry["size_vram"] == 0 and entry["size"] > 100 * 2**20  # from the runner's buffer sizes
    assert entry["digest"] == ollama.get("/api/tags").json()["models"][0]["digest"]
    left = go_time(entry["expires_at"]) - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=9) < left <= dt.timedelta(minutes=10)


def test_generate_without_streaming(ollama: Ollama) -> None:
    ollama.post("/api/generate", {"model": NAME})  # loaded before: what remains is the scheduler's wait
    body = {"model": NAME, "prompt": "The capital of France is", "stream": False,
            "options": {"num_predict": 8, "temperature": 0}}
    reply = ollama.post("/api/generate", body)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json; charset=utf-8"
    r = reply.json()
    assert list(r) == ["model", "created_at", "response", "done", "done_reason", "context", *DURATIONS[:2],
                       "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"]
    assert isinstance(r["response"], str) and r["response"]
    assert r["context"] and all(isinstance(t, int) for t in r["context"])
    assert_final_stats(r, 8)
    assert r["load_duration"] < 10**9  # already loaded: only the wait for the scheduler

    raw = ndjson(ollama.post("/api/generate", {**body, "raw": True, "stream": True}))
    assert raw[-1]["done"] is True and "context" not in raw[-1] and raw[-1]["eval_count"] >= 1
    # this GGUF has no chat template: the default one, "{{ .Prompt }}", leaves the prompt as it is
    assert raw[-1]["prompt_eval_count"] == r["prompt_eval_count"]


def test_openai_compatible_routes(ollama: Ollama) -> None:
    models = ollama.get("/v1/models").json()
    assert models["object"] == "list"
    assert [{k: m[k] for k in ("id", "object", "owned_by")} for m in models["data"]] == [
        {"id": NAME, "object": "model", "owned_by": "library"}]
    one = ollama.get(f"/v1/models/{NAME}").json()
    assert list(one) == ["id", "object", "created", "owned_by"] and one["id"] == NAME

    messages = [{"role": "user", "content": "Say hello."}]
    done = ollama.post("/v1/chat/completions", {"model": NAME, "messages": messages, "max_tokens": 8,
                                                "temperature": 0}).json()
    assert list(done) == ["id", "object", "created", "model", "system_fingerprint", "choices", "usage"]
    assert re.fullmatch(r"chatcmpl-\d{1,3}", done["id"]) and done["object"] == "chat.completion"
    assert done["system_fingerprint"] == "fp_ollama" and done["model"] == NAME
    choice = done["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = done["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 8

    events = sse(ollama.post("/v1/chat/completions", {
        "model": NAME, "messages": messages, "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}}))
    assert events[-1] == "[DONE]"
    *chunks, finish, with_usage, _ = events
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["choices"][0]["finish_reason"] is None
               for c in chunks)
    reason = finish["choices"][0]["finish_reason"]
    assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": reason}]
    assert reason in ("stop", "length")
    assert with_usage["choices"] == [] and with_usage["usage"]["completion_tokens"] >= 1
    assert len({c["id"] for c in events[:-1]}) == 1 and len({c["created"] for c in events[:-1]}) == 1

    prompt = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 8}
    text = ollama.post("/v1/completions", prompt).json()
    assert text["object"] == "text_completion" and re.fullmatch(r"cmpl-\d{1,3}", text["id"])
    assert list(text["choices"][0]) == ["text", "index", "finish_reason"]
    assert 1 <= text["usage"]["completion_tokens"] <= 8
    streamed = sse(ollama.post("/v1/completions", {**prompt, "stream": True}))
    assert streamed[-1] == "[DONE]" and streamed[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_runner_is_the_real_llama_server_a_child_of_ollama_serve(ollama: Ollama) -> None:
    ollama.post("/api/generate", {"model": NAME})  # an empty prompt loads the model
    serve = psutil.Process(ollama.launched.pid)
    assert serve.cmdline()[1:3] == [str(STANDIN), "serve"]
    (runner,) = ollama.runners()
    assert runner.ppid() == serve.pid and runner.status() != psutil.STATUS_ZOMBIE
    argv = runner.cmdline()
    assert argv[1:3] == ["--model", str(demo_model_path())]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("-c") + 1] == "4096" and argv[argv.index("-np") + 1] == "1"
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-b") + 1] == "512"
    assert argv[argv.index("--flash-attn") + 1] == "auto"
    assert {"--no-webui", "--offline", "--context-shift"} <= set(argv)
    health = httpx.get(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health", timeout=5)
    assert health.json() == {"status": "ok"}  # the runner's own port, loopback only


def test_keep_alive_zero_unloads_after_answering(ollama: Ollama) -> None:
    body = {"model": NAME, "stream": False, "options": {"num_predict": 2},
            "messages": [{"role": "user", "content": "hi"}]}
    first = ollama.post("/api/chat", body).json()
    assert first["done"] is True and ollama.ps()
    assert len(ollama.runners()) == 1

    last = ollama.post("/api/chat", {**body, "keep_alive": 0}).json()
    assert last["done"] is True and last["eval_count"] >= 1
    until(lambda: not ollama.ps(), "/api/ps to be empty after keep_alive 0", timeout=10,
          detail=ollama.ps)
    # gone means reaped too: /api/ps empties as the unload starts, and the runner stays a zombie child of the
    # stand-in until its asyncio wait() has reaped it (a fresh clone once listed it here a moment too early)
    until(lambda: ollama.runners() == [], "the runner to be gone", timeout=10, detail=ollama.runners)

    # the next request loads it again, and an empty prompt with keep_alive 0 unloads it at once
    loaded = ollama.post("/api/generate", {"model": NAME}).json()
    assert loaded["done_reason"] == "load" and len(ollama.ps()) == 1
    unloaded = ollama.post("/api/generate", {"model": NAME, "keep_alive": 0}).json()
    assert list(unloaded) == ["model", "created_at", "response", "done", "done_reason"]
    assert unloaded["done_reason"] == "unload"
    until(lambda: not ollama.ps(), "/api/ps to be empty after an unload request", timeout=10)


def test_environment_sets_parallel_context_and_keep_alive() -> None:
    server = start_ollama("--preload", env={"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "2048",
                                            "OLLAMA_KEEP_ALIVE": "5s"})
    try:
        until(server.ps, "the preloaded model in /api/ps", timeout=60)
        (entry,) = server.ps()
        assert entry["context_length"] == 2048
        left = go_time(entry["expires_at"]) - dt.datetime.now(dt.UTC)
        assert dt.timedelta(0) < left <= dt.timedelta(seconds=5)
        (runner,) = server.runners()
        argv = runner.cmdline()
        assert argv[argv.index("-c") + 1] == "4096" and argv[argv.index("-np") + 1] == "2"
        started = time.monotonic()
        until(lambda: not server.ps(), "the keep-alive to run out", timeout=15)
        assert time.monotonic() - started < 7
        until(lambda: not server.runners(), "the runner to exit", timeout=10)
    finally:
        stop_group(server.launched)
