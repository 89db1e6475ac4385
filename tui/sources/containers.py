"""Container runtimes as a source of engines: the Docker Engine API, read-only, over its Unix socket. Podman's
compatible API (`podman system service`) answers the same calls; where the two differ in shape (Podman
leaves `Image` empty for a container run from a root filesystem, names its network, numbers a state
differently) both are read.

Sockets asked, in order, the first that answers: $DOCKER_HOST and $CONTAINER_HOST when they name a unix://
path, /var/run/docker.sock, /run/podman/podman.sock, $XDG_RUNTIME_DIR/podman/podman.sock (rootless Podman),
$XDG_RUNTIME_DIR/docker.sock and ~/.docker/run/docker.sock (rootless Docker, Docker Desktop). Only GETs are
sent: /version, /containers/json, /containers/{id}/json and /containers/{id}/logs.

What a container's process is on the host comes from the API's State.Pid; where no socket answers, the host's
/proc still tells the container of a process (tui.sources.container_of), and conmon's command line Podman's
name for it (tui.sources.port_holder). Blocking: called from threads (the machine source, discovery's walk,
the logs screen's worker).
"""

from __future__ import annotations

import os
import stat
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import psutil

from tui.base.secrets import mask_urls, says_secret
from tui.engines.argv import mask_argv
from tui.engines.known import ENGINES
from tui.model.containers import Container
from tui.sources.json_answers import json_object, strict_int
from tui.sources.processes import tree_pids

TIMEOUT_S = 1.0  # a runtime's API answers from memory: a socket slower than this is said, not waited for
REFRESH_S = 5.0  # the container list is asked again at most this often
LOG_LINES = 500


def socket_paths(environ: Mapping[str, str] | None = None) -> list[str]:
    """The runtime sockets that exist on this machine, in the order they are asked."""
    env = os.environ if environ is None else environ
    paths: list[str] = []
    for var in ("DOCKER_HOST", "CONTAINER_HOST"):
        url = env.get(var, "")
        if url.startswith("unix://"):
            paths.append(urlsplit(url).path or url[len("unix://"):])
    paths += ["/var/run/docker.sock", "/run/podman/podman.sock"]
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        paths += [f"{runtime_dir}/podman/podman.sock", f"{runtime_dir}/docker.sock"]
    home = env.get("HOME")
    if home:
        paths.append(f"{home}/.docker/run/docker.sock")
    return [p for p in dict.fromkeys(paths) if _is_socket(p)]


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


class RuntimeApiError(Exception):
    """A runtime's API could not be read: the message says which socket and why."""


def _masked(argv: Sequence[str]) -> tuple[str, ...]:
    table = next((e.options for e in ENGINES if e.is_engine(argv)), None)
    return mask_argv(argv, table)


def runtime_of(version: Any) -> str:
    """"podman" or "docker", from GET /version: Podman names its component "Podman Engine"."""
    components = version.get("Components") if isinstance(version, dict) else None
    for c in components if isinstance(components, list) else ():
        if isinstance(c, dict) and "podman" in str(c.get("Name", "")).lower():
            return "podman"
    return "docker"


def container_from(listed: Mapping[str, Any], inspected: Mapping[str, Any] | None, runtime: str,
                   via: str) -> Container:
    """One container from its entry in GET /containers/json and, for a running one, GET
    /containers/{id}/json (Docker's and Podman's shapes alike)."""
    info: Mapping[str, Any] = inspected or {}
    state, host, config = (json_object(info.get(key)) for key in ("State", "HostConfig", "Config"))
    names = listed.get("Names")
    name = (names[0] if isinstance(names, list) and names else info.get("Name")) or None
    # Docker lists an image id ("sha256:…") once its tag moved to another image; Podman "" for a container run
    # from a root filesystem: the name the container was made from, else none
    image = next((i for i in (listed.get("Image"), config.get("Image"))
                  if isinstance(i, str) and i and not i.startswith("sha256:")), None)
    ports = []
    listed_ports = listed.get("Ports")
    for p in listed_ports if isinstance(listed_ports, list) else ():
        if isinstance(p, dict) and p.get("Type", "tcp") == "tcp" and strict_int(p.get("PublicPort")):
            ports.append((str(p.get("IP") or "0.0.0.0"), p["PublicPort"],
                          strict_int(p.get("PrivatePort")) or 0))
    memory = strict_int(host.get("Memory"))
    cpus: float | None = None
    if strict_int(host.get("NanoCpus")):
        cpus = host["NanoCpus"] / 1e9
    elif (strict_int(host.get("CpuQuota")) or 0) > 0:
        # 0: the kernel's default period
        cpus = host["CpuQuota"] / (strict_int(host.get("CpuPeriod")) or 100_000)
    command: list[str] = []
    if isinstance(info.get("Path"), str) and info["Path"]:
        command = [info["Path"], *(a for a in info.get("Args") or () if isinstance(a, str))]
    elif isinstance(listed.get("Command"), str):
        command = listed["Command"].split()
    return Container(
        id=str(listed.get("Id") or info.get("Id") or ""), runtime=runtime,
        name=name.lstrip("/") if isinstance(name, str) else None,
        image=image if isinstance(image, str) else None,
        state=str(state.get("Status") or listed.get("State") or "") or None,
        restarts=strict_int(info.get("RestartCount")),
        oom_killed=state.get("OOMKilled") if isinstance(state.get("OOMKilled"), bool) else None,
        pid=strict_int(state.get("Pid")) or None,
        ports=tuple(sorted(set(ports))),
        address=_address(listed) or _address(info),
        memory_limit_bytes=memory or None, cpu_limit=cpus,
        command=_masked(command) if command else (), via=via)


