"""Shared fixtures. The real llama-server is started once per session; a missing engine fails, never skips."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import podman
import pytest

from tui.base.paths import runs_dir
from tui.base.process import Launched, free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_argv
from tui.model.samples import EngineSample
from tui.model.targets import EngineTarget
from tui.sources.engine import poll_engine


@dataclass
class RunningEngine:
    name: str
    url: str
    port: int
    launched: Launched


def start_engine(name: str, label: str, argv_for_port, env: dict[str, str] | None = None,
                 timeout: float = 120, api_key: str | None = None) -> RunningEngine:
    """An engine on a free loopback port, ready for OpenAI requests (stopped again if it never gets there)."""
    port = free_port()
    log = runs_dir() / f"test-{name}-{port}.log"
    launched = launch(argv_for_port(port), log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_openai_ready(label, url, launched, timeout=timeout, api_key=api_key)
    except BaseException:
        stop_group(launched)
        raise
    return RunningEngine(name=name, url=url, port=port, launched=launched)


def start_llama(name: str, *extra: str, api_key: str | None = None) -> RunningEngine:
    return start_engine(name, "llama-server", lambda port: demo_argv(port, *extra), api_key=api_key)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[RunningEngine]:
    """The real llama-server with the real Gemma 3 270M, --metrics, 4 slots, for the whole session."""
    engine = start_llama("llama", "--parallel", "4", "--threads", "2")
    try:
        yield engine
    finally:
        stop_group(engine.launched)


# --- vLLM (CPU build, tiny random-weight model) -------------------------------------------------------------
# Added by the vLLM helper. Started at most once per session: it needs ~3.5 GiB and up to a minute or two
# on two cores, and two vLLMs must never run at once.


@dataclass
class RunningVllm(RunningEngine):
    # What enginetop's own poller said while the server started (launched_by_us=True), oldest first.
    startup: list[EngineSample] = field(default_factory=list)
    container: str = ""  # its Podman container's name
    host_pid: int | None = None  # the engine's own process, as the host numbers it


def wait_openai_ready(name: str, url: str, launched: Launched, timeout: float,
                      startup: list[EngineSample] | None = None, api_key: str | None = None) -> None:
    """Ready means /health 200 and a real 1-token chat completion, not merely an open port.

    With `startup`, every wait step first polls the engine the way the dashboard does and keeps the sample.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    target = EngineTarget(name=name, url=url, api_key=api_key)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() < deadline:
        if not launched.alive():
            tail = "\n".join(launched.log_tail(40))
            raise RuntimeError(f"{name} exited with {launched.proc.returncode} while starting:\n{tail}")
        if startup is not None:
            startup.append(asyncio.run(_poll_once(target)))
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                reply = httpx.post(
                    f"{url}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                    timeout=60, headers=headers,
                )
                if reply.status_code == 200:
                    return
                last = f"completion answered {reply.status_code}: {reply.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    tail = "\n".join(launched.log_tail(20))
    raise RuntimeError(f"{name} at {url} not ready after {timeout:.0f}s: {last}\n{tail}")


async def _poll_once(target: EngineTarget) -> EngineSample:
    async with httpx.AsyncHTTPTransport() as transport:
        return await poll_engine(transport, target, launched_by_us=True)


