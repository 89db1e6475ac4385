"""What a test saw, printed for `pytest -rP` (each finding as it fired, the figures a check rests on)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


def show(label: str, value: Any) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    print(f"{label}: {json.dumps(value, default=str, ensure_ascii=False)}")
