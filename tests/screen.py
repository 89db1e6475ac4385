"""Read what a Textual app actually shows, from its own SVG export (what a user would see)."""

from __future__ import annotations

import html
import re

from textual.app import App

_TEXT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)


def screen_text(app: App) -> str:
    svg = app.export_screenshot()
    return html.unescape("".join(_TEXT.findall(svg))).replace("\xa0", " ")
