"""Joules per token on the real llama-server under load: a RAPL tree under ENGINETOP_SYSFS_ROOT whose package
counter a thread advances at a known 30 W, the engine polled and the host sampled as the dashboard does (its
EngineSource, its HostSampler reading RAPL there and the engine's process tree), all into one Store. The
engine runs on this machine's CPU and holds no GPU, so its energy is the CPU package's: J/token must be
30 W over the engine's own generation rate (its llamacpp:tokens_predicted_total) over the same window, within
5 %. What this checks is the energy side (the counter's change read at the host sampler's moments, the
window, the attribution); the rate side is the engine's counter itself, as every other figure is."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sysfs_tree import Ticker, rapl_package

from tui.base.process import free_port
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_source import EngineSource, LocalPids
from tui.sources.host import HostSampler
from widgets.energy import energy_rows
from widgets.fmt import Rows

WATTS = 30.0
WINDOW_S = 8.0


async def _traffic(url: str, stop: asyncio.Event) -> int:
    """One stream after another until stopped: short completions, so the engine's counter (which moves as
    each request ends) steps often."""
    sent = 0
    async with httpx.AsyncClient(timeout=60) as client:
        while not stop.is_set():
            body = {"messages": [{"role": "user", "content": f"Count from {sent} upwards, in words."}],
                    "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            reply = await client.post(f"{url}/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            sent += 1
    return sent


async def test_joules_per_token_on_llama_server_is_the_package_watts_over_its_generation_rate(
        llama_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    package = rapl_package(tmp_path, 0, energy_uj=123_000_000)
    store = Store(rate_window_s=WINDOW_S)
    host = HostSampler()
    transports = Transports()
    source = EngineSource(EngineTarget("llama", llama_server.url), transports, interval_s=0.5, timeout_s=2.0)
    pid = llama_server.launched.pid
    polled: list[tuple[float, float]] = []  # (t, the engine's own generated-token counter)
    stop = asyncio.Event()
    with Ticker([(package, WATTS * 1e6)], every_s=0.02):
        streams = [asyncio.create_task(_traffic(llama_server.url, stop)) for _ in range(2)]
        try:
            end = time.monotonic() + WINDOW_S + 2.5
            next_host = 0.0
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_host:
                    store.add(await asyncio.to_thread(host.sample, {"llama": pid}))
                    next_host = now + 1.0
                for sample in await source.read():
                    store.add(sample)
                    if sample.reading is not None and sample.reading.generation_tokens_total is not None:
                        polled.append((sample.t, sample.reading.generation_tokens_total))
                await asyncio.sleep(0.5)
        finally:
            stop.set()
            sent = sum(await asyncio.gather(*streams))
            await transports.aclose()
    stats = store.engines["llama"].stats
    assert sent >= 2 and store.host is not None and store.host.cpu_energy is not None
    assert store.host.cpu_energy.source == "counter"
    assert store.host.cpu_energy.watts == pytest.approx(WATTS, rel=0.03)
    assert stats.energy_scope == "cpu package" and stats.energy_source == "counter"
    # the engine's own rate over exactly the energy's window (the package's readings' span, ending at the
    # last host sample): its counter as polled here, taken at the window's ends by linear interpolation
    t_end = store.host.t
    t0, t1 = max(t_end - store.host.cpu_energy.seconds, polled[0][0]), min(t_end, polled[-1][0])
    assert t1 - t0 >= store.host.cpu_energy.seconds / 2, (polled, t_end)

    def at(t: float) -> float:
        (ta, na), (tb, nb) = next(((a, b) for a, b in itertools.pairwise(polled) if a[0] <= t <= b[0]))
        return na + (nb - na) * (t - ta) / (tb - ta) if tb > ta else nb

    rate = (at(t1) - at(t0)) / (t1 - t0)
    assert rate > 1.0, polled
    expected = WATTS / rate
    print(f"gen {rate:.1f} tok/s over {t1 - t0:.1f} s, {sent} requests: J/token {stats.joules_per_token:.4f} "
          f"against {expected:.4f} (30 W / rate); package window {store.host.cpu_energy.watts:.2f} W")
    assert stats.joules_per_token == pytest.approx(expected, rel=0.05)
    assert stats.tokens_per_joule == pytest.approx(1 / expected, rel=0.05)
    grid = Rows()
    energy_rows(grid, stats)
    assert grid.text().plain.startswith("energy ") and "cpu package, counter" in grid.text().plain


async def test_a_forwarder_in_front_takes_none_of_the_engines_joules(
        llama_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same engine watched twice: bare, and through a TCP forwarder (socat) on another port. The
    forwarder is no engine (tui.sources.port_holder): it holds no CPU share, so the bare engine's joules per
    token stay the package's watts over its own generation rate, and the forwarded column says what holds
    its port instead of taking socat's memory and energy for the engine's."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    package = rapl_package(tmp_path, 0, energy_uj=55_000_000)
    port = free_port()
    socat = subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                              f"TCP:127.0.0.1:{llama_server.port}"])
    forwarded = f"http://127.0.0.1:{port}"
    targets = [EngineTarget("llama", llama_server.url), EngineTarget("fwd", forwarded)]
    store = Store(rate_window_s=WINDOW_S)
    host = HostSampler()
    transports = Transports()
    sources = [EngineSource(t, transports, interval_s=0.5, timeout_s=2.0) for t in targets]
    pids = LocalPids(targets)
    polled: list[tuple[float, float]] = []
    stop = asyncio.Event()
    try:
        deadline = time.monotonic() + 10
        while httpx.get(f"{forwarded}/health", timeout=2).status_code != 200:  # socat listens
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        found = pids()
        assert found["llama"] == llama_server.launched.pid, found
        assert isinstance(found["fwd"], str) and f"a socat forwarder (PID {socat.pid}" in found["fwd"], found
        with Ticker([(package, WATTS * 1e6)], every_s=0.02):
            streams = [asyncio.create_task(_traffic(forwarded, stop)) for _ in range(2)]
            try:
                end = time.monotonic() + WINDOW_S + 2.5
                next_host = 0.0
                while time.monotonic() < end:
                    now = time.monotonic()
                    if now >= next_host:
                        store.add(await asyncio.to_thread(host.sample, pids()))
                        next_host = now + 1.0
                    for source in sources:
                        for sample in await source.read():
                            store.add(sample)
                            if sample.name == "llama" and sample.reading is not None and \
                                    sample.reading.generation_tokens_total is not None:
                                polled.append((sample.t, sample.reading.generation_tokens_total))
                    await asyncio.sleep(0.5)
            finally:
                stop.set()
                await asyncio.gather(*streams)
    finally:
        for source in sources:
            await source.aclose()
        await transports.aclose()
        socat.terminate()
        socat.wait(10)
    assert store.host is not None and store.host.cpu_energy is not None
    assert [m.engine for m in store.host.engines] == ["llama"]
    llama, fwd = store.engines["llama"], store.engines["fwd"]
    t_end = store.host.t
    t0, t1 = max(t_end - store.host.cpu_energy.seconds, polled[0][0]), min(t_end, polled[-1][0])

    def at(t: float) -> float:
        (ta, na), (tb, nb) = next(((a, b) for a, b in itertools.pairwise(polled) if a[0] <= t <= b[0]))
        return na + (nb - na) * (t - ta) / (tb - ta) if tb > ta else nb

    rate = (at(t1) - at(t0)) / (t1 - t0)
    assert rate > 1.0, polled
    print(f"bare engine: {rate:.1f} tok/s, J/token {llama.stats.joules_per_token:.4f} against "
          f"{WATTS / rate:.4f}; forwarded column: {fwd.stats.energy_note!r}, {fwd.port_note!r}")
    assert llama.stats.energy_scope == "cpu package" and llama.stats.energy_shared_with == ()
    assert llama.stats.joules_per_token == pytest.approx(WATTS / rate, rel=0.05)
    # the forwarded column: no process of this machine is its engine, so no energy, no memory of socat's
    assert fwd.stats.energy_w is None and fwd.stats.joules_per_token is None and fwd.rss_bytes is None
    assert fwd.port_note is not None and fwd.port_note.startswith(f"a socat forwarder (PID {socat.pid}")
    config = fwd.sample.config if fwd.sample is not None else None
    assert config is not None and not config.argv
    assert any("argv: not read: a socat forwarder" in why for why in config.lacks), config.lacks
