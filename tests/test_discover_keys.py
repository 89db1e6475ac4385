"""Whom a key goes to when its flag names no engine (tui.sources.discover_keys): only the single engine found
whose process enginetop can read and that runs as the same user. A real server started as another user
(`nobody`, through setpriv) on a usual port is found, and is never sent the key unasked; named for it, it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_discover_answers import requests_seen, stand_in

from tui.base.process import stop_group
from tui.sources.discover import discover
from tui.sources.discover_found import FoundEngine
from tui.sources.discover_keys import UnnamedKeyError, check_unnamed_keys

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-discovered-unasked-4d1e"


def other_user() -> str:
    """Another user to run a server as; skip, saying why, where one cannot be started as another user."""
    if os.geteuid() != 0:
        pytest.skip("a server can be started as another user only by root here (setpriv)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: no server can be started as another user")
    return "nobody"


def snapshot(port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--interval", "0.2", *flags],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "ENGINETOP_DISCOVER_PORTS": str(port)})


def keyed(server) -> list[str]:
    return [line for line in requests_seen(server) if "authorization=Bearer" in line]


def test_a_bare_key_is_never_sent_to_another_users_server(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    user = other_user()
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    server, port = stand_in(tmp_path, "models", as_user=user)
    try:
        [engine] = [e for e in discover(ports=(port,)).engines if e.port == port]
        assert engine.pid is not None and engine.uid != os.geteuid()  # readable (root), not this user's
        with pytest.raises(UnnamedKeyError) as refused:
            check_unnamed_keys([engine], [str(key_file)], None)
        said = str(refused.value)
        assert f"--api-key-file {str(key_file)!r} names no engine, and the one found, stand-in (" in said
        assert f"its process runs as {user}, not as root (who runs enginetop)" in said
        assert said.endswith("name it: --api-key-file stand-in=PATH"), said

        bare = snapshot(port, "--api-key-file", str(key_file))
        assert bare.returncode == 2 and "Traceback" not in bare.stderr, bare.stderr
        assert "names no engine" in bare.stderr and "stand-in" in bare.stderr
        assert KEY not in bare.stdout + bare.stderr
        assert requests_seen(server) and not keyed(server), requests_seen(server)  # asked, never keyed

        env_flag = snapshot(port, "--api-key-env", "ENGINETOP_TEST_UNASKED")  # the same for a variable
        assert env_flag.returncode == 2 and "names no engine" in env_flag.stderr
        assert not keyed(server)

        from tui.cli import dashboard  # the dashboard's discovery refuses it the same way

        with monkeypatch.context() as env:
            env.setenv("ENGINETOP_DISCOVER_PORTS", str(port))
            with pytest.raises(UnnamedKeyError, match="names no engine"):
                dashboard._discovered(False, [str(key_file)], None)

        named = snapshot(port, "--api-key-file", f"stand-in={key_file}")  # named for it: sent
        assert named.returncode in (0, 3), named.stderr
        assert keyed(server) and all(KEY in line for line in keyed(server))
    finally:
        stop_group(server)


def test_a_bare_key_goes_to_the_one_own_engine_found(tmp_path: Path) -> None:
    server, port = stand_in(tmp_path, "models")
    try:
        [engine] = [e for e in discover(ports=(port,)).engines if e.port == port]
        assert engine.uid == os.geteuid()
        check_unnamed_keys([engine], [str(tmp_path / "key")], None)  # this user's, readable: given it
        check_unnamed_keys([engine], None, ["stand-in=VAR"])  # named: always
    finally:
        stop_group(server)


def test_an_unreadable_process_or_several_engines_take_no_bare_key() -> None:
    unread = FoundEngine("server-8080", "http://127.0.0.1:8080", 8080, None,
                         "a process whose command line cannot be read", "usual port")
    with pytest.raises(UnnamedKeyError, match=r"its process cannot be read .* name it: --api-key-env "
                                              r"server-8080=VAR"):
        check_unnamed_keys([unread], None, ["VAR"], euid=1000)
    mine = FoundEngine("gemma", "http://127.0.0.1:8081", 8081, 42, "llama-server", "command line", uid=1000)
    check_unnamed_keys([mine], ["/k"], None, euid=1000)
    with pytest.raises(UnnamedKeyError, match=r"names no engine, and 2 were found \(gemma, server-8080\): "
                                              r"name the one it is for, e.g. --api-key-file gemma=PATH"):
        check_unnamed_keys([mine, unread], ["/k"], None, euid=1000)
    check_unnamed_keys([], ["/k"], None)  # none found: the caller says "found: none"
