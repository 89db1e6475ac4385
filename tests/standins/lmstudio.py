"""A loopback stand-in for LM Studio's local server (lmstudio.ai), which no package registry ships.

It answers as LM Studio's docs and its users' reports say it does (tests/standins/lmstudio_shapes.md has the
shapes and where each came from): the native REST API v0 (/api/v0/models, /api/v0/models/{id},
/api/v0/chat/completions, /api/v0/completions, /api/v0/embeddings) with its `stats`, `model_info` and
`runtime`; the v1 REST API's model list and non-streaming chat (/api/v1/models, /api/v1/chat); the
OpenAI-compatible /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings; /lmstudio-greeting,
which `lms` and the SDKs use to tell an LM Studio server; and, for every other path or method, HTTP 200 with
`{"error":"Unexpected endpoint or method. (GET /health)"}`, as Express answers in LM Studio (so /health and
/metrics answer that too: LM Studio has neither).

Generation is real: every request goes to a real llama-server (the upstream), and the figures LM Studio adds
(`stats`) are llama-server's own `timings` for that request: tokens_per_second = predicted_per_second,
time_to_first_token = prompt_ms / 1000, generation_time = predicted_ms / 1000. The model list is filled from
the upstream's /props (model_ftype, n_ctx, modalities, model_path) and /v1/models (n_ctx_train), and the
architecture from the GGUF file's own `general.architecture`.

    python tests/standins/lmstudio.py --port P --upstream http://127.0.0.1:Q --model-id google/gemma-3-270m

What it leaves out: JIT loading and unloading (one model, always loaded; a request naming another model is
served by it, as LM Studio does with one model loaded), models listed but not loaded, /v1/responses,
/v1/messages, /api/v1/chat streaming and the other /api/v1 routes, the SDK's websocket API, CORS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import string
import struct
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

# LM Studio's own ids: "chatcmpl-i3gkjwthhw96whukek9tz" (21 lowercase letters and digits after the prefix)
ID_CHARS = string.ascii_lowercase + string.digits
STOP_REASONS = {"stop": "eosFound", "length": "maxPredictedTokensReached", "tool_calls": "toolCalls"}
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
TOKEN_REQUIRED = (
    "An LM Studio API token is required to make requests to this server, but none was provided using the "
    "Authorization header using the 'Bearer' scheme (i.e., 'Authorization: Bearer $LM_API_TOKEN'). "
    "Learn more at: https://lmstudio.ai/docs/developer/core/authentication."
)


def new_id(prefix: str) -> str:
    return prefix + "".join(random.choices(ID_CHARS, k=21))


def compact(value: Any) -> str:
    """As Express's res.json writes it: JSON.stringify, no spaces."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=compact(data), status=status, content_type="application/json", charset="utf-8")


