"""How much of a prompt an earlier prompt already began with: what a prefix cache could have served.

Prompts are compared by chained hashes of their leading blocks (tokens, or a workload's hash ids): a block
counts as shared when an earlier prompt had the same tokens up to and including it. Bounded: the oldest blocks
are forgotten first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BLOCK = 16  # tokens: finer than any engine's cache block (vLLM 16 on GPU, 128 on CPU; llama.cpp per token)
MAX_BLOCKS = 200_000


class SharedPrefixes:
    def __init__(self, block: int = BLOCK, max_blocks: int = MAX_BLOCKS) -> None:
        self.block = block
        self.max_blocks = max_blocks
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def _remember(self, key: bytes) -> bool:
        """Whether the block was seen before; it becomes the newest either way."""
        seen = key in self._seen
        if seen:
            self._seen.move_to_end(key)
        else:
            self._seen[key] = None
            if len(self._seen) > self.max_blocks:
                self._seen.popitem(last=False)
        return seen

    def tokens(self, tokens: Sequence[int]) -> int:
        """Leading tokens of this prompt that an earlier one began with, in whole blocks; then remembered."""
        parent = b""
        shared = 0
        leading = True
        for start in range(0, len(tokens) - len(tokens) % self.block, self.block):
            data = array("q", tokens[start:start + self.block]).tobytes()
            parent = hashlib.blake2b(parent + data, digest_size=16).digest()
            if self._remember(parent) and leading:
                shared += self.block
            else:
                leading = False
        return shared


def shared_by_ids(ids_seen: set[int], hash_ids: Sequence[int], block_size: int, input_length: int) -> int:
    """A workload's request: its leading hash ids that an earlier request had, in tokens (capped at its
    length); the ids are added to `ids_seen`. Mooncake-style ids are chained: an id seen means the same prefix
    up to that block."""
    shared = 0
    leading = True
    for i, block_id in enumerate(hash_ids):
        if leading and block_id in ids_seen:
            shared = min(input_length, (i + 1) * block_size)
        else:
            leading = False
        ids_seen.add(block_id)
    return shared
