"""Ollama's native API for probes: knowing a server is Ollama, and its request and stream shapes.

Ollama answers OpenAI's /v1/chat/completions too, but without its own timings; its native /api/chat and
/api/generate end every stream with the server's counts and durations (api.Metrics in Ollama's
api/types.go: total_duration, load_duration, prompt_eval_count, prompt_eval_duration, eval_count,
eval_duration, in nanoseconds), so a probe of an Ollama server speaks the native API and those figures are
the server side of the probe (tui.probe.timings.ServerTimings.from_ollama).

The stream is NDJSON, not SSE (server/routes.go streamResponse: Content-Type application/x-ndjson, one
JSON object a line): api.ChatResponse (message.content, message.thinking) or api.GenerateResponse
(response, thinking); the last has done: true, done_reason ("stop", "length"; "load" or "unload" for a
request without a prompt) and the metrics. An error after the stream began is a line {"error": "..."};
before it, an HTTP status with the same object.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from tui.net.keepalive import Transports, exchange

OLLAMA_CHAT_PATH = "/api/chat"
OLLAMA_GENERATE_PATH = "/api/generate"  # with "raw": true, a prompt without the chat template
VERSION_PATH = "/api/version"
TAGS_PATH = "/api/tags"  # the models it has
PS_PATH = "/api/ps"  # the models loaded now
NDJSON = "application/x-ndjson"

# What a target's optional `api` attribute may say: "ollama" (speak Ollama's native API without asking),
# "openai" (never ask, never speak it). Absent or None: ask the server once (ProbeClient).
API_OLLAMA = "ollama"
API_OPENAI = "openai"

CHECK_CAP_BYTES = 1 << 20  # /api/tags lists every model with its details: a few kB each
# The whole check (two or three small GETs, on one connection): the probe's connect_s and this. A server
# that does not answer in time is asked again by the next probe (nothing is known of it).
CHECK_ANSWER_S = 5.0


@dataclass(frozen=True, slots=True)
class OllamaServer:
    """An Ollama server as its own answers showed it."""

    version: str | None  # /api/version; None when the target said it is Ollama and nothing was asked
    model: str | None  # what a probe names when its body and target name none: loaded now, else listed first


def _object(data: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _first_model(obj: dict[str, Any] | None) -> str | None:
    models = obj.get("models") if obj is not None else None
    for entry in models if isinstance(models, list) else ():
        if isinstance(entry, dict):
            for key in ("model", "name"):  # api.ListModelResponse / api.ProcessModelResponse
                if isinstance(name := entry.get(key), str) and name:
                    return name
    return None


def _lists_models(obj: dict[str, Any] | None) -> bool:
    return obj is not None and isinstance(obj.get("models"), list)


async def ask_server(base: str, headers: dict[str, str], connect_s: float,
                     known: bool = False) -> tuple[bool, OllamaServer | None]:
    """Whether the server at `base` (no trailing /v1) is Ollama: (answered, server). `answered` False: no
    HTTP answer came (refused, timed out): nothing is known, ask again next time. `known`: the target said
    it is Ollama: only its models are asked for.

    Ollama is a server whose GET /api/version answers 200 with a JSON object holding a string "version"
    (routes.go: gin.H{"version": version.Version}) and whose /api/ps or /api/tags answers a JSON object with
    a list "models". Both, because either alone is copied: servers that serve clients written for Ollama
    answer an Ollama-shaped /api/tags, and /api/version is a common path for any web app. The engines
    enginetop reads otherwise (llama-server, vLLM, SGLang) answer /api/version 404, LM Studio a 200 that is
    no JSON ("Unexpected endpoint"): for them the check costs one GET, once per base URL per ProbeClient."""
    transports = Transports(max_idle_per_origin=1)  # one connection carries all the GETs, closed after
    try:
        async with asyncio.timeout(connect_s + CHECK_ANSWER_S):
            async def get(path: str) -> dict[str, Any] | None:
                transport = transports.for_url(base + path)
                status, data, over = await exchange(transport, "GET", base + path,
                                                    {"Accept": "application/json", **headers},
                                                    CHECK_CAP_BYTES, connect_s, error_cap=0)
                return _object(data) if status == 200 and not over else None

            version: str | None = None
            if not known:
                answer = await get(VERSION_PATH)
                if answer is None or not isinstance(answer.get("version"), str):
                    return True, None
                version = answer["version"]
            # A model loaded now is the one a probe should name: naming another would load it first.
            ps = await get(PS_PATH)
            model = _first_model(ps)
            tags = None
            if model is None:
                tags = await get(TAGS_PATH)
                model = _first_model(tags)
            if not known and not (_lists_models(ps) or _lists_models(tags)):
                return True, None
            return True, OllamaServer(version, model)
    except (httpx.HTTPError, httpx.InvalidURL, OSError, TimeoutError):
        return False, None
    finally:
        await transports.aclose()


def _text(content: Any) -> str:
    """A message's content as Ollama takes it (a string): OpenAI's list of parts becomes their text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return "" if content is None else str(content)


def request_body(body: dict[str, Any], raw: bool, model: str | None) -> dict[str, Any]:
    """The OpenAI-shaped body a workload built, as Ollama's api.ChatRequest (or, `raw`, api.GenerateRequest
    with "raw": true: the prompt's tokens are exactly the text's, as on /v1/completions), streamed.

    OpenAI's max_tokens / max_completion_tokens, temperature, top_p, seed and stop become api.Options
    (num_predict, temperature, top_p, seed, stop). `ignore_eos` has no Ollama option (api.Options has none,
    and Ollama does not pass llama.cpp's through): a probe asking for a fixed length may end early, with
    done_reason "stop", as Ollama does; its counts say how many tokens it did make. Neither has min_tokens.
    chat_template_kwargs.enable_thinking false is Ollama's think: false. Other OpenAI fields (n,
    stream_options, return_progress, ...) have nothing to become and are left out."""
    options: dict[str, Any] = {}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(limit, int) and not isinstance(limit, bool):
        options["num_predict"] = limit
    for key in ("temperature", "top_p", "seed"):
        if body.get(key) is not None:
            options[key] = body[key]
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop:
        options["stop"] = stop
    out: dict[str, Any] = {"model": model or ""}
    if raw:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        out |= {"prompt": prompt if isinstance(prompt, str) else "", "raw": True}
    else:
        out["messages"] = [{"role": str(m.get("role", "user")), "content": _text(m.get("content"))}
                           for m in body.get("messages") or () if isinstance(m, dict)]
        kwargs = body.get("chat_template_kwargs")
        if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False:
            out["think"] = False
    out["stream"] = True
    if options:
        out["options"] = options
    return out


def chunk_text(obj: dict[str, Any]) -> str:
    """The generated text one NDJSON line carries: thinking and content (chat) or response (generate)."""
    piece = ""
    message = obj.get("message")
    part = message if isinstance(message, dict) else obj
    if isinstance(thinking := part.get("thinking"), str):
        piece += thinking
    if isinstance(content := part.get("content" if part is message else "response"), str):
        piece += content
    return piece
