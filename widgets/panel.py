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


def _same(a: Any, b: Any) -> bool:
    """The same picture: Text compares by its characters and styles, a Group by its parts; anything else
    (a Table) is taken as changed."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a == b
    if isinstance(a, Group) and isinstance(b, Group):
        pa, pb = a.renderables, b.renderables
        return len(pa) == len(pb) and all(_same(x, y) for x, y in zip(pa, pb, strict=True))
    return False


class Panel(Static):
    _shape: Any = None
    _last: Any = None

    def redraw(self, content: Any) -> None:
        if _same(content, self._last):
            return  # nothing changed: no repaint at all
        self._last = content
        shape = _lines(content)
        # A relayout walks every widget on the screen: pay for it only when a panel grew or shrank.
        self.update(content, layout=shape is None or shape != self._shape)
        self._shape = shape
