"""`enginetop web`: the dashboard served by textual-serve, seen in a real headless Chromium (network off
except loopback) watching the real llama-server; and the refusals that keep it from being exposed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
from web_browser import WebView

from tui.base.process import free_port
from tui.cli.main import build_parser
from tui.cli.web import tab_command

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-web-test-7f3a9c"  # must never be on a command line


def enginetop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@contextmanager
def web_server(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tui", "web", "--listen", f"127.0.0.1:{port}", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                if httpx.get(url + "/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "enginetop web did not serve its page"
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # The tabs' dashboards are its children, in its session: none may outlive it.
        deadline = time.monotonic() + 10
        while (left := _session_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in left:
            p.kill()
        assert not left, f"processes of the web server's session outlived it: {left}"


def _session_members(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def generate(url: str, tokens: int) -> None:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": f"Count slowly. {time.time()}"}], "max_tokens": tokens,
        "ignore_eos": True})
    r.raise_for_status()


GEN = re.compile(r"gen tok/s\s+([0-9][0-9.,]*)")


def gen_tps(text: str) -> float | None:
    found = GEN.search(text)
    return float(found.group(1).replace(",", "")) if found else None


async def test_dashboard_in_headless_chromium_on_llama(llama_server, tmp_path: Path) -> None:
    models = httpx.get(f"{llama_server.url}/v1/models", timeout=10).json()
    model = models["data"][0]["id"].rsplit("/", 1)[-1]
    with web_server("--engine", f"llama={llama_server.url}", "--api-key-env", "llama=ENGINETOP_WEB_KEY",
                    "--interval", "0.5", env={"ENGINETOP_WEB_KEY": KEY}) as (url, proc):
        async with WebView(url + "/") as view:
            await view.wait_text(lambda t: model in t and "gen tok/s" in t, 90, f"the model {model}")
            # The tab's dashboard is a child of the server, started with the key's variable name only.
            tabs = psutil.Process(proc.pid).children(recursive=True)
            lines = [" ".join(p.cmdline()) for p in tabs]
            assert any("--api-key-env=llama=ENGINETOP_WEB_KEY" in line for line in lines), lines
            assert not any(KEY in line for line in [*lines, " ".join(psutil.Process(proc.pid).cmdline())])
            assert "enginetop keys" not in view.text()

            await asyncio.to_thread(generate, llama_server.url, 48)
            first = await view.wait_text(gen_tps, 30, "a gen tok/s figure after a request")
            await asyncio.to_thread(generate, llama_server.url, 96)
            moved = await view.wait_text(lambda t: (v := gen_tps(t)) is not None and v != first and v, 30,
                                         f"gen tok/s moving from {first}")
            assert moved > 0

            await view.press("?", "Slash", 191, shift=True)
            await view.wait_text(lambda t: "enginetop keys" in t, 20, "the help screen after `?`")
            png = await view.screenshot(tmp_path / "web.png")
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
            assert view.frames > 10
            # The page asks for a web font; with the network off that fails, and the page works without it.
            assert view.blocked, "the page made no outside request: the network-off check checked nothing"


def test_refuses_non_loopback_port_in_use_and_url_credentials() -> None:
    proc = enginetop("web", "--listen", "0.0.0.0:8765", "--engine", "a=http://127.0.0.1:9")
    assert proc.returncode == 2
    assert "not a loopback address" in proc.stderr and "--allow-remote" in proc.stderr
    assert "ssh -L 8765:127.0.0.1:8765" in proc.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = enginetop("web", "--listen", f"127.0.0.1:{port}", "--engine", "a=http://127.0.0.1:9")
    assert proc.returncode == 2 and f"port {port} is already in use" in proc.stderr
    proc = enginetop("web", "--engine", "a=http://user:hunter2@127.0.0.1:9")
    assert proc.returncode == 2 and "user:password@" in proc.stderr and "hunter2" not in proc.stderr
    proc = enginetop("web", "--engine", "a=http://127.0.0.1:9", "--api-key-file", "a=/no/such/key")
    assert proc.returncode == 2 and "/no/such/key" in proc.stderr and "Traceback" not in proc.stderr


def test_tab_command_carries_the_dashboard_options_and_no_secret() -> None:
    args = build_parser().parse_args([
        "web", "--engine", "llama=http://127.0.0.1:8080", "--api-key-file", "llama=/keys/llama",
        "--probe-every", "5", "--keep-engines", "--probe-workload", "agent", "--listen", "127.0.0.1:9999"])
    command = tab_command(args)
    assert command.startswith(f"{sys.executable} -m tui ")
    for part in ("--engine=llama=http://127.0.0.1:8080", "--api-key-file=llama=/keys/llama",
                 "--probe-every=5.0", "--keep-engines", "--probe-workload=agent"):
        assert part in command
    assert "--listen" not in command and "9999" not in command
    # What the tab runs parses back to the same dashboard options.
    again = build_parser().parse_args(command.split()[3:])
    for dest in ("engine", "api_key_file", "probe_every", "keep_engines", "probe_workload", "interval"):
        assert getattr(again, dest) == getattr(args, dest), dest


def test_refuses_to_start_an_engine_per_browser_tab() -> None:
    # Every tab runs its own dashboard: one that starts engines would start one per tab, on the same port.
    # (With no flags a tab finds the engines running here and starts none: that one is served.)
    for argv in (["--demo"], ["--demo", "llama"]):
        proc = enginetop("web", *argv)
        assert proc.returncode == 2, proc.stderr
        assert "once per browser tab" in proc.stderr and "enginetop up demo-cpu-threads2" in proc.stderr
    proc = enginetop("web", "--profile", "demo-cpu-threads1")
    assert proc.returncode == 2
    assert "no engine of this profile is running" in proc.stderr
    assert "enginetop up demo-cpu-threads1" in proc.stderr and "Traceback" not in proc.stderr


def test_every_dashboard_option_is_a_long_flag_named_after_its_dest() -> None:
    """What dashboard_argv relies on: `--` + dest with dashes is an option of the dashboard, taking a value
    unless it is a switch; set to something not its default, each survives the trip to a tab's argv."""
    import argparse

    from tui.cli.dashboard import add_dashboard_args
    from tui.cli.web import dashboard_argv

    reference = argparse.ArgumentParser(add_help=False)
    add_dashboard_args(reference)
    defaults = vars(reference.parse_args([]))
    assert len(defaults) > 20
    for dest, default in defaults.items():
        flag = "--" + dest.replace("_", "-")
        choices = {"demo": "both", "probe_workload": "agent", "log_level": "DEBUG"}  # options with choices
        argv = [flag] if default is False else [f"{flag}={choices.get(dest, '13')}"]
        parsed = reference.parse_args(argv)
        assert getattr(parsed, dest) != default, dest
        assert reference.parse_args(dashboard_argv(parsed)) == parsed, dest
