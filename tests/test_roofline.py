"""Roofline: ceiling from bytes and bandwidth, sizing a model on disk, and the two-platform cross-check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.compare.roofline import (
    cross_platform,
    decode_ceiling_tps,
    model_weight_bytes,
    parse_bandwidth,
    parse_bytes,
    roofline,
)


def test_seed_numbers_rtx5090() -> None:
    r = roofline(parse_bytes("14GB"), parse_bandwidth("1.79TB/s"), measured_tps=57.0)
    assert r.ceiling_tps == pytest.approx(127.9, abs=0.1)  # the seeds round this to ~124 with 14.4 GB
    assert r.pct_of_ceiling == pytest.approx(44.6, abs=0.1)


def test_seed_numbers_b200() -> None:
    r = roofline(14e9, 8e12, measured_tps=133.7)
    assert r.ceiling_tps == pytest.approx(571.4, abs=0.1)
    assert r.pct_of_ceiling == pytest.approx(23.4, abs=0.1)


def test_units() -> None:
    assert parse_bytes("15.5 GiB") == 15.5 * 2**30
    assert parse_bytes("1.4e10") == 1.4e10
    assert parse_bandwidth("900 GB/s") == 900e9
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes("lots")
    with pytest.raises(ValueError, match="not a bandwidth"):
        parse_bandwidth("900GB")
    with pytest.raises(ValueError, match="positive"):
        decode_ceiling_tps(0, 1e9)


def test_model_weight_bytes_file_shards_and_dir(tmp_path: Path) -> None:
    single = tmp_path / "m.gguf"
    single.write_bytes(b"x" * 1000)
    assert model_weight_bytes(single) == 1000
    for i, size in enumerate((300, 200, 100), start=1):
        (tmp_path / f"big-{i:05d}-of-00003.gguf").write_bytes(b"x" * size)
    assert model_weight_bytes(tmp_path / "big-00002-of-00003.gguf") == 600
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model-1.safetensors").write_bytes(b"x" * 70)
    (hf / "model-2.safetensors").write_bytes(b"x" * 30)
    (hf / "pytorch_model.bin").write_bytes(b"x" * 100)  # a duplicate format: not counted twice
    (hf / "config.json").write_text("{}")
    assert model_weight_bytes(hf) == 100
    with pytest.raises(ValueError, match="no weight files"):
        model_weight_bytes(_empty(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        model_weight_bytes(tmp_path / "missing.gguf")


def _empty(tmp_path: Path) -> Path:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("no weights")
    return empty


def test_cross_check_constant_ratio_is_a_hardware_gap() -> None:
    # seeds: aggregate ratio of the two platforms stayed at 38-42% at concurrency 1, 8, 32
    fast = {1: 140.0, 8: 1000.0, 32: 2600.0}
    slow = {1: 140.0 * 0.38, 8: 1000.0 * 0.40, 32: 2600.0 * 0.42}
    check = cross_platform(fast, slow)
    assert check.levels == (1, 8, 32)
    assert check.verdict == "hardware gap"
    assert check.median_ratio == pytest.approx(0.40)


def test_cross_check_moving_ratio_is_configuration() -> None:
    # seeds' llama.cpp vs vLLM: 0.89x at 1, 14.7x at 32 - not a hardware difference
    llama = {1: 61.5, 4: 73.4, 8: 72.9, 16: 72.2}
    vllm = {1: 54.9, 4: 191.2, 8: 398.6, 16: 671.9, 32: 1057.8}
    check = cross_platform(llama, vllm)
    assert check.levels == (1, 4, 8, 16)
    assert check.verdict == "configuration-dependent"
    assert cross_platform({1: 5.0}, {1: 4.0}).verdict == "too few levels"
