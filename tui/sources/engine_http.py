"""The poller's requests to one engine: a GET with a deadline and a body cap, each failure turned into
words to act on (`Failed`, `transport_failure`), and secrets scrubbed from every message (`scrub`).

The transport is the poller's own keep-alive pool, or an httpx transport (a proxied engine; tests that pass
their own): tui.net.keepalive.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

import httpx

from tui.model.targets import EngineTarget
from tui.net.keepalive import Transport, exchange
from tui.net.policy import public_url

# One line per request, off unless --log-http (tui.cli.dashboard.log_to_file): four engines a second say
# nothing.
http_log = logging.getLogger("tui.http")

ERROR_BODY_BYTES = 4096  # enough of an error response to quote its message


class Failed(Exception):
    """One request failed; the message is final, user-facing text."""

    def __init__(self, message: str, refused: bool = False, late: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.late = late  # no answer in time (the server is there: it accepted the connection)


@functools.lru_cache(maxsize=64)  # asked on every poll of the same few URLs
def address_of(url: str) -> str:
    """host:port of an engine's URL, as messages name it (the URL itself when it cannot be parsed)."""
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return url
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return f"{u.host}:{port}" if port else u.host or url


# What a poll says when nothing listened on the engine's port: its process is gone (or not there yet), so the
# next answer is from a new run of the server (tui.sources.engine_source starts /slots' counters again)
REFUSED = "connection refused at"
NOT_YET = "not accepting connections yet at"


def transport_failure(exc: Exception, where: str, timeout: float, path: str) -> Failed:
    """A request to `where` + `path` that raised `exc`, in words to act on."""
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return Failed(f"no answer within {timeout:g}s from {where}{path}", late=True)
    text = str(exc)
    low = text.lower()
    if isinstance(exc, httpx.ConnectError):
        if "refused" in low or "connect call failed" in low or "all connection attempts failed" in low:
            return Failed(f"{REFUSED} {where} — is the engine running?", refused=True)
        if "name or service not known" in low or "nodename nor servname" in low or "getaddrinfo" in low:
            return Failed(f"cannot resolve the host of {where}: check the engine URL")
        return Failed(f"cannot connect to {where}: {text or type(exc).__name__}")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return Failed(f"invalid engine URL {where!r}: {text}")
    if isinstance(exc, httpx.RemoteProtocolError):
        return Failed(f"{where}{path} closed the connection or sent a malformed response: {text}")
    return Failed(f"{where}{path} failed: {type(exc).__name__}: {text}")


async def _get(transport: Transport, url: str, headers: dict[str, str], timeout: float,
               limit: int) -> tuple[int, bytes, bool]:
    """GET with a total deadline and a body cap: (status, body, over_cap). The body of a non-200 answer is
    read only far enough to quote it."""
    async with asyncio.timeout(timeout):
        status, body, over = await exchange(transport, "GET", url, headers, limit, timeout,
                                            error_cap=ERROR_BODY_BYTES)
    if http_log.isEnabledFor(logging.INFO):  # off by default, and this runs every poll
        http_log.info("GET %s: HTTP %d", public_url(url), status)
    return status, body, over


async def fetch_path(transport: Transport, target: EngineTarget, path: str, headers: dict[str, str],
                     timeout: float, limit: int, query: str = "") -> tuple[int, bytes, bool]:
    """GET `path` + `query`; a failure's message names the path alone."""
    try:
        return await _get(transport, target.base + path + query, headers, timeout, limit)
    except (httpx.HTTPError, httpx.InvalidURL, TimeoutError, OSError, ValueError) as exc:
        raise transport_failure(exc, address_of(target.url), timeout, path) from None


def path_fetcher(transport: Transport, target: EngineTarget, headers: dict[str, str],
                 timeout: float) -> Callable[[str], Awaitable[tuple[int, bytes, bool]]]:
    """GET a path of `target` (up to 8 MiB), for the readers that are given a fetch: a failure raises
    ValueError with its words."""
    async def fetch(path: str) -> tuple[int, bytes, bool]:
        try:
            return await fetch_path(transport, target, path, headers, timeout, 8 * 2**20)
        except Failed as exc:
            raise ValueError(str(exc)) from None

    return fetch


def auth_message(has_key: bool) -> str:
    """Words for an answer of 401 or 403: the key given was refused, or one is needed."""
    if has_key:
        return "unauthorized: the engine refused this API key; check the key set for this engine"
    return ("unauthorized: it answers, and needs an API key: give it with --api-key-file NAME=PATH or "
            "--api-key-env NAME=VAR")


def secrets_of(target: EngineTarget) -> list[str]:
    secrets = [target.api_key] if target.api_key else []
    if target.basic_auth is not None and target.basic_auth[1]:
        secrets.append(target.basic_auth[1])
    return secrets


def scrub(message: str | None, target: EngineTarget) -> str | None:
    """Error text may quote what the server or the HTTP library saw: never a secret."""
    if message is None:
        return message
    for secret in secrets_of(target):
        message = message.replace(secret, "***")
    return message

