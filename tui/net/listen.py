"""`--listen HOST:PORT` for enginetop's servers (exporter, web): loopback unless the user says otherwise.

Neither server has authentication (textual-serve's web view runs a dashboard, with its keys `1`-`9` that
switch engines, for anyone who connects), so a non-loopback address needs `--allow-remote`, and the
message says how to reach a loopback one from elsewhere (an SSH tunnel).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from tui.net.policy import is_loopback_host


class ListenError(ValueError):
    """A --listen address that cannot or must not be used; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Listen:
    host: str
    port: int

    @property
    def display(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str, allow_remote: bool, flag: str = "--listen") -> Listen:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ListenError(f"{flag} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9469")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ListenError(f"{flag} {text!r}: the port is not a number") from None
    if not 1 <= port <= 65535:
        raise ListenError(f"{flag} {text!r}: ports run from 1 to 65535")
    if not is_loopback_host(host) and not allow_remote:
        raise ListenError(
            f"{flag} {text!r} is not a loopback address: this server has no authentication, so anyone who "
            f"can reach {host} could use it. Keep it on 127.0.0.1 and reach it through an SSH tunnel "
            f"(ssh -L {port}:127.0.0.1:{port} THIS_HOST), or add --allow-remote if the network is trusted")
    return Listen(host, port)


def check_free(listen: Listen, flag: str = "--listen") -> None:
    """Raise ListenError when the address cannot be bound (in use, not on this host), before anything starts.

    The real server binds again right after; this makes the common mistakes a clear message, not a traceback
    from deep inside an HTTP library."""
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, family, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ListenError(f"{flag} {listen.display}: cannot resolve {listen.host}: {exc.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no clash
        try:
            sock.bind(infos[0][4])
        except OSError as exc:
            raise ListenError(bind_message(listen, exc, flag)) from None


def bind_message(listen: Listen, exc: OSError, flag: str = "--listen") -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"{flag} {listen.display}: port {listen.port} is already in use "
                "(another exporter or server?); choose another port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{flag} {listen.display}: {listen.host} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"{flag} {listen.display}: not allowed to listen on port {listen.port} (below 1024 needs root)"
    return f"{flag} {listen.display}: cannot listen there: {exc.strerror or exc}"
