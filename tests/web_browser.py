"""A real headless Chromium on a page of `enginetop web`, driven over the DevTools protocol, network off
except loopback: what the page's terminal shows is rebuilt (pyte) from the very bytes the browser's websocket
received, keys go in as the browser's own key events, and screenshots are the browser's rendering.

xterm.js draws on a canvas, so the page's DOM holds no text to read; the websocket frames are what the
terminal drew from. Used by tests/test_web.py and scripts/make_web_screenshot.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pyte

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Network off except loopback: no name resolves, and anything else goes to a proxy that is not there
    # (Chromium never sends loopback through a proxy).
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
    "--proxy-server=127.0.0.1:9",
)


def chromium_binary() -> str:
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: run `make chromium` (Debian's chromium package)"
    return binary


class WebView:
    """`async with WebView(url) as view:` a headless Chromium showing `url`."""

    def __init__(self, url: str, width: int = 1600, height: int = 1000) -> None:
        self.url = url
        self.size = (width, height)
        self.screen = pyte.Screen(80, 24)
        self.stream = pyte.ByteStream(self.screen)
        self.frames = 0  # binary websocket frames received: terminal output
        self.blocked: list[str] = []  # "URL: error" of requests that failed (the network is off)
        self._urls: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="enginetop-chromium-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WebView:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self) -> None:
        width, height = self.size
        self._proc = subprocess.Popen(
            [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={self._dir / 'profile'}",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--window-size={width},{height}", "--hide-scrollbars", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = self._dir / "profile" / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self._proc.poll() is None, f"chromium exited with {self._proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as r:
            pages = [t for t in await r.json() if t["type"] == "page"]
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.send("Network.enable")
        await self.send("Page.enable")
        await self.send("Page.navigate", url=self.url)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        call = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call] = future
        await self._ws.send_str(json.dumps({"id": call, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def _read(self) -> None:
        assert self._ws is not None
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._event(data["method"], data.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Network.webSocketCreated":
            # textual-serve sizes the app from the websocket URL's query: the terminal the page opened
            query = parse_qs(urlsplit(params["url"]).query)
            if "width" in query and "height" in query:
                self.screen.resize(int(query["height"][0]), int(query["width"][0]))
        elif method == "Network.webSocketFrameSent":
            payload = params["response"]["payloadData"]
            with contextlib.suppress(ValueError, KeyError, TypeError):
                kind, body = json.loads(payload)
                if kind == "resize":
                    self.screen.resize(body["height"], body["width"])
        elif method == "Network.webSocketFrameReceived":
            response = params["response"]
            if response["opcode"] == 2:
                self.frames += 1
                self.stream.feed(base64.b64decode(response["payloadData"]))
        elif method == "Network.requestWillBeSent":
            self._urls[params["requestId"]] = params["request"]["url"]
        elif method == "Network.loadingFailed":
            self.blocked.append(f"{self._urls.get(params['requestId'], '?')}: {params.get('errorText', '')}")

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    async def wait_text(self, predicate: Callable[[str], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = predicate(self.text())
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed {what}; it shows:\n{self.text()}")
            await asyncio.sleep(0.1)

    async def press(self, key: str, code: str, key_code: int, shift: bool = False) -> None:
        """A key as the keyboard gives it to the page: the terminal's own handlers turn it into input."""
        width, height = self.size
        for kind in ("mousePressed", "mouseReleased"):  # focus the terminal as a click would
            await self.send("Input.dispatchMouseEvent", type=kind, x=width // 2, y=height // 2,
                            button="left", clickCount=1)
        mods = 8 if shift else 0
        await self.send("Input.dispatchKeyEvent", type="keyDown", key=key, code=code, text=key,
                        unmodifiedText=key, windowsVirtualKeyCode=key_code, modifiers=mods)
        await self.send("Input.dispatchKeyEvent", type="keyUp", key=key, code=code,
                        windowsVirtualKeyCode=key_code, modifiers=mods)

    async def screenshot(self, path: Path) -> bytes:
        png = base64.b64decode((await self.send("Page.captureScreenshot", format="png"))["data"])
        path.write_bytes(png)
        return png

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
