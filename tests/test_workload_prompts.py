"""Prompts made from hash ids in the engine's own tokens: exact lengths, equal ids equal blocks, and on the
real llama-server the prompt cache follows the ids."""

from __future__ import annotations

import httpx
import pytest

from tui.engines.tokens import EngineTokens
from tui.model.workload import WorkloadRequest
from tui.workload.prompts import PromptMaker


def maker_with_pool(block: int = 4) -> PromptMaker:
    maker = PromptMaker(EngineTokens(httpx.AsyncClient(), "http://127.0.0.1:9"), block)
    maker.pool = [f" w{i}" for i in range(50)]  # as prepare() would find them: one token each
    return maker


def test_blocks_follow_the_ids_and_the_last_block_is_cut_to_the_length():
    maker = maker_with_pool()
    a, b = maker.text((0, 1, 2), 12), maker.text((0, 1, 3), 10)
    assert len(a.split()) == 12 and len(b.split()) == 10
    assert a.split()[:8] == b.split()[:8] and a.split()[8:10] != b.split()[8:10]
    assert maker.text((0, 1, 2), 12) == a  # the same ids, the same text, every time
    assert maker.text(None, 7) != maker.text(None, 7)  # no ids: fresh words each time
    with pytest.raises(ValueError, match="cannot hold"):
        maker.text((0, 1), 9)


def test_a_sessions_partial_last_block_is_made_as_the_start_of_the_block_that_replaced_it():
    maker = maker_with_pool()
    turns = [WorkloadRequest(line=1, session_id="s", input_length=6, hash_ids=(0, 7)),  # 4 + 2 tokens
             WorkloadRequest(line=2, session_id="s", input_length=10, hash_ids=(0, 1, 9)),  # block 1 full now
             WorkloadRequest(line=3, session_id="t", input_length=6, hash_ids=(0, 8))]  # another session
    before = maker.text((0, 8), 6)
    maker.follow_sessions(turns)
    first, second = maker.text((0, 7), 6), maker.text((0, 1, 9), 10)
    assert second.startswith(first)  # the next turn contains the previous prompt whole, as in the traffic
    assert maker.text((0, 8), 6) == before  # nothing else changes


@pytest.mark.engine
async def test_on_llama_server_lengths_are_exact_and_its_cache_follows_the_ids(llama_server):
    async with httpx.AsyncClient(timeout=60) as client:
        maker = PromptMaker(EngineTokens(client, llama_server.url), block_size=16, seed="test-prompts")
        await maker.prepare()
        assert len(maker.pool) >= 64
        first, turn, fresh = maker.text((0, 1), 32), maker.text((0, 1, 2), 45), maker.text(None, 45)
        assert [await maker.check(t) for t in (first, turn, fresh)] == [32, 45, 45]
        tokens = [await maker.tokens.tokenize(t) for t in (first, turn)]
        assert maker.special == 1  # Gemma's BOS, counted in a trace's lengths
        assert tokens[1][:len(tokens[0])] == tokens[0]  # the turn begins with the first request's tokens

        async def cached(prompt: str) -> int:
            reply = await client.post(f"{llama_server.url}/v1/completions",
                                      json={"prompt": prompt, "max_tokens": 1, "id_slot": 0})
            return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        await cached(first)
        hit = await cached(turn)  # extends the first: served from the prompt cache up to (nearly) its end
        miss = await cached(fresh)  # shares nothing
        assert 24 <= hit <= 33 and miss <= 1, (hit, miss)
