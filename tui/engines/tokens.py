"""An engine's own tokenizer, through its HTTP endpoints (no tokenizer library): llama.cpp's /tokenize
({"content"} -> {"tokens"}, pieces on request) and /apply-template, or vLLM's /tokenize ({"prompt"} or
{"messages"} -> {"tokens"}), whichever the engine answers. The proxy's trace counts a chat request's tokens
with it (template applied); a bench makes prompts in the engine's tokens with it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson


class EngineTokens:
    def __init__(self, client: httpx.AsyncClient, url: str, model: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.model = model
        self.headers = headers or {}
        self.llama: bool | None = None  # which spelling the engine takes, found on the first call

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        """The JSON answer, or None when the engine answers otherwise (or not at all)."""
        try:
            reply = await self.client.post(self.url + path, content=orjson.dumps(payload),
                                           headers={**self.headers, "Content-Type": "application/json"})
            return orjson.loads(reply.content) if reply.status_code == 200 else None
        except (httpx.HTTPError, orjson.JSONDecodeError):
            return None

    async def _tokens(self, path: str, payload: dict[str, Any]) -> list[int] | None:
        answer = await self._post(path, payload)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            return None
        ids: list[int] = []
        for token in tokens:  # ids, or {"id", "piece"} when pieces were asked for
            value = token.get("id") if isinstance(token, dict) else token
            if not isinstance(value, int) or isinstance(value, bool):
                return None
            ids.append(value)
        return ids

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        """The tokens of a raw prompt (`special`: with those the engine adds, a BOS). Raises when neither
        spelling is answered."""
        if self.llama is not False:
            tokens = await self._tokens("/tokenize", {"content": text, "add_special": special})
            if tokens is not None:
                self.llama = True
                return tokens
            self.llama = False
        tokens = await self._tokens("/tokenize", {"model": self.model, "prompt": text,
                                                  "add_special_tokens": special})
        if tokens is None:
            raise ValueError(f"the engine at {self.url} did not tokenize (llama.cpp's or vLLM's /tokenize)")
        return tokens

    async def chat(self, messages: list[Any], tools: Any = None) -> list[int] | None:
        """A chat request's prompt tokens as the engine makes them, its chat template applied (llama.cpp:
        /apply-template then /tokenize; vLLM: /tokenize with the messages). None when neither answers."""
        template: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools is not None else {})}
        prompt = await self._post("/apply-template", template)
        if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
            return await self._tokens("/tokenize", {"content": prompt["prompt"], "add_special": True,
                                                    "parse_special": True})
        return await self._tokens("/tokenize", {"model": self.model, "messages": messages,
                                                "add_generation_prompt": True})

    async def prompt(self, text: str) -> list[int] | None:
        """A raw prompt's tokens as the engine counts them (its special tokens included); None when neither
        spelling answers."""
        try:
            return await self.tokenize(text, special=True)
        except ValueError:
            return None

    async def one_token_words(self, words: list[str]) -> list[str]:
        """The words (each with its leading space) the engine makes exactly one token of."""
        await self.tokenize(" probe")  # settles which spelling
        if self.llama:
            answer = await self._post("/tokenize", {"content": "".join(f" {w}" for w in words),
                                                    "with_pieces": True})
            if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
                raise ValueError(f"the engine at {self.url} did not give the pieces of its tokens")
            pieces = {p["piece"] for p in answer["tokens"] if isinstance(p, dict) and "piece" in p}
            return [f" {w}" for w in words if f" {w}" in pieces]
        counts = await asyncio.gather(*(self.tokenize(f" {w}") for w in words))
        return [f" {w}" for w, c in zip(words, counts, strict=True) if len(c) == 1]
