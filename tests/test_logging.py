"""enginetop.log stays useful and bounded: no line per HTTP request unless asked, rotated by size."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tui.cli.dashboard import LOG_BACKUPS, log_to_file
from tui.model.targets import EngineTarget
from tui.sources.engine import poll_engine


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


async def polls(url: str, n: int) -> None:
    async with httpx.AsyncHTTPTransport() as transport:
        for _ in range(n):
            await poll_engine(transport, EngineTarget("llama", url))


async def test_engine_requests_are_not_logged_by_default(llama_server, tmp_path: Path) -> None:
    path = tmp_path / "enginetop.log"
    log_to_file(path, logging.INFO)
    await polls(llama_server.url, 5)
    logging.getLogger("tui.ui.app").warning("a warning worth keeping")
    text = path.read_text()
    assert "a warning worth keeping" in text
    assert "HTTP" not in text and "/metrics" not in text


async def test_log_http_turns_request_lines_on(llama_server, tmp_path: Path) -> None:
    path = tmp_path / "enginetop.log"
    log_to_file(path, logging.INFO, http=True)
    await polls(llama_server.url, 2)
    text = path.read_text()
    for route in ("/health", "/v1/models", "/metrics"):  # each asked on every poll without a known model
        assert text.count(f"GET {llama_server.url}{route}: HTTP 200") == 2, text


def test_the_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "enginetop.log"
    log_to_file(path, logging.INFO, max_bytes=4000)
    for i in range(2000):
        logging.getLogger("tui.ui.app").warning("line %d of a long session", i)
    files = sorted(tmp_path.glob("enginetop.log*"))
    assert len(files) == 1 + LOG_BACKUPS
    assert all(f.stat().st_size <= 4000 for f in files)
    assert "line 1999 of a long session" in path.read_text()  # the newest is kept