def openai_error(status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> web.Response:
    return reply({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


# ---- the model's facts, from the upstream ----------------------------------------------------------------


def gguf_architecture(path: str) -> str | None:
    """`general.architecture` from a GGUF file's header (by convention its first key), or None."""
    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return None
            version, _tensors, kv_count = struct.unpack("<IQQ", fh.read(20))
            if version < 2:
                return None

            def text() -> str:
                (length,) = struct.unpack("<Q", fh.read(8))
                return fh.read(length).decode("utf-8", "replace")

            def skip(kind: int) -> None:
                if kind in scalar:
                    fh.seek(scalar[kind], 1)
                elif kind == 8:
                    text()
                elif kind == 9:
                    inner, count = struct.unpack("<IQ", fh.read(12))
                    if inner in scalar:
                        fh.seek(scalar[inner] * count, 1)
                    else:
                        for _ in range(count):
                            skip(inner)
                else:
                    raise ValueError(f"GGUF value type {kind}")

            for _ in range(min(kv_count, 64)):
                key = text()
                (kind,) = struct.unpack("<I", fh.read(4))
                if key == "general.architecture" and kind == 8:
                    return text()
                skip(kind)
    except (OSError, ValueError, struct.error):
        return None
    return None


def lmstudio_quant(ftype: str | None) -> str | None:
    """llama.cpp's ftype name ("Q4_K - Medium", "IQ2_XXS - 2.0625 bpw", "all F32") as LM Studio writes a
    quantization ("Q4_K_M", "IQ2_XXS", "F32")."""
    if not ftype:
        return None
    name = ftype.replace(" (guessed)", "").strip()
    if name.startswith("all "):
        name = name[4:]
    base, _, size = name.partition(" - ")
    sizes = {"Small": "S", "Medium": "M", "Large": "L", "Extra Small": "XS"}
    return f"{base}_{sizes[size]}" if size in sizes else base


@dataclass
class Facts:
    """What LM Studio says about the loaded model, read from the upstream llama-server."""

    arch: str | None
    quant: str | None
    loaded_context: int | None  # n_ctx of a slot (/props default_generation_settings.n_ctx)
    max_context: int | None  # n_ctx_train (/v1/models meta), else the loaded context
    vision: bool
    build: str | None
    size_bytes: int | None
    params: int | None
    parallel: int | None


class Upstream:
    def __init__(self, url: str, model_id: str) -> None:
        self.url = url.rstrip("/")
        self.model_id = model_id
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        self._facts: Facts | None = None
        self._arch: dict[str, str | None] = {}

    async def get_json(self, path: str) -> Any:
        async with self.http.get(self.url + path) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    async def facts(self) -> Facts:
        if self._facts is not None:
            return self._facts
        props = await self.get_json("/props")
        models = await self.get_json("/v1/models")
        meta = next((m.get("meta") or {} for m in models.get("data") or [] if isinstance(m, dict)), {})
        settings = props.get("default_generation_settings") or {}
        path = props.get("model_path") or ""
        if path not in self._arch:
            self._arch[path] = await asyncio.to_thread(gguf_architecture, path) if path else None
        loaded = settings.get("n_ctx") if isinstance(settings.get("n_ctx"), int) else None
        train = meta.get("n_ctx_train") if isinstance(meta.get("n_ctx_train"), int) else None
        modalities = props.get("modalities") or {}
        self._facts = Facts(
            arch=self._arch[path], quant=lmstudio_quant(props.get("model_ftype")),
            loaded_context=loaded, max_context=train or loaded,
            vision=bool(isinstance(modalities, dict) and modalities.get("vision")),
            build=props.get("build_info"), size_bytes=meta.get("size"), params=meta.get("n_params"),
            parallel=props.get("total_slots"),
        )
        return self._facts

    async def close(self) -> None:
        await self.http.close()


# ---- the server -----------------------------------------------------------------------------------------


class LmStudio:
    def __init__(self, upstream: Upstream, api_token: str | None) -> None:
        self.up = upstream
        self.model_id = upstream.model_id
        self.api_token = api_token

    # -- model descriptions --

    def publisher(self) -> str:
        return self.model_id.split("/", 1)[0] if "/" in self.model_id else "lmstudio-community"

    async def v0_model(self) -> dict[str, Any]:
        f = await self.up.facts()
        return {
            "id": self.model_id, "object": "model", "type": "vlm" if f.vision else "llm",
            "publisher": self.publisher(), "arch": f.arch, "compatibility_type": "gguf",
            "quantization": f.quant, "state": "loaded", "max_context_length": f.max_context,
            "capabilities": [],
        }

    async def model_info(self) -> dict[str, Any]:
        f = await self.up.facts()
        return {"arch": f.arch, "quant": f.quant, "format": "gguf", "context_length": f.loaded_context}

    async def runtime(self) -> dict[str, Any]:
        f = await self.up.facts()
        # LM Studio names its engine pack and that pack's version; the version here is llama-server's build
        return {"name": "llama.cpp-linux-x86_64-avx2", "version": f.build or "unknown",
                "supported_formats": ["gguf"]}

    # -- middlewares --

    @web.middleware
    async def express(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every answer carries Express's header; a route that needs it checks the API token."""
        open_routes = (self.unexpected, self.greeting)
        if self.api_token is not None and request.match_info.handler not in open_routes and \
                request.headers.get("Authorization", "") != f"Bearer {self.api_token}":
            refusal = {"type": "invalid_request", "code": "invalid_api_key", "message": TOKEN_REQUIRED}
            response: web.StreamResponse = reply({"error": refusal}, 401)
        else:
            response = await handler(request)
        if not response.prepared:
            response.headers["X-Powered-By"] = "Express"
        return response

    # -- routes --

    async def unexpected(self, request: web.Request) -> web.Response:
        """Express's catch-all in LM Studio: HTTP 200 anyway (its log says "Returning 200 anyway")."""
        return reply({"error": f"Unexpected endpoint or method. ({request.method} {request.path_qs})"})

    async def greeting(self, request: web.Request) -> web.Response:
        return reply({"lmstudio": True})

    async def v0_models(self, request: web.Request) -> web.Response:
        return reply({"object": "list", "data": [await self.v0_model()]})

    async def v0_model_one(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.model_id:
            return openai_error(404, f'Model "{name}" not found. Please specify a valid model.',
                                code="model_not_found", param="model")
        return reply(await self.v0_model())

    async def v1_models(self, request: web.Request) -> web.Response:
        return reply({"data": [{"id": self.model_id, "object": "model", "owned_by": "organization_owner"}],
                      "object": "list"})

    async def api_v1_models(self, request: web.Request) -> web.Response:
        f = await self.up.facts()
        config: dict[str, Any] = {"context_length": f.loaded_context, "eval_batch_size": 512,
                                  "flash_attention": False, "offload_kv_cache_to_gpu": False}
        if f.parallel is not None:
            config["parallel"] = f.parallel
        digits = re.search(r"\d+", f.quant or "")
        bits = int(digits.group()) if digits else None
        return reply({"models": [{
            "type": "llm", "publisher": self.publisher(), "key": self.model_id,
            "display_name": self.model_id.rsplit("/", 1)[-1], "architecture": f.arch,
            "quantization": {"name": f.quant, "bits_per_weight": bits}, "size_bytes": f.size_bytes,
            "params_string": _params_string(f.params),
            "loaded_instances": [{"id": self.model_id, "config": config}],
            "max_context_length": f.max_context, "format": "gguf",
            "capabilities": {"vision": f.vision, "trained_for_tool_use": False}, "description": None,
        }]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/chat/completions", native=request.path.startswith("/api/"))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/completions", native=request.path.startswith("/api/"))

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        async with self.up.http.post(self.up.url + "/v1/embeddings", json=body) as upstream:
            data = await upstream.json(content_type=None)
        if upstream.status != 200:
            return _upstream_error(upstream.status, data)
        data["model"] = self.model_id
        return reply(data)

    async def api_v1_chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        if body.get("stream"):
            return openai_error(400, "streaming /api/v1/chat is not part of this stand-in")
        given = body.get("input")
        messages: list[dict[str, Any]] = []
        if body.get("system_prompt"):
            messages.append({"role": "system", "content": body["system_prompt"]})
        if isinstance(given, str):
            messages.append({"role": "user", "content": given})
        elif isinstance(given, list):
            for item in given:
                if isinstance(item, dict) and item.get("type") in ("message", "text"):
                    messages.append({"role": "user", "content": item.get("content", "")})
        else:
            return openai_error(400, "'input' is required", param="input")
        upstream_body = {"messages": messages, "stream": False}
        for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty"):
            if name in body:
                upstream_body[name] = body[name]
        if "max_output_tokens" in body:
            upstream_body["max_tokens"] = body["max_output_tokens"]
        async with self.up.http.post(self.up.url + "/v1/chat/completions", json=upstream_body) as upstream:
            data = await upstream.json(content_type=None)
        if upstream.status != 200:
            return _upstream_error(upstream.status, data)
        timings = data.get("timings") or {}
        usage = data.get("usage") or {}
        message = (data.get("choices") or [{}])[0].get("message") or {}
        output = []
        if message.get("reasoning_content"):
            output.append({"type": "reasoning", "content": message["reasoning_content"]})
        output.append({"type": "message", "content": message.get("content") or ""})
        result: dict[str, Any] = {
            "model_instance_id": self.model_id, "output": output,
            "stats": {"input_tokens": usage.get("prompt_tokens"),
                      "total_output_tokens": usage.get("completion_tokens"), "reasoning_output_tokens": 0,
                      "tokens_per_second": timings.get("predicted_per_second"),
                      "time_to_first_token_seconds": _seconds(timings.get("prompt_ms"))},
        }
        if body.get("store", True):
            result["response_id"] = "resp_" + "".join(random.choices("0123456789abcdef", k=48))
        return reply(result)

    # -- generation --

    async def _generate(self, request: web.Request, path: str, native: bool) -> web.StreamResponse:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        chat = path.endswith("/chat/completions")
        if chat and not isinstance(body.get("messages"), list):
            return openai_error(400, "'messages' field is required", param="messages")
        if not chat and "prompt" not in body:
            return openai_error(400, "'prompt' field is required", param="prompt")
        upstream_body = {k: v for k, v in body.items() if k not in ("ttl", "draft_model", "preset")}
        upstream_body["model"] = self.model_id
        if body.get("stream"):
            return await self._stream(request, path, upstream_body, native, chat)
        upstream_body["stream"] = False
        async with self.up.http.post(self.up.url + path, json=upstream_body) as upstream:
            data = await upstream.json(content_type=None)
        if upstream.status != 200:
            return _upstream_error(upstream.status, data)
        choices = []
        for choice in data.get("choices") or []:
            entry: dict[str, Any] = {"index": choice.get("index", 0)}
            if chat:
                entry.update(logprobs=None, finish_reason=choice.get("finish_reason"),
                             message=_message(choice.get("message") or {}))
            else:
                entry.update(text=choice.get("text", ""), logprobs=None,
                             finish_reason=choice.get("finish_reason"))
            choices.append(entry)
        usage = data.get("usage") or {}
        result: dict[str, Any] = {
            "id": new_id("chatcmpl-" if chat else "cmpl-"),
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.model_id, "choices": choices,
            "usage": {k: usage.get(k) for k in USAGE_KEYS},
        }
        if native:
            timings = data.get("timings") or {}
            finish = choices[0].get("finish_reason") if choices else None
            result["stats"] = {
                "tokens_per_second": timings.get("predicted_per_second"),
                "time_to_first_token": _seconds(timings.get("prompt_ms")),
                "generation_time": _seconds(timings.get("predicted_ms")),
                "stop_reason": STOP_REASONS.get(finish or "", "eosFound"),
            }
            result["model_info"] = await self.model_info()
            result["runtime"] = await self.runtime()
        else:
            # reported by LM Studio 0.3.14 users: the OpenAI-compatible answer carries an empty `stats`
            result["stats"] = {}
            result["system_fingerprint"] = self.model_id
        return reply(result)

    async def _stream(self, request: web.Request, path: str, upstream_body: dict[str, Any], native: bool,
                      chat: bool) -> web.StreamResponse:
        """OpenAI-style SSE. LM Studio puts no `stats` or `usage` in a stream, except the usage chunk the
        OpenAI-compatible routes send when asked with stream_options.include_usage (0.3.18 and later)."""
        want_usage = not native and bool((upstream_body.get("stream_options") or {}).get("include_usage"))
        upstream_body["stream"] = True
        upstream_body["stream_options"] = {"include_usage": True}
        ident = new_id("chatcmpl-" if chat else "cmpl-")
        created = int(time.time())
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": self.model_id, "system_fingerprint": self.model_id}
        async with self.up.http.post(self.up.url + path, json=upstream_body) as upstream:
            if upstream.status != 200:
                return _upstream_error(upstream.status, await upstream.json(content_type=None))
            response = web.StreamResponse(headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive",
                "X-Powered-By": "Express"})
            await response.prepare(request)
            async for raw in upstream.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    continue
                if "error" in chunk:
                    await response.write(f"data: {compact({'error': chunk['error']})}\n\n".encode())
                    continue
                for choice in chunk.get("choices") or []:
                    out: dict[str, Any] = {"index": choice.get("index", 0)}
                    if chat:
                        out["delta"] = _message(choice.get("delta") or {})
                    else:
                        out["text"] = choice.get("text", "")
                    out.update(logprobs=None, finish_reason=choice.get("finish_reason"))
                    await response.write(f"data: {compact({**head, 'choices': [out]})}\n\n".encode())
                if want_usage and chunk.get("usage") and not chunk.get("choices"):
                    usage = {k: chunk["usage"].get(k) for k in USAGE_KEYS}
                    last = {**head, "choices": [], "usage": usage}
                    await response.write(f"data: {compact(last)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI message (or delta) fields LM Studio sends, without llama-server's own."""
    keep = ("role", "content", "reasoning_content", "tool_calls")
    return {k: message[k] for k in keep if k in message and message[k] is not None}


def _seconds(ms: Any) -> float | None:
    """LM Studio's seconds, to the millisecond ("time_to_first_token": 0.111)."""
    return round(ms / 1000, 3) if isinstance(ms, int | float) else None


def _params_string(params: Any) -> str | None:
    if not isinstance(params, int) or params <= 0:
        return None
    return f"{params / 1e9:.3g}B" if params >= 1e9 else f"{round(params / 1e6)}M"


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except ValueError:
        return openai_error(400, "Invalid JSON in request body")
    if not isinstance(body, dict):
        return openai_error(400, "Request body must be a JSON object")
    return body


def _upstream_error(status: int, data: Any) -> web.Response:
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code") if isinstance(error.get("code"), str) else None
        kind = str(error.get("type", "server_error"))
        return openai_error(status, str(error.get("message", "")), kind=kind, code=code)
    return openai_error(status, str(error or data), kind="server_error")


def app_for(server: LmStudio) -> web.Application:
    app = web.Application(middlewares=[server.express], client_max_size=64 * 1024 * 1024)
    routes = [
        ("GET", "/api/v0/models", server.v0_models),
        ("GET", "/api/v0/models/{model:.+}", server.v0_model_one),
        ("POST", "/api/v0/chat/completions", server.chat),
        ("POST", "/api/v0/completions", server.completions),
        ("POST", "/api/v0/embeddings", server.embeddings),
        ("GET", "/api/v1/models", server.api_v1_models),
        ("POST", "/api/v1/chat", server.api_v1_chat),
        ("GET", "/v1/models", server.v1_models),
        ("POST", "/v1/chat/completions", server.chat),
        ("POST", "/v1/completions", server.completions),
        ("POST", "/v1/embeddings", server.embeddings),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, handler)
    # without a token: the greeting (lms asks it before it authenticates) and the catch-all
    app.router.add_get("/lmstudio-greeting", server.greeting)
    app.router.add_route("*", "/{tail:.*}", server.unexpected)
    return app


async def serve(port: int, upstream_url: str, model_id: str, api_token: str | None) -> None:
    upstream = Upstream(upstream_url, model_id)
    server = LmStudio(upstream, api_token)
    deadline = time.monotonic() + 120
    while True:  # LM Studio lists the model once it is loaded: wait for the upstream's facts
        try:
            await upstream.facts()
            break
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"upstream {upstream_url} gave no /props in 120 s: {exc}") from exc
            await asyncio.sleep(0.2)
    runner = web.AppRunner(app_for(server), handle_signals=False, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"LM Studio stand-in listening on 127.0.0.1:{port}, model {model_id} at {upstream_url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await upstream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=1234)
    parser.add_argument("--upstream", required=True, help="the llama-server's base URL")
    parser.add_argument("--model-id", default="google/gemma-3-270m", help="the model's LM Studio key")
    parser.add_argument("--api-token", help="require this bearer token (LM Studio's Require Authentication)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.upstream, args.model_id, args.api_token))


if __name__ == "__main__":
    main()
