"""How every HTTP client of enginetop talks to engines: one policy for proxies, credentials and errors.

Proxies: the environment's HTTP_PROXY / HTTPS_PROXY / ALL_PROXY / NO_PROXY (either case) are honoured by
every client (poller, probes, readiness checks, snapshot, A/B), except for loopback engines, which a
proxy cannot reach and which are always asked directly. Nothing else from the environment is used
(no .netrc). A secret (API key, or a user:password from the URL) is never sent in clear text through a
proxy: an http:// engine behind a proxy with a secret is refused with a message saying so.

Credentials written into an engine URL (`http://user:pass@host`) are split off where the URL is read
(`split_credentials`), so every URL enginetop shows, logs or records is the public one; the pair is sent
as HTTP Basic auth. An API key wins over URL credentials (both would need the Authorization header).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_HEAD_BYTES = 64 * 1024  # a response head (status line and headers) larger than this is refused

_ssl_context: ssl.SSLContext | None = None



@dataclass(frozen=True)
class Origin:
    """Where an http(s) URL connects: the one parser of the hand-made HTTP/1.1 clients (the poller's
    keep-alive pool and the probe's exchange)."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        """Raises ValueError, with the URL shown without credentials."""
        parts = urlsplit(url)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {public_url(url)}")
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ValueError(f"not a valid port in {public_url(url)}") from None
        return cls(parts.scheme, parts.hostname, port)

    @property
    def authority(self) -> str:
        """host[:port] for the Host header and URLs: the port only when it is not the default."""
        return self.hostport.rpartition(":")[0] if self.port == DEFAULT_PORTS[self.scheme] else self.hostport

    @property
    def hostport(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def request_target(url: str) -> str:
    """The path and query of `url`, as the request line carries them."""
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

def ssl_context() -> ssl.SSLContext:
    """The trust every enginetop client has for https engines, as httpx gives it with trust_env=False:
    certifi's bundle, nothing from the environment. Made once (loading the bundle takes a while)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context(trust_env=False)
    return _ssl_context


class InsecureSecret(ValueError):
    """A secret would travel in clear text through a proxy; the message says how to avoid it."""


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user:password@, (user, password) or None)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    public = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return public, (parts.username or "", parts.password or "")


def public_url(url: str) -> str:
    """The URL without any user:password part, fit for screens, logs and files."""
    try:
        return split_credentials(url)[0]
    except ValueError:  # e.g. a port out of range: still never show what came before the @
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url.rpartition("@")[2]


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def proxy_for(url: str) -> str | None:
    """The proxy the environment asks for this URL, or None (direct). Loopback is always direct."""
    parts = urlsplit(url)
    host = parts.hostname
    if is_loopback_host(host):
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    # proxy_bypass_environment applies NO_PROXY (names, suffixes, *, and host:port entries)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if host and urllib.request.proxy_bypass_environment(netloc, proxies):  # type: ignore[attr-defined]  # public in CPython, missing from typeshed
        return None
    return proxy


def check_secret_transport(url: str, has_secret: bool) -> None:
    """Raise InsecureSecret when a secret would cross a proxy unencrypted (http:// engine via a proxy)."""
    if not has_secret or urlsplit(url).scheme != "http":
        return
    proxy = proxy_for(url)
    if proxy is not None:
        raise InsecureSecret(
            f"refusing to send the API key / credentials for {public_url(url)} in clear text through the "
            f"proxy {public_url(proxy)}: use https:// for this engine, or add its host to NO_PROXY"
        )


def auth_headers(api_key: str | None, basic_auth: tuple[str, str] | None = None) -> dict[str, str]:
    """Authorization for an engine: Bearer key (vLLM, llama.cpp, SGLang), else Basic from URL credentials."""
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}
    if basic_auth is not None:
        pair = f"{basic_auth[0]}:{basic_auth[1]}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
    return {}


def target_headers(target: Any) -> dict[str, str]:
    """auth_headers for anything with `api_key` (and optionally `basic_auth`), after the proxy check."""
    api_key = getattr(target, "api_key", None)
    basic = getattr(target, "basic_auth", None)
    check_secret_transport(target.url, bool(api_key or basic))
    return auth_headers(api_key, basic)


def client_kwargs(url: str) -> dict[str, Any]:
    """Keyword arguments every httpx client for `url` gets: the proxy policy above, nothing else."""
    return {"trust_env": False, "proxy": proxy_for(url)}


def error_text(body: bytes | str | Any, limit: int = 200) -> str:
    """The human part of an error answer: OpenAI-style {"error": {"message"}}, {"message"}, {"detail"}, or
    the start of the body on one line."""
    obj = body
    text = ""
    if isinstance(body, bytes | str):
        text = (body.decode("utf-8", "replace") if isinstance(body, bytes) else body).strip()
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
    message = None
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            keys = ("message", "detail", "msg")
            message = next((err[k] for k in keys if isinstance(err.get(k), str)), None)
        elif isinstance(err, str):
            message = err
        if message is None and isinstance(obj.get("detail"), str):
            message = obj["detail"]
        if message is None and not text:
            text = json.dumps(obj)
    elif obj is not None and not text:
        text = json.dumps(obj)
    words = " ".join((message if message else text).split())
    return words[:limit] + ("…" if len(words) > limit else "")
