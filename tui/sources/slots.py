"""llama-server's GET /slots as a SlotsReading: every field where the server has it, None where an older
server does not (the n_prompt_tokens fields are recent, n_prompt_tokens_cache came in 2026; next_token was an
object before it was a list), and a message instead of slots when it answers otherwise (--no-slots: 501)."""

from __future__ import annotations

import orjson

from tui.model.slots import SlotsReading, SlotState
from tui.net.policy import error_text
from tui.sources.json_answers import strict_int

SLOTS_PATH = "/slots"


def parse_slots(status: int, body: bytes) -> SlotsReading:
    if status == 501:
        return SlotsReading(error="/slots is off: start llama-server without --no-slots to see each slot")
    if status != 200:
        detail = error_text(body)
        return SlotsReading(error=f"{SLOTS_PATH} answered HTTP {status}" + (f": {detail}" if detail else ""))
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return SlotsReading(error=f"{SLOTS_PATH} is not JSON")
    if not isinstance(data, list):
        return SlotsReading(error=f"{SLOTS_PATH} is not a list of slots")
    slots = []
    for item in data:
        if not isinstance(item, dict) or strict_int(item.get("id")) is None:
            return SlotsReading(error=f"{SLOTS_PATH}: a slot without an id")
        nxt = item.get("next_token")  # a list of one since 2025; an object before
        nxt = nxt[0] if isinstance(nxt, list) and nxt else nxt
        nxt = nxt if isinstance(nxt, dict) else {}
        slots.append(SlotState(
            id=item["id"], n_ctx=strict_int(item.get("n_ctx")), processing=bool(item.get("is_processing")),
            speculative=bool(item.get("speculative")), task=strict_int(item.get("id_task")),
            prompt_tokens=strict_int(item.get("n_prompt_tokens")),
            prompt_processed=strict_int(item.get("n_prompt_tokens_processed")),
            prompt_cached=strict_int(item.get("n_prompt_tokens_cache")),
            decoded=strict_int(nxt.get("n_decoded")), remaining=strict_int(nxt.get("n_remain"))))
    return SlotsReading(tuple(sorted(slots, key=lambda s: s.id)))
