"""The runtimes' API read as Docker and Podman answer it (tui.sources.containers), and the holder of a port
named for what it is (tui.sources.port_holder).

Docker cannot run here, so Docker Engine's answers are served from recorded files in the shape of its API
reference, over a real HTTP server on a real Unix socket, beside Podman's answers recorded from the real
`podman system service` (tests/data/runtime_api/README.md). The real Podman is read live in
tests/test_containers_real.py."""

from __future__ import annotations

import http.server
import json
import os
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tui.sources.containers import Catalog, RuntimeApi, RuntimeApiError, log_lines, socket_paths
from tui.sources.port_holder import held_by, whose_port

DATA = Path(__file__).parent / "data" / "runtime_api"
DOCKER_KEY = "sk-docker-recorded-0001"
DOCKER_TOKEN = "hf_docker_recorded_0002"


def _frame(stream: int, text: str) -> bytes:
    body = text.encode()
    return struct.pack(">BxxxI", stream, len(body)) + body


class _Runtime(http.server.BaseHTTPRequestHandler):
    answers: dict[str, bytes] = {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        body = self.answers.get(path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body if body is not None else b'{"message": "no such container"}')

    def log_message(self, *args: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):  # type: ignore[no-untyped-def]
        request, _ = super().get_request()
        return request, ("runtime", 0)  # BaseHTTPRequestHandler wants a (host, port) client address


@pytest.fixture
def docker_socket() -> Iterator[str]:
    """A Docker Engine API on a Unix socket, answering the recorded Docker shape."""
    listed = json.loads((DATA / "docker-containers.json").read_text())
    cid = listed[0]["Id"]
    _Runtime.answers = {
        "/version": json.dumps({"Version": "28.2.2", "ApiVersion": "1.50",
                                "Components": [{"Name": "Engine", "Version": "28.2.2"}]}).encode(),
        "/containers/json": json.dumps(listed).encode(),
        f"/containers/{cid}/json": (DATA / "docker-inspect.json").read_bytes(),
        f"/containers/{cid}/logs": _frame(1, "INFO non-default args: {'model': 'Qwen/Qwen3-8B', "
                                              f"'api_key': ['{DOCKER_KEY}']}}\n")
        + _frame(2, f"WARNING token from env {DOCKER_TOKEN}\n")
        + _frame(1, "INFO Started server process [1]\n"),
    }
    folder = tempfile.mkdtemp(prefix="et-dk-")
    path = os.path.join(folder, "docker.sock")
    server = _UnixServer(path, _Runtime)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        os.unlink(path)
        os.rmdir(folder)


def test_dockers_answers_read_as_a_container(docker_socket: str) -> None:
    catalog = Catalog(environ={"DOCKER_HOST": f"unix://{docker_socket}"})
    [c] = catalog.containers()
    assert catalog.error is None and catalog.sockets == [docker_socket]
    assert (c.runtime, c.name, c.image, c.state, c.restarts, c.oom_killed, c.pid) == \
        ("docker", "vllm-qwen", "vllm/vllm-openai:v0.11.0", "running", 3, False, 41234)
    # one published port, listed for IPv4 and IPv6: both kept, as Docker publishes both
    assert c.ports == (("0.0.0.0", 8000, 8000), ("::", 8000, 8000))
    assert c.address == "172.17.0.2"
    assert (c.memory_limit_bytes, c.cpu_limit) == (32 * 2**30, 8.0)
    # its command line, masked with vLLM's own table: the key never kept
    assert c.command[:3] == ("python3", "-m", "vllm.entrypoints.openai.api_server")
    assert DOCKER_KEY not in " ".join(c.command) and "***" in c.command
    assert c.via == f"the docker API ({docker_socket})"
    assert catalog.publishing(8000) == c and catalog.publishing(8001) is None


def test_a_containers_log_never_shows_its_secrets(docker_socket: str) -> None:
    """vLLM logs its non-default arguments, its API key among them; an HF_TOKEN may be printed too: both
    masked, and the key enginetop was given for it."""
    catalog = Catalog(environ={"DOCKER_HOST": f"unix://{docker_socket}"})
    [c] = catalog.containers()
    lines = catalog.logs(c, secrets=["Qwen3-8B"])
    text = "\n".join(lines)
    assert "Started server process" in text and "non-default args" in text
    for secret in (DOCKER_KEY, DOCKER_TOKEN, "Qwen3-8B"):
        assert secret not in text
    assert text.count("***") == 3


def test_podmans_answers_read_as_a_container() -> None:
    """Podman 4.3's compatible answers, as recorded: no image for a container run from a root filesystem
    (`Image` "", `ImageID` "sha256:"), its network named "podman", its limits in HostConfig."""
    from tui.sources.containers import container_from, runtime_of

    [listed] = json.loads((DATA / "podman-4.3-containers.json").read_text())
    inspected = json.loads((DATA / "podman-4.3-inspect.json").read_text())
    assert runtime_of(json.loads((DATA / "podman-4.3-version.json").read_text())) == "podman"
    c = container_from(listed, inspected, "podman", "the podman API (/run/podman/podman.sock)")
    assert (c.name, c.image, c.state, c.restarts, c.pid) == ("et-llama", None, "running", 0, 28318)
    assert c.ports == (("127.0.0.1", 18080, 8080),) and c.address == "10.88.0.2"
    assert (c.memory_limit_bytes, c.cpu_limit) == (2 * 2**30, 1.5)
    assert c.command[0].endswith("llama-server") and "-np" in c.command


def test_log_frames_and_a_tty_containers_raw_log() -> None:
    frames = _frame(1, "one\ntw") + _frame(2, "o\nthree\n")
    assert log_lines(frames, tty=False) == ["one", "two", "three"]
    assert log_lines(b"raw line\nnext\n", tty=True) == ["raw line", "next"]


def test_a_dead_socket_says_which_and_why(tmp_path: Path) -> None:
    dead = tmp_path / "d.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))  # a socket file no one listens on
    s.close()
    api = RuntimeApi(str(dead))
    with pytest.raises(RuntimeApiError, match=f"{dead}.*did not answer"):
        api.containers()
    catalog = Catalog(environ={"DOCKER_HOST": f"unix://{dead}"})
    assert catalog.containers() == [] and catalog.error is not None and str(dead) in catalog.error


def test_which_sockets_are_asked(tmp_path: Path) -> None:
    def sock(path: Path) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
        return str(path)

    rootless = sock(tmp_path / "run" / "podman" / "podman.sock")
    desktop = sock(tmp_path / "home" / ".docker" / "run" / "docker.sock")
    (tmp_path / "plain").write_text("not a socket")
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "HOME": str(tmp_path / "home"),
           "DOCKER_HOST": f"unix://{tmp_path / 'plain'}", "CONTAINER_HOST": "ssh://host/run/podman.sock"}
    found = socket_paths(env)
    assert rootless in found and desktop in found and str(tmp_path / "plain") not in found
    assert found.index(rootless) < found.index(desktop)


