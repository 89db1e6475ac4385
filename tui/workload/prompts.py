"""Prompt text for a workload that has lengths and hash ids but no text, made in the target engine's own
tokens.

Equal hash ids must give identical blocks of exactly `block_size` tokens, so that on replay the engine's
prompt cache sees the traffic's own sharing. No tokenizer library is needed: the engine says which words are
one token each (llama.cpp's /tokenize with pieces, or vLLM's /tokenize word by word), a block is that many of
those words drawn by a generator seeded with its id, and each word carries its leading space, so that blocks
joined end to end tokenise as the blocks did. A request with a length and no ids gets words no other
request draws: fresh text that no cache can serve. `check` asks the engine to count a prompt's tokens.
"""

from __future__ import annotations

import random
from typing import Protocol

from tui.model.workload import WorkloadRequest
from tui.workload.tokenizer import WordTokens

# Everyday English words: most are one token in any large vocabulary (the engine decides which).
_WORD_TEXT = """
time year people way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community
name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air
teacher force education foot boy age policy music market sense nation plan college interest death
experience effect class control care field development role effort rate heart drug show leader light
voice wife police mind price report decision son view relationship town road arm difference value
building action model season society tax director position player record paper space ground form
event official matter center couple site project activity star table need court oil situation cost
industry figure street image phone data picture practice piece land product doctor wall patient
worker news test movie north love support technology step baby computer type attention film tree
source organization hair window evidence population site truth river stone garden bread paper glass
metal cloud rain snow wind fire sand ocean island forest valley bridge tower castle village market
harbor engine signal number color letter circle square table chair lamp clock mirror pencil basket
bottle candle carpet ladder needle pillow rocket saddle
"""
WORDS = _WORD_TEXT.split()


class Tokens(Protocol):
    """Whose tokens the prompts are made in: the engine's (tui.engines.tokens), a local tokenizer's, or plain
    words (tui.workload.tokenizer)."""

    url: str

    async def tokenize(self, text: str, special: bool = False) -> list[int]: ...

    async def one_token_words(self, words: list[str]) -> list[str]: ...


class PromptMaker:
    def __init__(self, tokens: Tokens, block_size: int, seed: str = "enginetop",
                 fresh_from: int = 0, fallback: bool = True) -> None:
        self.tokens = tokens
        # An engine that gives no token pieces (a gateway, a build without /tokenize): prompts from plain
        # words, said in `approximate`, rather than no replay at all. Off when the user named a tokenizer.
        self.fallback = fallback
        self.approximate: str | None = None
        self.block_size = block_size
        self.seed = seed
        self.pool: list[str] = []
        self._blocks: dict[int, str] = {}
        self._fresh = fresh_from  # makers that must not repeat each other's fresh text start apart
        self._start_of: dict[int, int] = {}  # a partial block id -> the full block it began (follow_sessions)
        self.special = 0  # tokens the engine adds to a raw prompt (prepare() asks it)

    async def prepare(self, min_words: int = 16) -> None:
        url = self.tokens.url
        whose = f"the engine at {url}" if url.startswith(("http://", "https://")) else url
        try:
            words = sorted(set(await self.tokens.one_token_words(WORDS)))
            why = f"{whose} makes one token of only {len(words)} of {len(WORDS)} common words"
        except ValueError as exc:  # no /tokenize (or no pieces from it)
            words, why = [], str(exc)
        if len(words) < min_words:
            if not self.fallback:
                raise ValueError(f"{why}: too few to build prompts from")
            self.approximate = (f"prompt lengths and block sharing are approximate ({why}): prompts are made "
                                "of words; --tokenizer PATH makes them exact")
            self.tokens = WordTokens(self.tokens.url)
            words = sorted(set(await self.tokens.one_token_words(WORDS)))
        self.pool = words
        # the engine puts its own tokens (a BOS) before a raw prompt, and the trace's lengths count them
        self.special = max(0, len(await self.tokens.tokenize(" probe", special=True))
                           - len(await self.tokens.tokenize(" probe")))

    def follow_sessions(self, requests: list[WorkloadRequest]) -> None:
        """A session's turn ends in a partial block, and the next turn, which extends it (an agent loop),
        has a full block with another id in its place: in the traffic the partial block was the start of
        that full one, so on replay it is made as that start too. The next turn then contains the previous
        prompt whole, as it did in the traffic (a cache that reuses a prompt only when the next one contains
        it whole, as llama.cpp's does for sliding-window models, behaves as it did)."""
        last: dict[str, WorkloadRequest] = {}
        for req in requests:
            if req.session_id is None or not req.hash_ids:
                continue
            prev = last.get(req.session_id)
            last[req.session_id] = req
            if prev is None or not prev.hash_ids or prev.input_length is None:
                continue
            n = len(prev.hash_ids)
            partial = prev.input_length % self.block_size
            if partial and len(req.hash_ids) >= n and req.hash_ids[:n - 1] == prev.hash_ids[:n - 1] \
                    and req.hash_ids[n - 1] != prev.hash_ids[n - 1]:
                self._start_of[prev.hash_ids[n - 1]] = req.hash_ids[n - 1]

    def _words(self, rng: random.Random, n: int) -> str:
        return "".join(rng.choice(self.pool) for _ in range(n))

    def block(self, hash_id: int) -> str:
        text = self._blocks.get(hash_id)
        if text is None:
            rng = random.Random(f"{self.seed}:id:{hash_id}")
            text = self._blocks[hash_id] = self._words(rng, self.block_size)
        return text

    def text(self, hash_ids: tuple[int, ...] | None, input_length: int) -> str:
        """A prompt the engine counts as `input_length` tokens (its own special tokens included): the blocks
        of `hash_ids` (the last one cut to what is left), or fresh words when there are no ids."""
        words = max(1, input_length - self.special)
        if not hash_ids:
            self._fresh += 1
            return self._words(random.Random(f"{self.seed}:fresh:{self._fresh}"), words)
        full = self.block_size * (len(hash_ids) - 1)
        last = words - full
        if not (last > 0 or (last == 0 and self.special)) or last > self.block_size:
            raise ValueError(f"{len(hash_ids)} ids of {self.block_size} tokens cannot hold {input_length}")
        head = "".join(self.block(h) for h in hash_ids[:-1])
        tail = self.block(self._start_of.get(hash_ids[-1], hash_ids[-1])) if last < self.block_size else \
            self.block(hash_ids[-1])
        return head + tail[: self._cut(tail, last)]

    @staticmethod
    def _cut(block: str, words: int) -> int:
        """Where the first `words` words of a block end (each word starts with its space)."""
        seen = 0
        for i, ch in enumerate(block):
            if ch == " ":
                if seen == words:
                    return i
                seen += 1
        return len(block)

    async def check(self, text: str) -> int:
        """How many tokens the engine makes of `text` as a raw prompt (its special tokens included)."""
        return len(await self.tokens.tokenize(text, special=True))
