"""Where a replay's prompts get their tokens when the engine cannot say (tui.workload.prompts): a Hugging Face
tokenizer of the user's choosing, read from this machine with the `tokenizers` library (never downloaded),
or, with none, plain words counted as one token each, which makes lengths and block sharing approximate.

The engine's own /tokenize stays the first choice (tui.engines.tokens.EngineTokens): these serve a gateway, a
hosted API or an engine build without it, as AIPerf replays a trace with a tokenizer it is given.
"""

from __future__ import annotations

import os
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


class LocalTokens:
    """A tokenizer.json read with the `tokenizers` library: the same calls EngineTokens answers."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # a Rust extension: loaded only when a tokenizer is asked for

        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception for a file it cannot read
            raise ValueError(f"--tokenizer: {path} is not a tokenizer the tokenizers library reads: {exc}") \
                from None
        self.path = path
        self.url = f"the tokenizer {path}"  # what messages name as where the tokens came from

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special).ids)

    async def one_token_words(self, words: list[str]) -> list[str]:
        encode = self.tokenizer.encode
        return [f" {w}" for w in words if len(encode(f" {w}", add_special_tokens=False).ids) == 1]


class WordTokens:
    """No tokenizer at all: every word counts as one token, with no special tokens. Lengths are then as the
    engine counts them only roughly, and equal hash ids still make equal text (so a prefix cache still sees
    the sharing), but where blocks end in the engine's tokens is not known."""

    approximate = True

    def __init__(self, url: str) -> None:
        self.url = url

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        return [0] * len(text.split())

    async def one_token_words(self, words: list[str]) -> list[str]:
        return [f" {w}" for w in words]


def _hub_cache() -> Path:
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache)
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def find_tokenizer(spec: str) -> Path:
    """A tokenizer.json from a file, a folder holding one, or a model name already in the Hugging Face cache
    (org/name: its newest snapshot). Nothing is downloaded; a spec found nowhere is a ValueError saying where
    it was looked for."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / TOKENIZER_FILE).is_file():
            return path / TOKENIZER_FILE
        raise ValueError(f"--tokenizer {spec}: the folder has no {TOKENIZER_FILE}")
    snapshots = _hub_cache() / f"models--{spec.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob(f"*/{TOKENIZER_FILE}"), key=lambda p: p.stat().st_mtime) \
        if snapshots.is_dir() else []
    if found:
        return found[-1]
    raise ValueError(f"--tokenizer {spec}: no such file or folder, and no {TOKENIZER_FILE} for it in the "
                     f"Hugging Face cache ({snapshots.parent}); give a tokenizer.json or its folder "
                     "(nothing is downloaded)")


def load_tokenizer(spec: str) -> LocalTokens:
    return LocalTokens(find_tokenizer(spec))
