"""Roofline for decode: every generated token reads the weights once, so tok/s <= bandwidth / bytes.

Pure functions (no I/O except sizing a model path). The seeds' example: ~14 GB of weights per token
over 1.79 TB/s gives ~124 tok/s; their vLLM reached 57.0, i.e. 46% of the ceiling. For a
mixture-of-experts model pass the bytes actually read per token (active experts), not the file size.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth")


def parse_bytes(text: str) -> float:
    """'14GB', '15.53 GiB', '1.4e10' -> bytes. Decimal units are powers of 1000, binary ones of 1024."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 14GB, 15.5GiB, 1.4e10)")
    return float(match.group(1)) * _UNITS[unit]


def parse_bandwidth(text: str) -> float:
    """'1.79TB/s', '8 TB/s', '900GB/s' -> bytes per second."""
    stripped = text.strip()
    if not stripped.lower().endswith("/s"):
        raise ValueError(f"not a bandwidth: {text!r} (examples: 1.79TB/s, 900GB/s)")
    return parse_bytes(stripped[:-2])


def model_weight_bytes(path: str | Path) -> int:
    """Bytes of weights on disk: a .gguf file (every shard of a split one) or a model directory's weights."""
    p = Path(path)
    if p.is_file():
        shard = re.match(r"^(.*)-\d{5}-of-(\d{5})\.gguf$", p.name)
        if shard:
            siblings = sorted(p.parent.glob(f"{shard.group(1)}-*-of-{shard.group(2)}.gguf"))
            return sum(s.stat().st_size for s in siblings)
        return p.stat().st_size
    if p.is_dir():
        files = [f for f in p.rglob("*") if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)]
        # A directory with both formats (e.g. .safetensors and a converted .bin) is counted once.
        if any(f.suffix == ".safetensors" for f in files):
            files = [f for f in files if f.suffix == ".safetensors"]
        if not files:
            raise ValueError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) under {p}")
        return sum(f.stat().st_size for f in files)
    raise ValueError(f"model path does not exist: {p}")


def decode_ceiling_tps(bandwidth_bps: float, bytes_per_token: float) -> float:
    if bandwidth_bps <= 0 or bytes_per_token <= 0:
        raise ValueError("roofline: bandwidth and bytes per token must both be positive")
    return bandwidth_bps / bytes_per_token


def pct_of_ceiling(measured_tps: float, ceiling_tps: float) -> float:
    return measured_tps / ceiling_tps * 100.0


@dataclass(frozen=True, slots=True)
class Roofline:
    bytes_per_token: float
    bandwidth_bps: float
    ceiling_tps: float
    measured_tps: float | None = None
    pct_of_ceiling: float | None = None
    bandwidth_source: str = "given"  # "given" or "nvml"
    bytes_source: str = "given"  # "given" or the model path

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def roofline(
    bytes_per_token: float,
    bandwidth_bps: float,
    measured_tps: float | None = None,
    *,
    bandwidth_source: str = "given",
    bytes_source: str = "given",
) -> Roofline:
    ceiling = decode_ceiling_tps(bandwidth_bps, bytes_per_token)
    pct = pct_of_ceiling(measured_tps, ceiling) if measured_tps is not None else None
    return Roofline(
        bytes_per_token, bandwidth_bps, ceiling, measured_tps, pct, bandwidth_source, bytes_source
    )


CrossVerdict = Literal["hardware gap", "configuration-dependent", "too few levels"]
# Ratios within 15% of each other (max/min) count as constant: the seeds' 38-42% spread is 1.105.
DEFAULT_CONSTANT_TOLERANCE = 0.15


@dataclass(frozen=True, slots=True)
class CrossCheck:
    levels: tuple[int, ...]
    ratios: tuple[float, ...]  # b[level] / a[level]
    median_ratio: float | None
    spread: float | None  # max/min - 1
    verdict: CrossVerdict

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def cross_platform(
    a: Mapping[int, float], b: Mapping[int, float], tolerance: float = DEFAULT_CONSTANT_TOLERANCE
) -> CrossCheck:
    """Throughput ratio b/a at each concurrency level both platforms measured.

    A ratio that stays constant across concurrency is a hardware gap (the same code scaled by the
    machine); one that moves with batch size points at configuration or scheduling.
    """
    levels = tuple(sorted(k for k in a.keys() & b.keys() if a[k] > 0 and b[k] > 0))
    ratios = tuple(b[k] / a[k] for k in levels)
    if len(ratios) < 2:
        return CrossCheck(levels, ratios, ratios[0] if ratios else None, None, "too few levels")
    spread = max(ratios) / min(ratios) - 1
    verdict: CrossVerdict = "hardware gap" if spread <= tolerance else "configuration-dependent"
    return CrossCheck(levels, ratios, statistics.median(ratios), spread, verdict)
