"""Discovery's bounds on what a port may do (tui.sources.discover_ask): asking ends at one deadline whatever
the ports do, and says which ports did not answer in time; an answer's body is read up to a cap. Against real
servers on real loopback sockets, in their own processes (a listener of the test's own process would be
skipped as enginetop's own)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from waiting import until

from tui.base.process import Launched, free_port, launch, stop_group
from tui.engines.knowledge import program_name
from tui.sources.discover import DEADLINE_S, discover
from tui.sources.discover_ask import MAX_BODY_BYTES

REPO = Path(__file__).resolve().parents[1]

# An HTTP server on HOST:PORT, in modes: `models` answers /health and /v1/models (one model, "stand-in");
# `trickle` sends its headers (a 100 kB body announced) and then one byte of body every 0.5 s, on every path;
# `huge` answers /v1/models with a valid model list of 4 MiB; `freebind` is `models` bound with IP_FREEBIND,
# which lets a socket bind an address this machine does not have. Each request is printed with the
# Authorization header it came with, so a test can tell whether a key reached it.
STAND_IN = textwrap.dedent("""
    import http.server, json, socket, socketserver, sys, threading, time
    host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    printing = threading.Lock()  # one line per request: two threads' prints would interleave

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def answer(self, status, data):
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            with printing:
                print(f"GET {self.path} authorization={self.headers.get('Authorization')}", flush=True)
            if mode == "trickle":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100000")
                self.end_headers()
                try:
                    while True:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.5)
                except OSError:
                    return
            if self.path == "/v1/models":
                ids = ["m" * 1000 + str(i) for i in range(4200)] if mode == "huge" else ["stand-in"]
                self.answer(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})
            elif self.path == "/health":
                self.answer(200, {"status": "ok"})
            else:
                self.answer(404, {"error": "not found"})

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def server_bind(self):
            if mode == "freebind":
                self.socket.setsockopt(socket.SOL_IP, 15, 1)  # IP_FREEBIND (linux/in.h)
            # not HTTPServer's: it looks the address up in DNS (getfqdn), which a test must not wait on
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = host, port

    Server((host, port), Handler).serve_forever()
""")


def listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections("tcp"))


def stand_in(tmp_path: Path, mode: str, host: str = "127.0.0.1", port: int | None = None,
             as_user: str | None = None) -> tuple[Launched, int]:
    """A stand-in server in its own process, listening before this returns (`as_user`: run as that user,
    through setpriv)."""
    port = port or free_port()
    argv = [sys.executable, "-c", STAND_IN, host, str(port), mode]
    if as_user is not None:
        user = pwd.getpwnam(as_user)
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *argv]
    server = launch(argv, tmp_path / f"stand-in-{mode}-{port}.log")
    try:
        until(lambda: listening(port) or not server.alive(), f"the {mode} stand-in on {host}:{port}")
        assert server.alive(), "\n".join(server.log_tail(20))
    except BaseException:
        stop_group(server)
        raise
    return server, port


def requests_seen(server: Launched) -> list[str]:
    return [line for line in server.log_tail(200) if line.startswith("GET ")]


def test_a_port_that_trickles_its_body_ends_discovery_at_the_deadline(tmp_path: Path) -> None:
    """A server that answers its headers and then a byte of body every 0.5 s (each byte inside httpx's read
    timeout, so httpx alone waited for all 100 kB: ~14 hours) is given up at the deadline, and said."""
    server, port = stand_in(tmp_path, "trickle")
    try:
        started = time.monotonic()
        found = discover(ports=(port,))
        took = time.monotonic() - started
        assert requests_seen(server), "the stand-in was asked"
        assert all(e.port != port for e in found.engines)
        assert took < DEADLINE_S + 1.5, f"discovery took {took:.1f} s"  # + the socket walk on 2 busy cores
        said = [line for line in found.report() if line.startswith(f":{port} ")]
        python = program_name(server.argv)  # "python3", as its command line names it
        assert said == [f":{port} ({python} pid {server.proc.pid}) did not answer in time (within "
                        f"{DEADLINE_S:g} s): not watched"], found.report()
    finally:
        stop_group(server)


def test_snapshot_ends_in_bounded_time_beside_a_trickling_port(tmp_path: Path) -> None:
    """`enginetop snapshot`, with the trickling port among the usual ones, exits within a bound and names
    the port that did not answer in time (it held the command for as long as the port kept trickling)."""
    server, port = stand_in(tmp_path, "trickle")
    try:
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--interval", "0.2"],
                                  capture_output=True, text=True, timeout=45, cwd=REPO,
                                  env={**os.environ, "ENGINETOP_DISCOVER_PORTS": str(port)})
        except subprocess.TimeoutExpired:
            pytest.fail("enginetop snapshot still running after 45 s beside a trickling port")
        took = time.monotonic() - started
        assert f"enginetop snapshot: :{port} (" in proc.stderr, proc.stderr
        assert f"did not answer in time (within {DEADLINE_S:g} s): not watched" in proc.stderr
        assert "Traceback" not in proc.stderr
        # Python's start and imports, discovery (at most the deadline), and reading whatever else it found
        # on this machine: generous, and far below "as long as the port trickles"
        assert took < 30, f"snapshot took {took:.1f} s"
    finally:
        stop_group(server)


def test_a_model_list_over_the_cap_is_not_read_whole(tmp_path: Path) -> None:
    """A /v1/models answer of 4 MiB (a model list is a few kB) is not taken as one: it is dropped at the
    cap, and the port is no engine."""
    assert MAX_BODY_BYTES < 4 * 2**20
    server, port = stand_in(tmp_path, "huge")
    try:
        found = discover(ports=(port,))
        assert all(e.port != port for e in found.engines), [e.words()[:120] for e in found.engines]
        # it was asked (the stand-in prints each request as it comes: on a loaded machine, a moment later)
        until(lambda: any(line.startswith("GET /v1/models") for line in requests_seen(server)),
              "the stand-in's log of GET /v1/models")
    finally:
        stop_group(server)


def test_a_well_behaved_server_is_still_found_at_once(tmp_path: Path) -> None:
    server, port = stand_in(tmp_path, "models")
    try:
        started = time.monotonic()
        found = discover(ports=(port,))
        took = time.monotonic() - started
        [engine] = [e for e in found.engines if e.port == port]
        assert (engine.name, engine.how, engine.pid) == ("stand-in", "usual port", server.proc.pid)
        assert engine.uid == os.geteuid()
        assert not [line for line in found.late if f":{port} " in line]
        assert took < DEADLINE_S, f"discovery took {took:.1f} s"
    finally:
        stop_group(server)
