"""Where a key is in a TOML file's raw text.

tomllib keeps no positions, so the line of a key is found again in the text: a mistake in a profile, found
when it is parsed or only when it is resolved for a start, then points at the line a user has to edit.
"""

from __future__ import annotations

import re


class KeyLines:
    """Finds the line of `key` (top level or inside [table]) in the raw TOML text."""

    _HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]\s*(#.*)?$")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def key(self, key: str, table: str | None = None) -> int | None:
        pattern = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")
        current: str | None = None
        for number, line in enumerate(self.lines, start=1):
            header = self._HEADER.match(line)
            if header and not line.lstrip().startswith("[["):
                current = header.group(1).strip("\"'")
                continue
            if current == table and pattern.match(line):
                return number
        if table is not None:  # inline table: env = { A = "b" }
            return self.key(table)
        return None

    def text(self, needle: str, after: int | None = None) -> int | None:
        start = (after or 1) - 1
        for number, line in enumerate(self.lines[start:], start=start + 1):
            if needle in line:
                return number
        return after
