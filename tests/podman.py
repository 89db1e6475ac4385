"""Real containers for tests, as these machines run them: Debian's podman with runc, the host's root overlaid
(`--rootfs /:O`: no image registry is reachable, and the host's root has the engines), a containers.conf
with `default_ulimits = []` (CONTAINERS_CONF), and Podman's Docker-compatible API served on a socket of the
test's own (`podman system service`). A missing podman fails the test (`make podman` installs it), never
skips it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

CONF_TEXT = "[containers]\ndefault_ulimits = []\n"


def podman() -> str:
    path = shutil.which("podman")
    assert path is not None, "podman is not installed: `make podman` installs it (Debian's podman and runc)"
    return path


def conf_env(conf_dir: Path) -> dict[str, str]:
    """The environment podman runs with here: CONTAINERS_CONF holding `default_ulimits = []`."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    conf = conf_dir / "containers.conf"
    conf.write_text(CONF_TEXT)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def run(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    done = subprocess.run([podman(), "--runtime", "runc", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"podman {' '.join(args[:3])}…: {done.stderr.strip()}"
    return done.stdout.strip()


def start(env: dict[str, str], name: str, options: Sequence[str], argv: Sequence[str]) -> str:
    """`podman run -d --name NAME OPTIONS --rootfs /:O ARGV`; the container's id."""
    subprocess.run([podman(), "rm", "-f", name], env=env, capture_output=True, check=False)
    return run(env, "run", "-d", "--name", name, *options, "--rootfs", "/:O", *argv)


def remove(env: dict[str, str], name: str) -> None:
    subprocess.run([podman(), "rm", "-f", "-t", "2", name], env=env, capture_output=True, timeout=60,
                   check=False)


def host_pid(env: dict[str, str], name: str) -> int:
    return int(run(env, "inspect", "-f", "{{.State.Pid}}", name))


@dataclass
class ApiService:
    socket: Path
    proc: subprocess.Popen[bytes]

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def api_service(env: dict[str, str], socket: Path, timeout: float = 30) -> ApiService:
    """`podman system service --time=0 unix://SOCKET`, answering GET /version before it is returned."""
    proc = subprocess.Popen([podman(), "system", "service", "--time=0", f"unix://{socket}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket.exists():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=2) as client:
                    if client.get("http://podman/version").status_code == 200:
                        return ApiService(socket, proc)
            except httpx.HTTPError:
                pass
        assert proc.poll() is None, "podman system service exited"
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"podman's API did not answer on {socket} within {timeout:g} s")
