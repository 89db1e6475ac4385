"""A reverse proxy on loopback in front of a real Prometheus, as people put nginx in front of theirs: it
checks a bearer token or a user:password (401 without the right one) and can be switched to answer as a
Prometheus that is not ready yet (503 "Service Unavailable", Prometheus' own text while it starts) or to
stall (a timeout)."""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tui.base.process import free_port


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # Prometheus (or enginetop) opens many connections at once


class PromProxy:
    def __init__(self, upstream: str, token: str | None = None, basic: tuple[str, str] | None = None) -> None:
        self.upstream, self.token = upstream, token
        self.expected = f"Bearer {token}" if token is not None else None
        if basic is not None:
            self.expected = "Basic " + base64.b64encode(f"{basic[0]}:{basic[1]}".encode()).decode()
        self.mode = "pass"  # "pass" | "not_ready" | "stall"
        self.stall_s = 10.0
        self.seen_authorization: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, body: bytes | None) -> None:
                auth = self.headers.get("Authorization", "")
                proxy.seen_authorization.append(auth)
                if proxy.expected is not None and auth != proxy.expected:
                    return self._send(401, b"Unauthorized\n")
                if proxy.mode == "not_ready":
                    return self._send(503, b"Service Unavailable")
                if proxy.mode == "stall":
                    time.sleep(proxy.stall_s)
                headers = {"Content-Type": self.headers.get("Content-Type", "")} if body is not None else {}
                r = httpx.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                  timeout=30)
                self._send(r.status_code, r.content, r.headers.get("Content-Type", "text/plain"))

            def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._serve(self.rfile.read(length))

            def log_message(self, *args) -> None:
                pass

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = _Server(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="prom proxy").start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