# ---- who holds a port -----------------------------------------------------------------------------------

LISTEN = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
          " print(s.getsockname()[1], flush=True); time.sleep(60)")


def _listener_named(name: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    """A real process listening on a loopback port whose argv[0] is `name` (bash's `exec -a`), as an ssh
    tunnel, kubectl or docker-proxy shows in the process table."""
    # Python finds its library from argv[0]: told where it is, since argv[0] is another program's name
    proc = subprocess.Popen(["bash", "-c", f'exec -a {name} "$0" "$@"', sys.executable, "-c", LISTEN, *args],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONHOME": sys.base_prefix})
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    deadline = time.monotonic() + 5
    while psutil.Process(proc.pid).cmdline()[0] != name and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, port


@pytest.mark.parametrize(("name", "args", "words"), [
    ("ssh", ("-N", "-L", "8000:localhost:8000", "gpu-box"),
     "an ssh tunnel (PID {pid}, through gpu-box): the engine is elsewhere"),
    ("kubectl", ("port-forward", "svc/vllm", "8000:8000"),
     "kubectl port-forward (PID {pid}, to svc/vllm): the engine is elsewhere"),
    ("socat", ("TCP-LISTEN:8000,fork", "TCP:10.0.0.5:8000"),
     "a socat forwarder (PID {pid}, to 10.0.0.5:8000): the engine is where it forwards to"),
    ("enginetop", ("proxy", "--engine", "a=http://127.0.0.1:8080"),
     "enginetop's proxy (PID {pid}): the engine is the one it relays to"),
])
def test_a_tunnel_or_forwarder_is_never_the_engine(name: str, args: tuple[str, ...], words: str) -> None:
    proc, port = _listener_named(name, *args)
    try:
        holder = whose_port("127.0.0.1", port)
        assert holder.pid == proc.pid and holder.engine_pid is None and holder.container is None
        assert holder.why_none == words.format(pid=proc.pid) == holder.forwarder
    finally:
        proc.kill()
        proc.wait()


def test_a_publisher_whose_container_cannot_be_told_is_said_so() -> None:
    """docker-proxy with no API socket and no engine at its container address: named, and nothing of it is
    taken for the engine."""
    proc, port = _listener_named("docker-proxy", "-proto", "tcp", "-host-ip", "127.0.0.1", "-host-port", "1",
                                 "-container-ip", "192.0.2.77", "-container-port", "8000")
    try:
        holder = held_by(proc.pid, port, Catalog(environ={}))
        assert holder.engine_pid is None
        assert holder.forwarder == f"docker-proxy (PID {proc.pid}) publishes it for docker"
        assert "cannot be told without the runtime's API socket" in (holder.why_none or "")
    finally:
        proc.kill()
        proc.wait()


def test_any_other_listener_is_the_engine_itself() -> None:
    proc, port = _listener_named("my-server")
    try:
        holder = whose_port(None, port)
        assert (holder.engine_pid, holder.forwarder, holder.why_none, holder.container) == \
            (proc.pid, None, None, None)
    finally:
        proc.kill()
        proc.wait()


def test_nothing_listening() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    holder = whose_port("127.0.0.1", port, Catalog(environ={}))
    assert holder.pid is None and holder.engine_pid is None
    assert holder.why_none == "no process of this machine was found listening on its port"


def test_the_exporter_labels_an_engines_container() -> None:
    from tui.exporter.metrics import ProbeMetrics
    from tui.model.containers import CgroupReading, CgroupUse, Container

    metrics = ProbeMetrics()
    c = Container("a" * 64, "podman", name="et-llama", image="ghcr.io/ggml-org/llama.cpp:server")
    cgroup = CgroupReading("/libpod_parent/libpod-" + "a" * 64, 1, memory_bytes=300 * 2**20,
                           memory_limit_bytes=2**30, cpu_quota_cores=1.5)
    use = CgroupUse(10.0, periods=100, throttled_periods=40, throttled_share=0.4, cores_used=1.45)
    metrics.placement("llama", c, cgroup, use)
    text = metrics.exposition().decode()
    assert ('enginetop_engine_container_info{container="et-llama",engine="llama",'
            'image="ghcr.io/ggml-org/llama.cpp:server",runtime="podman"} 1.0') in text
    for what, value in (("memory_limit_bytes", "1.073741824e+09"), ("cpu_quota_cores", "1.5"),
                        ("cpu_throttled_share", "0.4"), ("cpu_cores_used", "1.45")):
        assert f'enginetop_container{{container="et-llama",engine="llama",what="{what}"}} {value}' in text
    metrics.gone("llama")  # down: nothing of where it ran is served
    text = metrics.exposition().decode()
    assert 'engine="llama"' not in text.split("enginetop_engine_container_info", 1)[1].split("# HELP")[0]
    assert 'enginetop_container{' not in text


def test_a_port_published_by_the_firewall_alone(docker_socket: str) -> None:
    """Docker with its userland proxy off: no process listens on the published port. The runtime says who
    publishes it; its process (the recorded PID, not one of this machine's containers) is no engine here."""
    catalog = Catalog(environ={"DOCKER_HOST": f"unix://{docker_socket}"})
    s = socket.socket()
    s.bind(("127.0.0.1", 8000))  # held only so that nothing else listens: never listen()ed
    try:
        holder = whose_port("127.0.0.1", 8000, catalog)
    finally:
        s.close()
    assert holder.pid is None and holder.container is not None and holder.container.name == "vllm-qwen"
    assert holder.forwarder == ("published by docker for container vllm-qwen (no forwarding process: the "
                                "firewall's)")
    assert holder.engine_pid is None
    assert "whose process cannot be found on this machine" in (holder.why_none or "")


def test_energy_meters_never_take_a_forwarder_for_the_engine() -> None:
    """bench, probe and capacity's energy (EnginePids) follow the same rule: a forwarder's port gives no
    process at all."""
    from tui.sources.energy_meter import EnginePids

    proc, port = _listener_named("socat", "TCP-LISTEN:1,fork", "TCP:127.0.0.1:2")
    try:
        pids = EnginePids("fwd", f"http://127.0.0.1:{port}")
        assert pids() == {} and not pids.found
    finally:
        proc.kill()
        proc.wait()


def test_secrets_of_a_shell_string_and_the_environment() -> None:
    from tui.sources.containers import argv_secrets, env_secrets, masked_line

    argv = ["sh", "-c", "exec llama-server -m /m.gguf --api-key sk-shell-0003 --port 8080"]
    found = argv_secrets(argv) + env_secrets(["PATH=/bin", "HF_TOKEN=hf_env_0004", "VLLM_API_KEY=sk-env-5"])
    assert set(found) == {"sk-shell-0003", "hf_env_0004", "sk-env-5"}
    line = "args: {'api_key': ['sk-shell-0003']} token hf_env_0004 at https://u:pw-0006@hf.co/x"
    assert masked_line(line, found) == "args: {'api_key': ['***']} token *** at https://u:***@hf.co/x"


def test_a_recording_keeps_where_each_engine_ran(tmp_path: Path) -> None:
    """The host samples recorded carry each engine's container and cgroup; the report says where each ran and
    the most of its quota's periods throttled over a window."""
    import time as clock

    from tui.model.containers import CgroupReading, Container
    from tui.model.samples import EngineSample, HostSample, ProcessTreeMemory
    from tui.record.reader import Recording
    from tui.record.report import render_recording
    from tui.record.writer import Recorder

    c = Container("b" * 64, "podman", name="et-llama", image="localhost/llama:cpu")
    rec = Recorder(tmp_path / "r.sqlite", {"llama": "http://127.0.0.1:8080"})
    t0 = clock.monotonic()
    rec(EngineSample("llama", "http://127.0.0.1:8080", t0, clock.time(), "up"))
    for i, (periods, throttled) in enumerate(((100, 10), (150, 50), (200, 60))):
        cgroup = CgroupReading("/libpod_parent/libpod-" + "b" * 64, 1, memory_bytes=300 * 2**20,
                               memory_limit_bytes=2**30, cpu_quota_cores=1.0, cpu_periods=periods,
                               cpu_throttled_periods=throttled, cpu_throttled_s=throttled / 100,
                               cpu_usage_s=float(i))
        tree = ProcessTreeMemory("llama", 4242, 300 * 2**20, 1, (4242,), container=c, cgroup=cgroup)
        rec(HostSample(t0 + 1 + 5 * i, engines=(tree,)))
    rec.close()
    recording = Recording(tmp_path / "r.sqlite")
    [row] = [r for r in recording.rows() if isinstance(r.item, HostSample)][-1:]
    assert row.item.engines[0].container == c and row.item.engines[0].cgroup.cpu_periods == 200
    html = render_recording(recording)
    assert "Where the engines ran" in html
    assert "in container et-llama · podman · image localhost/llama:cpu · 1.0 GiB limit · 1 cores" in html
    assert "80%" in html  # 40 of the 50 periods between the first two readings: the most over a window
