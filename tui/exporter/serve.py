"""The /metrics server: threads of its own (a scrape never waits on the probing loop), no compression.

A 50-engine body is ~2.5 MB; gzip would cost a scrape tens of milliseconds of CPU to save bandwidth that
loopback or a LAN does not need, so the body is sent as it is whatever the scraper accepts.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import ThreadingWSGIServer

from tui.exporter.metrics import ProbeMetrics


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A line per scrape is noise: say nothing."""


def app(metrics: ProbeMetrics) -> Callable[..., Iterable[bytes]]:
    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"enginetop exporter: the series are at /metrics\n"]
        body = metrics.exposition()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(body)))])
        return [body]

    return wsgi


def serve(metrics: ProbeMetrics, host: str, port: int) -> ThreadingWSGIServer:
    """Listen on host:port (OSError if it cannot) and serve from a daemon thread; shutdown() stops it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    server: ThreadingWSGIServer = make_server(host, port, app(metrics), server_class, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True).start()
    return server