@pytest.fixture(scope="session")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment podman runs with here (CONTAINERS_CONF with `default_ulimits = []`)."""
    return podman.conf_env(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def podman_api(podman_env: dict[str, str]) -> Iterator[podman.ApiService]:
    """Podman's Docker-compatible API on a socket of the session's own (`podman system service`)."""
    # a short path: a Unix socket's path has a limit of 107 bytes, and pytest's temporary folders are long
    folder = Path(tempfile.mkdtemp(prefix="et-api-"))
    service = podman.api_service(podman_env, folder / "api.sock")
    try:
        yield service
    finally:
        service.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_server(podman_env: dict[str, str]) -> Iterator[RunningVllm]:
    """The real vLLM (CPU) serving the tiny model, for the session, in a real Podman container as most people
    run vLLM (its port published on 127.0.0.1, a memory limit): the bundled demo-vllm-tiny profile as a user
    starts it (--enforce-eager; per-request metrics put the engine's own TTFT/ITL for each request on its
    final usage chunk, prompt token details its cached tokens in the usage), listening on every address of
    its container, on a free port published as the same port. On the host, the port is held by conmon, and
    the engine's own processes are in the container: every test of it reads it through that.

    A missing install fails the profile's resolution with a ProfileError that says "run `make vllm`", and a
    missing podman fails too (`make podman`): the tests using it fail, never skip.
    """
    from tui.lifecycle.profile_files import load_profiles, repo_profiles_dir
    from tui.lifecycle.profile_resolve import resolve

    port = free_port()
    log = runs_dir() / f"test-vllm-{port}.log"
    profile = dataclasses.replace(load_profiles([repo_profiles_dir()]).get("demo-vllm-tiny"), port=port)
    resolved = resolve(profile)
    assert resolved.argv is not None
    argv = list(resolved.argv)
    argv[argv.index("--host") + 1] = "0.0.0.0"  # the container's own addresses: its published port reaches it
    name = f"et-test-vllm-{port}"
    options = ["--rm", "--name", name, "-p", f"127.0.0.1:{port}:{port}", "--memory", "6g", "--shm-size", "1g",
               *(f"--env={k}={v}" for k, v in (resolved.env or {}).items())]
    launched = launch([podman.podman(), "--runtime", "runc", "run", *options, "--rootfs", "/:O", *argv], log,
                      env=podman_env)
    url = f"http://127.0.0.1:{port}"
    engine = RunningVllm(name="vllm", url=url, port=port, launched=launched, container=name)
    try:
        # Under pytest-timeout's 300 s per test, which includes this setup for the first test using it.
        wait_openai_ready("vLLM", url, launched, timeout=240, startup=engine.startup)
        engine.host_pid = podman.host_pid(podman_env, name)
        yield engine
    finally:
        stop_group(launched)
        podman.remove(podman_env, name)


@pytest.fixture(scope="session")
def llama_container(podman_env: dict[str, str]) -> Iterator[RunningContainer]:
    """The real llama-server in a real Podman container, for the session: its port published on 127.0.0.1, a
    1 GiB memory limit, a one-core CPU quota, and an option given only on its command line (-np 2 with 2
    threads: two slots that split its context, which /props does not say)."""
    port = free_port()
    name = f"et-test-llama-{port}"
    argv = demo_argv(8080, "--parallel", "2", "--threads", "2", host="0.0.0.0")
    podman.start(podman_env, name, ["-p", f"127.0.0.1:{port}:8080", "--memory", "1g", "--cpus", "1"], argv)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"llama-server in container {name} not ready in 120 s"
            time.sleep(0.2)
        yield RunningContainer(name, url, port, podman.host_pid(podman_env, name), podman_env)
    finally:
        podman.remove(podman_env, name)


@dataclass
class RunningContainer:
    name: str  # the container's
    url: str
    port: int  # published on 127.0.0.1
    host_pid: int  # the engine's own process, as the host numbers it
    env: dict[str, str]  # podman's environment


# --- the `engine` marker ---------------------------------------------------------------------------------
# Every test that starts a real engine carries it, so `pytest -m "not engine"` is the fast inner loop. Tests
# that use an engine fixture get it here; a test that starts one by itself is marked in its module. Any other
# test runs with engines off (tui.engines.install_llamacpp.refuse_when_off), so an unmarked one that starts an
# engine fails instead of slipping into the fast loop.
ENGINE_FIXTURES = {"llama_server", "vllm_server", "llama_container"}

# --- groups for parallel runs (pytest-xdist, --dist loadgroup: see pyproject.toml) -------------------------
# Tests in one xdist group run one after the other on one worker. Every test marked `engine` is in one group:
# two engines generating at once on 2 cores run each other down (bench/bench_engines_at_once.py), the vLLM
# tests share the session's vLLM, and the bundled demo profiles share their fixed port. Moving engine tests to
# the other worker, which is done after ~7 of the ~15 minutes, was tried four times and never made the suite
# shorter (README, Tests: the tries, their figures, and why: most of the engine tests' CPU is the engines').
# Other tests that share a module-scoped fixture (a Prometheus over the synthetic fleet, a recording) share
# a worker, so it is built once.
ENGINE_GROUP = "engines"  # a test that must not run beside an engine may join it (xdist_group)


def _group(item: pytest.Item) -> str | None:
    if item.get_closest_marker("engine") is not None:
        return ENGINE_GROUP
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if isinstance(item, pytest.Function) and any(d.scope == "module" for fds in defs for d in fds):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        if group := _group(item):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _own_config_and_live_dirs(tmp_path_factory: pytest.TempPathFactory,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own config dir (capacities, keys, user profiles), live dir (bench runs the dashboard
    shows) and state dir (the engines it started): nothing a test writes reaches the user's, or another
    test's, dashboard or `enginetop down`."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("ENGINETOP_LIVE_DIR", str(home / "live"))
    monkeypatch.setenv("ENGINETOP_STATE_DIR", str(home / "state"))
    # an empty sysfs: no AMD or Intel GPU, no RAPL, whatever this machine has (a test that wants them builds
    # a tree in the kernel's layout and points ENGINETOP_SYSFS_ROOT at it)
    (home / "sys").mkdir()
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(home / "sys"))


@pytest.fixture(autouse=True)
def _engines_only_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("engine") is None:
        monkeypatch.setenv("ENGINETOP_ENGINES", "off")
