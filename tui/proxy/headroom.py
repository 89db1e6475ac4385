"""What the proxy weighs an engine's real traffic against: the capacity `enginetop capacity` measured for it,
kept per engine URL in the user's config (capacity.json), with the SLO it was measured under. The proxy
judges each real streamed request against that SLO, so the dashboard can show the traffic's rate against the
capacity and the share of the last minutes' requests that met the SLO."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from tui.base.paths import config_dir

FILE_NAME = "capacity.json"


@dataclass(frozen=True)
class MeasuredCapacity:
    url: str
    engine: str
    capacity_rps: float
    slo: str
    attainment: float
    arrival: str
    workload: str
    wall: float  # when it was measured


def capacity_file() -> Path:
    return config_dir() / FILE_NAME


def _key(url: str) -> str:
    return url.rstrip("/")


def load_capacities(path: Path | None = None) -> dict[str, MeasuredCapacity]:
    """URL -> its newest measured capacity; a missing or unreadable file is none measured."""
    path = path or capacity_file()
    try:
        data = orjson.loads(path.read_bytes())
        return {_key(url): MeasuredCapacity(**item) for url, item in data.items()}
    except (OSError, orjson.JSONDecodeError, TypeError, AttributeError):
        return {}


def save_capacities(found: list[MeasuredCapacity], path: Path | None = None) -> Path:
    """Keep these (replacing what was measured before for the same URLs), written whole and then renamed, so
    a reader never sees half a file."""
    path = path or capacity_file()
    kept = load_capacities(path)
    kept.update({_key(c.url): c for c in found})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_bytes(orjson.dumps({url: asdict(c) for url, c in kept.items()}, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)
    return path
