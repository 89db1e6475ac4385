"""A Static that redraws every second without re-laying out the screen unless its height changed."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static


def _lines(content: Any) -> Any:
    if isinstance(content, Text):
        return content.plain.count("\n")
    if isinstance(content, Group):
        return tuple(_lines(part) for part in content.renderables)
    if isinstance(content, Table):
        return ("table", content.row_count)
    return None  # unknown: always lay out


class Panel(Static):
    _shape: Any = None
    _last: Any = None

    def redraw(self, content: Any) -> None:
        if isinstance(content, Text) and content == self._last:
            return  # nothing changed: no repaint at all
        self._last = content
        shape = _lines(content)
        # A relayout walks every widget on the screen: pay for it only when a panel grew or shrank.
        self.update(content, layout=shape is None or shape != self._shape)
        self._shape = shape
