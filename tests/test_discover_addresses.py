"""Where discovery asks a listener (tui.sources.discover_listeners): one bound only to another address of this
machine is asked there (it is still this machine), and one bound to an address this machine does not have
is not asked, with a line that says so; never skipped silently. Real listeners, in their own processes."""

from __future__ import annotations

import ipaddress
import socket
import sys
from pathlib import Path

import psutil
import pytest
from test_discover_answers import requests_seen, stand_in

from tui.base.process import stop_group
from tui.engines.knowledge import program_name
from tui.sources.discover import discover
from tui.sources.discover_listeners import local_addresses, url_hosts

# TEST-NET-3 (RFC 5737): documentation only, never an address of a real machine
NOT_HERE = "203.0.113.7"


def own_ipv4() -> str:
    """A non-loopback IPv4 address of this machine's own interfaces; skip, saying why, where it has none
    (nothing is ever added to a machine's interfaces for a test)."""
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family == socket.AF_INET:
                addr = ipaddress.ip_address(entry.address)
                if not (addr.is_loopback or addr.is_link_local or addr.is_unspecified):
                    return str(addr)
    pytest.skip("this machine has no non-loopback IPv4 address (only loopback): a listener bound to one "
                "cannot be started here")


def test_where_each_bound_address_is_asked() -> None:
    here = frozenset({"192.0.2.2", "2001:db8::2", "fe80::1"})
    assert url_hosts("192.0.2.2", here) == url_hosts("::ffff:192.0.2.2", here) == ("192.0.2.2",)
    assert url_hosts("2001:db8::2", here) == ("[2001:db8::2]",)
    assert url_hosts("fe80::1%eth0", here) == ()  # link-local: a URL cannot name it without its interface
    assert url_hosts(NOT_HERE, here) == () and url_hosts("10.1.2.3") == ()
    assert url_hosts("127.0.0.2", frozenset()) == ("127.0.0.2",)  # all of 127/8 is loopback
    assert "127.0.0.1" in local_addresses()


def test_a_listener_on_an_own_non_loopback_address_is_found_there(tmp_path: Path) -> None:
    """A server bound only to this machine's own non-loopback address (as `--host 192.168.1.5` binds one;
    127.0.0.1 does not reach it) is asked, and found, at that address."""
    own = own_ipv4()
    server, port = stand_in(tmp_path, "models", host=own)
    try:
        with pytest.raises(OSError):  # loopback does not reach it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        found = discover(ports=(port,))
        [engine] = [e for e in found.engines if e.port == port]
        assert engine.url == f"http://{own}:{port}" and engine.name == "stand-in"
        assert engine.pid == server.proc.pid
        assert not [line for line in found.not_asked if f":{port} " in line]
    finally:
        stop_group(server)


def test_a_listener_on_an_address_this_machine_does_not_have_is_said_not_asked(tmp_path: Path) -> None:
    """A server bound (with IP_FREEBIND) to an address no interface of this machine has is not asked, since
    asking that address would leave the machine; discovery says so in one line."""
    if not sys.platform.startswith("linux"):
        pytest.skip("IP_FREEBIND, which binds an address this machine does not have, is Linux's")
    assert NOT_HERE not in local_addresses()
    server, port = stand_in(tmp_path, "freebind", host=NOT_HERE)
    try:
        found = discover(ports=(port,))
        assert all(e.port != port for e in found.engines)
        assert not requests_seen(server)  # nothing was sent to it
        python = program_name(server.argv)
        # this server's line only: discovery reads the whole machine, where the engine tests' engines and
        # containers come and go meanwhile (a fresh clone once saw one starting: "not asked" too, no port yet)
        ours = [line for line in found.not_asked if f":{port} " in line]
        assert ours == [f"not asked: :{port} ({python} pid {server.proc.pid}) listens on "
                        f"{NOT_HERE} only, not an address of this machine"], found.report()
        assert ours[0] in found.report()
    finally:
        stop_group(server)