def _address(data: Mapping[str, Any]) -> str | None:
    settings = data.get("NetworkSettings")
    if not isinstance(settings, dict):
        return None
    if settings.get("IPAddress"):
        return str(settings["IPAddress"])
    for net in json_object(settings.get("Networks")).values():
        if isinstance(net, dict) and net.get("IPAddress"):
            return str(net["IPAddress"])
    return None


def argv_secrets(argv: Sequence[str]) -> list[str]:
    """The secret values a command line holds, as its engine's table reads it (tui.engines.argv): an
    option's value, and within a shell's command string (`sh -c "… --api-key K"`) each word masked there."""
    found = []
    for raw, shown in zip(argv, _masked(argv), strict=False):
        if raw == shown:
            continue
        words, masked = raw.split(), shown.split()
        pairs = zip(words, masked, strict=True) if len(words) == len(masked) > 1 else [(raw, shown)]
        for word, mask in pairs:
            if word != mask:
                name, eq, value = word.partition("=")
                found.append(value if eq and mask.startswith(name + "=") else word)
    return [s.strip("'\"") for s in found if len(s.strip("'\"")) >= 4]


def env_secrets(env: Sequence[object]) -> list[str]:
    """The values of the container's environment whose names say they are secret (HF_TOKEN, VLLM_API_KEY)."""
    out = []
    for item in env:
        name, eq, value = str(item).partition("=")
        if eq and says_secret(name) and len(value) >= 4:
            out.append(value)
    return out


def _commands(pid: int | None) -> list[list[str]]:
    """The command lines of process `pid` and its descendants, those that can be read."""
    out = []
    for p in sorted(tree_pids(pid)) if pid is not None else ():
        try:
            out.append(psutil.Process(p).cmdline())
        except psutil.Error:
            continue
    return out


def masked_line(line: str, secrets: Sequence[str]) -> str:
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        line = line.replace(secret, "***")
    return mask_urls(line)


def log_lines(body: bytes, tty: bool) -> list[str]:
    """The text of GET /containers/{id}/logs: a container without a TTY has its stdout and stderr
    multiplexed in frames (8 bytes: the stream, three zero bytes, the length, big-endian), one with a TTY
    sends the bytes as they were."""
    if tty or len(body) < 8 or body[0] not in (0, 1, 2) or body[1:4] != b"\0\0\0":
        return body.decode("utf-8", "replace").splitlines()
    out = bytearray()
    at = 0
    while at + 8 <= len(body):
        (size,) = struct.unpack(">I", body[at + 4:at + 8])
        out += body[at + 8:at + 8 + size]
        at += 8 + size
    return out.decode("utf-8", "replace").splitlines()


class RuntimeApi:
    """One runtime's API on its socket (blocking calls, each within TIMEOUT_S)."""

    def __init__(self, path: str, timeout_s: float = TIMEOUT_S) -> None:
        self.path = path
        # a socket has no TLS: verify=False spares loading the CA bundle (~1 MB of a process running for days)
        self._client = httpx.Client(transport=httpx.HTTPTransport(uds=path, verify=False),
                                    base_url="http://runtime", timeout=timeout_s, trust_env=False)
        self.runtime: str | None = None

    def _get(self, path: str, **params: Any) -> httpx.Response:
        try:
            response = self._client.get(path, params=params or None)
        except httpx.HTTPError as exc:
            raise RuntimeApiError(f"the container runtime's API at {self.path} did not answer: "
                                f"{exc or type(exc).__name__}") from exc
        if response.status_code != 200:
            raise RuntimeApiError(f"the container runtime's API at {self.path} answered {path} with HTTP "
                                f"{response.status_code}")
        return response

    def _json(self, path: str, **params: Any) -> Any:
        try:
            return self._get(path, **params).json()
        except ValueError as exc:
            raise RuntimeApiError(f"the container runtime's API at {self.path} answered {path} with no JSON"
                                ) from exc

    def containers(self) -> list[Container]:
        """Every running container, each inspected for its process, limits and restart count."""
        if self.runtime is None:
            self.runtime = runtime_of(self._json("/version"))
        listed = self._json("/containers/json")
        via = f"the {self.runtime} API ({self.path})"
        out = []
        for entry in listed if isinstance(listed, list) else ():
            if not isinstance(entry, dict) or not entry.get("Id"):
                continue
            try:
                inspected = self._json(f"/containers/{quote(str(entry['Id']))}/json")
            except RuntimeApiError:
                inspected = None  # gone between the two calls
            try:
                out.append(container_from(entry, inspected if isinstance(inspected, dict) else None,
                                          self.runtime, via))
            except (TypeError, ValueError, AttributeError, KeyError):
                continue  # an entry of another shape than either runtime's: not a container read here
        return out

    def logs(self, container_id: str, lines: int = LOG_LINES, secrets: Sequence[str] = ()) -> list[str]:
        """Its log's last `lines` lines, every secret its command line or environment holds masked (an
        engine may print its arguments: vLLM logs its non-default ones, its API key among them), and
        `secrets` (the key enginetop was given for it)."""
        inspected = self._json(f"/containers/{quote(container_id)}/json")
        config = inspected.get("Config") if isinstance(inspected, dict) else None
        config = config if isinstance(config, dict) else {}
        tty = bool(config.get("Tty"))
        argv = [inspected.get("Path") or "", *(inspected.get("Args") or ())] if isinstance(inspected, dict) \
            else []
        known = [*secrets, *argv_secrets([a for a in argv if isinstance(a, str)]),
                 *env_secrets(config.get("Env") or ())]
        body = self._get(f"/containers/{quote(container_id)}/logs", stdout=1, stderr=1, tail=lines).content
        return [masked_line(line, known) for line in log_lines(body, tty)]

    def close(self) -> None:
        self._client.close()


