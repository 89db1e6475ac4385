"""`enginetop exporter` run as a user runs it (`python -m tui exporter ...`): bad input, an engine down,
a scrape during a probe, stopping on SIGTERM. Engines here are loopback SSE servers that misbehave on
purpose and a port nobody listens on; the real engines are in test_exporter_engines.py."""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sse_server import Scenario, SSEServer, running
from waiting import until

from tui.base.process import free_port

ROOT = Path(__file__).resolve().parents[1]


def enginetop(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def samples(body: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(body: str, name: str, **labels: str) -> float | None:
    return samples(body).get((name, frozenset(labels.items())))


class Exporter:
    """`enginetop exporter` in a subprocess on a free loopback port, stopped with SIGTERM."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tui", "exporter", "--listen", f"127.0.0.1:{self.port}", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            try:
                httpx.get(self.url, timeout=1)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def scrape(self) -> str:
        r = httpx.get(self.url, timeout=5)
        r.raise_for_status()
        return r.text

    def wait_for(self, predicate, timeout: float = 20) -> str:
        last = [""]

        def scraped() -> str | None:
            last[0] = self.scrape()
            return last[0] if predicate(last[0]) else None

        return until(scraped, "the scrape to show it", timeout, every=0.1, detail=lambda: last[0][-3000:])

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _out, err = self.proc.communicate(timeout=15)
        return self.proc.returncode, err


@pytest.fixture
def exporter_factory() -> Iterator:
    started: list[Exporter] = []

    def make(*args: str) -> Exporter:
        started.append(Exporter(*args))
        return started[-1]

    yield make
    for e in started:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.communicate()


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    with running({"slow": Scenario(first_token_delay_s=2.0), "fast": Scenario(per_token_delay_s=0.001)}) as s:
        yield s


def test_unknown_workload_is_refused_with_the_names_that_exist() -> None:
    proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--workload", "short,chatty")
    assert proc.returncode == 2
    assert "unknown workload 'chatty'" in proc.stderr and "long-prefill" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_port_in_use_is_a_clear_message_and_exit_2() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}")
    assert proc.returncode == 2
    assert f"port {port} is already in use" in proc.stderr and "Traceback" not in proc.stderr


def test_non_loopback_listen_needs_allow_remote() -> None:
    port = free_port()
    proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--listen", f"0.0.0.0:{port}")
    assert proc.returncode == 2
    assert "not a loopback address" in proc.stderr and "--allow-remote" in proc.stderr
    assert "ssh -L" in proc.stderr
    # An address of no interface here is refused for that reason, even when allowed.
    proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--listen", "192.0.2.1:9469",
                     "--allow-remote")
    assert proc.returncode == 2 and "not an address of this machine" in proc.stderr


def test_no_engine_and_bad_values_are_refused() -> None:
    assert "at least one --engine" in enginetop("exporter").stderr
    proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--engine", "b=http://127.0.0.1:9/")
    assert proc.returncode == 2 and "a and b are the same engine" in proc.stderr
    proc = enginetop("exporter", "--engine", "a=http://127.0.0.1:9", "--probe-every", "0")
    assert proc.returncode == 2 and "--probe-every must be a positive" in proc.stderr


def test_allow_remote_serves_on_every_interface(exporter_factory) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tui", "exporter", "--engine", "a=http://127.0.0.1:9",
                             "--listen", f"0.0.0.0:{port}", "--allow-remote", "--probe-every", "60"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert "enginetop_probe_requests_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    assert proc.returncode == 0


def test_engine_down_counts_failures_by_reason_and_keeps_serving(exporter_factory, sse: SSEServer) -> None:
    dead = free_port()
    exp = exporter_factory("--engine", f"dead=http://127.0.0.1:{dead}", "--engine",
                           f"e500={sse.url_for('http500')}", "--engine", f"drop={sse.url_for('drop')}",
                           "--engine", f"ok={sse.url_for('fast')}", "--probe-every", "0.5",
                           "--max-tokens", "8")

    def failed(body: str, engine: str, reason: str) -> float:
        found = value(body, "enginetop_probe_failed_total", engine=engine, workload="short", reason=reason)
        return found or 0

    first = exp.wait_for(lambda b: failed(b, "dead", "refused") >= 1
                         and value(b, "enginetop_probe_succeeded_total", engine="ok", workload="short") >= 1)
    n = failed(first, "dead", "refused")
    later = exp.wait_for(lambda b: failed(b, "dead", "refused") > n and failed(b, "drop", "dropped") >= 1
                         and failed(b, "e500", "http_500") >= 1)
    assert value(later, "enginetop_probe_up", engine="dead") == 0
    assert value(later, "enginetop_probe_up", engine="ok") == 1
    assert value(later, "enginetop_probe_up", engine="e500") == 0
    assert value(later, "enginetop_probe_succeeded_total", engine="dead", workload="short") == 0
    # The working engine's figures are there beside the dead ones, labelled with the model it named.
    assert value(later, "enginetop_probe_last_decode_tokens_per_second", engine="ok", workload="short",
                 model="sse-test", token_source="server") > 0
    assert (value(later, "process_resident_memory_bytes") or 0) > 0
    assert value(later, "process_cpu_seconds_total") is not None
    rc, err = exp.stop()
    assert rc == 0, err
    assert "dead: probe failed (refused)" in err and "Traceback" not in err
    assert err.count("dead: probe failed") == 1  # a line when it goes down, not one per probe


def test_a_scrape_during_a_probe_answers_at_once(exporter_factory, sse: SSEServer) -> None:
    exp = exporter_factory("--engine", f"slow={sse.url_for('slow')}", "--probe-every", "60",
                           "--max-tokens", "4", "--jitter", "0")
    # The first probe goes out at once and its first token is 2 s away.
    deadline = time.monotonic() + 10
    while not any(r.path.startswith("/s/slow") for r in list(sse.requests)):
        assert time.monotonic() < deadline, "the probe was never sent"
        time.sleep(0.02)
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        body = exp.scrape()
        took.append(time.perf_counter() - t0)
        # still in flight: nothing counted yet
        assert value(body, "enginetop_probe_requests_total", engine="slow", workload="short") == 0
    assert max(took) < 0.5, took
    done = exp.wait_for(
        lambda b: value(b, "enginetop_probe_requests_total", engine="slow", workload="short") == 1)
    assert value(done, "enginetop_probe_last_ttft_seconds", engine="slow", workload="short",
                 model="sse-test") >= 2.0
    assert exp.stop()[0] == 0


async def test_probes_never_overlap_on_an_engine_and_are_spread() -> None:
    from tui.exporter.schedule import ProbeScheduler, Schedule
    from tui.model.targets import EngineTarget
    from tui.probe.workloads import WorkloadParams

    seen = []
    paced = Scenario(first_token_delay_s=0.05, per_token_delay_s=0.01)
    with running({"a": paced, "b": paced}) as server:
        targets = [EngineTarget("a", server.url_for("a")), EngineTarget("b", server.url_for("b"))]
        schedule = Schedule(every_s=0.9, workloads=("short", "thinking-off", "agent"), agent_turns=2,
                            params=WorkloadParams(max_tokens=4), rounds=2, jitter=0.1)
        await ProbeScheduler(targets, schedule, seen.append).run()
    for name in ("a", "b"):
        mine = sorted((r for r in seen if r.engine == name), key=lambda r: r.sent_at)
        assert [r.workload for r in mine] == ["short", "thinking-off", "agent", "agent"] * 2
        assert all(r.ok for r in mine)
        for prev, nxt in itertools.pairwise(mine):
            assert nxt.sent_at >= prev.ended_at  # one at a time on an engine
        starts = [r.sent_at for r in mine if r.turn in (None, 1)]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert min(gaps) >= schedule.slot_s * (1 - schedule.jitter) - 0.02, gaps  # spaced, never stacked
    # The second engine starts part of a slot after the first, not at the same instant.
    first = {name: min(r.sent_at for r in seen if r.engine == name) for name in ("a", "b")}
    assert first["b"] - first["a"] >= schedule.slot_s / 2 * (1 - schedule.jitter) - 0.02


def test_a_profile_is_probed_at_its_url_with_its_key_file_and_the_key_never_shown(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    key = "exporter-profile-s3cret"
    with running(default=Scenario(require_key=key, per_token_delay_s=0.001)) as server:
        profiles = tmp_path / "config" / "enginetop" / "profiles"
        profiles.mkdir(parents=True)
        (tmp_path / "key").write_text(key + "\r\n")  # as a user's editor may save it
        (profiles / "keyed.toml").write_text(
            'name = "keyed"\nengine = "llama.cpp"\nargv = ["llama-server", "--port", "${PORT}"]\n'
            f'host = "127.0.0.1"\nport = {server.port}\napi_key_file = "{tmp_path / "key"}"\n')
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        exp = Exporter("--profile", "keyed", "--probe-every", "0.5", "--max-tokens", "8")
        try:
            body = exp.wait_for(lambda b: (value(b, "enginetop_probe_succeeded_total", engine="keyed",
                                                 workload="short") or 0) >= 1)
            assert value(body, "enginetop_probe_up", engine="keyed") == 1
            assert key not in body
            chats = [r for r in server.requests if r.path.endswith("/completions")]
            sent = [r.headers.get("authorization") for r in chats]
            assert sent and all(a == f"Bearer {key}" for a in sent)
            unknown = enginetop("exporter", "--profile", "no-such-profile")
            assert unknown.returncode == 2 and "no-such-profile" in unknown.stderr
            assert "Traceback" not in unknown.stderr
        finally:
            rc, err = exp.stop()
        assert rc == 0 and key not in err
