"""Ollama's and LM Studio's answers read as their sources write them (tui.sources.native_servers) and said as
`ollama ps` says them (tui.live.glance)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tui.live.glance import keep_alive_words, processor_words
from tui.sources.native_servers import expires_wall, is_lmstudio, ollama_models

NOW = datetime(2026, 12, 7, 1, 27, 22, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-12-07T01:27:22.755948422Z", 0.755948),  # Go's RFC 3339 with nanoseconds, UTC
    ("2026-12-07T03:27:22.755948422+02:00", 0.755948),  # another zone: the same instant
    ("2026-12-07T01:27:22Z", 0.0),
    ("2026-12-06T20:27:22.5-05:00", 0.5),
])
def test_expires_at_in_any_zone_with_nanoseconds(text: str, seconds: float) -> None:
    assert expires_wall(text) == pytest.approx(NOW + seconds, abs=1e-5)


def test_keep_alive_words() -> None:
    assert keep_alive_words(NOW + 252.4, NOW) == "unloads in 4 min 12 s"
    assert keep_alive_words(NOW + 9, NOW) == "unloads in 9 s"
    assert keep_alive_words(NOW - 1, NOW) == "unloading"
    forever = expires_wall("2318-03-22T15:09:45.000000000+00:00")  # keep_alive -1: Ollama's far future
    assert keep_alive_words(forever, NOW) == "kept loaded"
    assert keep_alive_words(None, NOW) is None and expires_wall("not a time") is None


def test_processor_words_as_ollama_ps_says_them() -> None:
    assert processor_words(100, 0) == "100% CPU" and processor_words(100, 100) == "100% GPU"
    assert processor_words(100, 52) == "48%/52% CPU/GPU"
    assert processor_words(200, 101) == "50%/50% CPU/GPU"  # 49.5 rounds half away from zero, as Go does
    assert processor_words(100, 101) is None and processor_words(None, 5) is None


def test_ollama_models_and_lm_studio_fingerprint() -> None:
    ps = {"models": [{"name": "gemma3:270m", "size": 301046169, "size_vram": 0, "context_length": 4096,
                      "expires_at": "2026-12-07T01:27:22.755948422Z",
                      "details": {"quantization_level": "Q4_K_M", "parameter_size": "268.10M"}}]}
    qwen = {"name": "qwen3:8b", "size": 5 * 2**30, "details": {"quantization_level": "Q4_K_M"}}
    tags = {"models": [{"name": "gemma3:270m", "size": 253113220}, qwen]}
    loaded, other = ollama_models(ps, tags)
    assert (loaded.id, loaded.status, loaded.vram_bytes) == ("gemma3:270m", "loaded", 0)
    assert loaded.context_tokens == 4096
    assert (other.id, other.status, other.quantization) == ("qwen3:8b", "unloaded", "Q4_K_M")
    assert is_lmstudio({"lmstudio": True}, None)
    assert is_lmstudio(None, {"data": [{"id": "m", "state": "not-loaded"}]})
    assert not is_lmstudio(None, {"object": "list", "data": []})  # an empty list is anyone's
    assert not is_lmstudio({"version": "1"}, {"data": [{"id": "m"}]})