class Catalog:
    """The containers of every runtime whose socket answers, asked again at most every `refresh_s`;
    `error` says what could not be read (no socket at all is not an error: /proc still tells a process's
    container). Thread-safe: the machine source's thread and discovery may ask at once."""

    def __init__(self, refresh_s: float = REFRESH_S, environ: Mapping[str, str] | None = None) -> None:
        self.refresh_s = refresh_s
        self._environ = environ
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._reading = False
        self._containers: list[Container] = []
        self._apis: dict[str, RuntimeApi] = {}
        self.error: str | None = None
        self.sockets: list[str] = []

    def containers(self) -> list[Container]:
        """The containers as last read; read again when older than `refresh_s` (by one caller at a time: the
        others take the last list meanwhile, rather than wait on a slow socket)."""
        with self._lock:
            now = time.monotonic()
            due = now - self._at >= self.refresh_s and not self._reading
            if due:
                self._at, self._reading = now, True
        if due:
            try:
                containers, error = self._read()
            finally:
                with self._lock:
                    self._reading = False
            with self._lock:
                self._containers, self.error = containers, error
        with self._lock:
            return list(self._containers)

    def forget(self) -> None:
        """Ask the runtimes again at the next call (the environment's sockets may have changed)."""
        with self._lock:
            self._at = -float("inf")

    def _read(self) -> tuple[list[Container], str | None]:
        self.sockets = socket_paths(self._environ)
        found: dict[str, Container] = {}
        errors = []
        for path in self.sockets:
            api = self._apis.get(path) or self._apis.setdefault(path, RuntimeApi(path))
            try:
                for c in api.containers():
                    found.setdefault(c.id, c)  # Docker's and Podman's sockets may be one runtime's
            except RuntimeApiError as exc:
                errors.append(str(exc))
            except Exception as exc:  # an answer of no shape either runtime gives: said, never raised
                errors.append(f"the container runtime's API at {path} answered in an unknown shape: {exc!r}")
        return list(found.values()), "; ".join(errors) or None

    def by_id(self, container_id: str) -> Container | None:
        return next((c for c in self.containers() if c.id == container_id), None)

    def publishing(self, port: int) -> Container | None:
        """The container that publishes host `port`, if a runtime says so."""
        return next((c for c in self.containers() if any(p[1] == port for p in c.ports)), None)

    def logs(self, container: Container, lines: int = LOG_LINES, secrets: Sequence[str] = ()) -> list[str]:
        """The container's log, its last `lines` lines, from the runtime that runs it (RuntimeApiError: why
        not)."""
        self.containers()
        # the secrets of the command lines its processes run, as the host sees them: a key its entrypoint
        # script gave the engine is on the engine's own command line, not on the container's
        secrets = [*secrets, *(s for argv in _commands(container.pid) for s in argv_secrets(argv))]
        for path in self.sockets:
            api = self._apis.get(path)
            if api is not None and api.runtime == container.runtime:
                try:
                    return api.logs(container.id, lines, secrets)
                except RuntimeApiError:
                    continue
        raise RuntimeApiError(f"{container.runtime} container {container.label()}: no runtime API socket "
                            "answered for its log (start one: `podman system service`, or mount "
                            "/var/run/docker.sock)")

    def close(self) -> None:
        for api in self._apis.values():
            api.close()



_SHARED: Catalog | None = None
_SHARED_LOCK = threading.Lock()


def shared_catalog() -> Catalog:
    """The process's one catalog: the machine source, each engine's configuration and discovery ask the same
    runtimes through it, at most every REFRESH_S (the sockets are looked up again at each refresh, from the
    environment then)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Catalog()
        return _SHARED
