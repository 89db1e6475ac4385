"""The fleet view's figures for the REAL engines, read through a real Prometheus (1 s scrapes), checked
against a direct scrape of the same engine's /metrics:

- counters (tokens generated, prompt tokens): equal, once both have seen the same state (engine idle);
- generation tok/s under steady load: within 35 % of the rate of two direct scrapes 10 s apart (llama.cpp
  adds a request's tokens when it ends, and Prometheus' rate extrapolates to its window's edges: the two
  windows do not cover exactly the same requests);
- vLLM's TTFT / ITL p50: over a window holding all the load and nothing before it, Prometheus' quantile and
  the one enginetop computes from the direct scrapes' bucket deltas agree within 5 % (histogram_quantile
  is blind to a scale common to every bucket, but rate() extrapolates a bucket that started at zero a
  little less than one that did not, by half a scrape interval at most).

A missing engine fails (conftest), never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

import httpx
import pytest
import waiting
from prometheus_server import running_prometheus
from screen import screen_text
from textual.widgets import Input
from waiting import until_async

from tui.base.paths import runs_dir
from tui.base.process import Launched, free_port, launch, stop_group
from tui.engines.install_llamacpp import demo_argv
from tui.fleet.options import FleetOptions
from tui.fleet.prometheus import PrometheusClient
from tui.fleet.source import FleetSource
from tui.record.reader import Recording
from tui.sources.metrics import parse_reading
from tui.sources.rates import histogram_quantile
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.fleet import EngineScreen, FleetView
from widgets.plots import TimePlot

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine
RATE_TOLERANCE = 0.35
RATE_WINDOW_S = 10.0  # tui.fleet.source: a rate() window of 4 scrapes (1 s here), at least 10 s
Q_TOL = 0.05


async def direct(url: str):
    async with httpx.AsyncClient() as client:
        r = await client.get(f"{url}/metrics", timeout=10)
    return time.monotonic(), parse_reading(r.text)


async def load(url: str, seconds: float, streams: int = 2, max_tokens: int = 24,
               stop: asyncio.Event | None = None) -> int:
    """Requests back to back on `streams` streams for `seconds` or until `stop`; stream i asks i tokens more
    than the first, so that streams started together do not keep ending together."""
    done = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal done
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (stop and stop.is_set()):
            r = await client.post(f"{url}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": f"Tell me about lighthouse number {i}."}],
                "max_tokens": max_tokens + i, "temperature": 0})
            r.raise_for_status()
            done += 1

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, i) for i in range(streams)))
    return done


async def fleet_read(prom_url: str):
    client = PrometheusClient(prom_url)
    source = FleetSource(client)
    try:
        samples = await source.read()
    finally:
        await client.aclose()
    assert source.error is None, source.error
    [sample] = samples
    return sample


async def settle(prom, url: str) -> tuple:
    """Wait until Prometheus' newest scrape shows what a direct scrape shows and the engine is idle.

    Counters settle before gauges: llama-server counts a request's tokens before it frees its slot, so
    a scrape between the two has the final totals and still a request running."""
    deadline = time.monotonic() + 15
    while True:
        _, now = await direct(url)
        sample = await fleet_read(prom.url)
        idle = sample.reading.running == now.running == 0
        if (idle and sample.reading.generation_tokens_total == now.generation_tokens_total) or \
                time.monotonic() > deadline:
            return sample, now
        await asyncio.sleep(0.5)


async def test_llama_server_through_prometheus_matches_its_own_metrics(llama_server, tmp_path):
    with running_prometheus({"llama": [f"127.0.0.1:{llama_server.port}"]}) as prom:
        prom.wait_for("llamacpp:tokens_predicted_total")
        # llama.cpp adds a request's tokens when it ends, so its rate over 10 s moves a request at a time:
        # on a loaded machine (3-10 tok/s) a direct window and Prometheus' window of nearly the same 10 s
        # held 4 and 1 request ends (3.2 against 0.9 tok/s). So: many short requests, the direct rate over
        # the same trailing window as Prometheus' rate() (FleetSource: 4 scrapes, at least 10 s), and read
        # again until both windows held the same request ends; a figure wrong by more than the tolerance
        # never agrees.
        stop = asyncio.Event()
        task = asyncio.create_task(load(llama_server.url, 90, streams=4, max_tokens=6, stop=stop))
        scrapes = [await direct(llama_server.url)]
        seen: list[tuple[float | None, float]] = []

        async def agree():
            t, reading = await direct(llama_server.url)
            scrapes.append((t, reading))
            during = await fleet_read(prom.url)
            older = [(ts, r) for ts, r in scrapes if ts <= t - RATE_WINDOW_S]
            if not older:
                return None
            t0, first = older[-1]
            rate = (reading.generation_tokens_total - first.generation_tokens_total) / (t - t0)
            seen.append((during.stats.gen_tps, rate))
            close = rate > 0 and during.stats.gen_tps == pytest.approx(rate, rel=RATE_TOLERANCE)
            return during if close else None

        try:
            during = await until_async(agree, "Prometheus' rate within 35 % of the direct one", 60, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; (Prometheus, direct) tok/s, the last ten: {seen[-10:]}") from None
        finally:
            stop.set()
        assert await task > 0
        assert during.reading.dialect == "llamacpp" and during.health == "up"
        assert during.instance == f"127.0.0.1:{llama_server.port}" and during.host == "127.0.0.1"
        sample, now = await settle(prom, llama_server.url)
        assert sample.reading.generation_tokens_total == now.generation_tokens_total
        assert sample.reading.prompt_tokens_processed_total == now.prompt_tokens_processed_total
        assert sample.reading.running == now.running == 0
        # llama.cpp has no histograms and no KV gauge: n/a through Prometheus too, never 0
        assert sample.stats.ttft_p50_s is None and sample.reading.kv_cache_usage is None

        # `enginetop record --prometheus`: the same fleet samples, figures and labels, kept in a recording
        out = tmp_path / "fleet.enginetop.sqlite"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tui", "record", "--prometheus", prom.url, "--refresh", "1",
            "--duration", "5", "-o", str(out), cwd=ROOT, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert f"recording the fleet in {prom.url}" in err.decode()
        recorded = [r.item for r in Recording(out).rows() if r.kind == "engine"]
        assert len(recorded) >= 3
        last = recorded[-1]
        assert last.instance == f"127.0.0.1:{llama_server.port}" and last.health == "up"
        assert last.stats is not None and last.reading.dialect == "llamacpp"
        assert last.reading.generation_tokens_total == now.generation_tokens_total  # idle since settle()


async def test_vllm_through_prometheus_matches_its_own_metrics(vllm_server):
    with running_prometheus({"vllm": [f"127.0.0.1:{vllm_server.port}"]}) as prom:
        prom.wait_for("vllm:generation_tokens_total")
        await asyncio.sleep(2)
        _, before = await direct(vllm_server.url)
        assert await load(vllm_server.url, 8, max_tokens=16) > 0
        sample, after = await settle(prom, vllm_server.url)
        assert sample.reading.dialect == "vllm" and sample.model and sample.labels
        assert sample.reading.generation_tokens_total == after.generation_tokens_total
        assert sample.reading.prompt_tokens_processed_total == after.prompt_tokens_processed_total
        assert sample.reading.kv_cache_usage is not None
        delta = [(b, a - c) for (b, a), (_, c) in zip(after.ttft_buckets, before.ttft_buckets, strict=True)]
        assert sample.stats.ttft_p50_s == pytest.approx(histogram_quantile(0.5, delta), rel=Q_TOL)
        delta = [(b, a - c) for (b, a), (_, c) in zip(after.itl_buckets, before.itl_buckets, strict=True)]
        assert sample.stats.itl_p50_s == pytest.approx(histogram_quantile(0.5, delta), rel=Q_TOL)


def start_keyed_llama(key_file: Path) -> tuple[str, Launched]:
    """A second real llama-server that wants an API key (read from a file: never on a command line)."""
    port = free_port()
    launched = launch(demo_argv(port, "--threads", "1", "--api-key-file", str(key_file)),
                      runs_dir() / f"test-llama-keyed-{port}.log")
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert launched.alive(), "\n".join(launched.log_tail(40))
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        return False

    waiting.until(healthy, "the keyed llama-server healthy", 120, every=0.5)
    return f"127.0.0.1:{port}", launched


async def open_from_table(pilot, app: EnginetopApp, instance: str) -> EngineScreen:
    view = app.screen.query_one(FleetView)
    view.query_one(Input).value = ""
    await pilot.press("slash", *instance)  # `/` opens the filter, as in htop
    await until(pilot, lambda: view.table.selected == instance, 10, f"{instance} selected in the table")
    await pilot.press("enter")
    screen = app.screen
    assert isinstance(screen, EngineScreen) and screen.engine_name == instance
    return screen


async def until(pilot, condition, timeout: float, what: str) -> None:
    await until_async(condition, what, timeout, every=0.3, pause=pilot.pause)


async def test_an_engine_opened_from_the_fleet_table_is_probed_with_f(llama_server, tmp_path):
    """The real llama-server through a real Prometheus: enter opens it in the column-and-plots view, `f`
    probes it at the origin Prometheus scrapes, the result is in its probe panel and on its plots. A second
    real llama-server wants an API key (Prometheus scrapes it with the key): its probe says 401, readably,
    and succeeds when the key is given for it (--api-key-file NAME=PATH with --prometheus)."""
    key = "sk-fleet-probe-test-5551"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    keyed, launched = start_keyed_llama(key_file)
    try:
        scrapes = [{"job_name": "keyed", "scrape_interval": "1s", "static_configs": [{"targets": [keyed]}],
                    "authorization": {"type": "Bearer", "credentials_file": str(key_file)}}]
        with running_prometheus({"llama": [f"127.0.0.1:{llama_server.port}"]}, scrapes=scrapes) as prom:
            prom.wait_for("llamacpp:tokens_predicted_total", min_series=2)
            app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=prom.url, refresh_s=1.0),
                                         redraw_interval_s=0.5))
            async with app.run_test(size=(200, 60)) as pilot:
                view = app.screen.query_one(FleetView)
                await until(pilot, lambda: view.table.row_count == 2 and all(
                    r.values[0] == "up" for r in view.table.rows), 20, "both engines up in the table")
                name = f"127.0.0.1:{llama_server.port}"
                screen = await open_from_table(pilot, app, name)
                await until(pilot, lambda: not screen.backfill, 15, "the back-fill")
                state = app.store.engines[name]
                # Prometheus has no slots: the opened engine's are read from it directly, and only its
                await until(pilot, lambda: state.sample.slots is not None, 15, "the opened engine's slots")
                assert len(state.sample.slots.slots) == 4
                await until(pilot, lambda: "slot 3" in screen_text(app), 10, "the slots drawn")
                assert app.store.engines[keyed].sample.slots is None
                await pilot.press("f")
                await until(pilot, lambda: state.probes, 90, "a probe result")
                _, result = state.probes[-1]
                assert result.ok, result.error
                assert result.url == llama_server.url and result.token_source == "server"
                assert result.completion_tokens == app.config.probe_max_tokens
                await until(pilot, lambda: f"{name} probe" in screen_text(app), 10, "the probe drawn")
                text = screen_text(app)
                assert "median of last 1: decode" in text and f"{name} probe" in text  # panel, plot legend
                for plot_id, at, value in (("#plot-gen", result.decode_at, result.decode_tps),
                                           ("#plot-ttft", result.ttft_at, result.ttft_s)):
                    data, now = screen.query_one(plot_id, TimePlot).shown
                    xs, ys = data.markers[name]
                    assert ys == [value] and abs(now + xs[0] - at) < 1e-6, plot_id
                await pilot.press("escape")

                screen = await open_from_table(pilot, app, keyed)
                await pilot.press("f")
                state = app.store.engines[keyed]
                await until(pilot, lambda: state.probes, 30, "the keyed engine's probe result")
                _, refused = state.probes[-1]
                assert not refused.ok and refused.status == 401
                await until(pilot, lambda: "failed: HTTP 401" in screen_text(app), 10, "the refusal drawn")
                text = screen_text(app)
                assert "failed: HTTP 401" in text and "! HTTP 401" in text, text
                assert "(the engine wants an API key)" in text and key not in text
                assert app.is_running
            # `--api-key-file NAME=PATH` with --prometheus: the key for that engine of the fleet
            options = FleetOptions(prometheus=prom.url, refresh_s=1.0, engine_keys={keyed: key})
            app = EnginetopApp(AppConfig(fleet=options, redraw_interval_s=0.5))
            async with app.run_test(size=(200, 60)) as pilot:
                view = app.screen.query_one(FleetView)
                await until(pilot, lambda: view.table.row_count == 2, 20, "both engines in the table")
                screen = await open_from_table(pilot, app, keyed)
                await pilot.press("f")
                state = app.store.engines[keyed]
                await until(pilot, lambda: state.probes, 90, "the keyed engine's probe result, with its key")
                _, answered = state.probes[-1]
                assert answered.ok and answered.status == 200, answered.error
                assert answered.completion_tokens == app.config.probe_max_tokens
                await until(pilot, lambda: "median of last 1" in screen_text(app), 10, "the probe drawn")
                text = screen_text(app)
                assert "median of last 1: decode" in text and key not in text
    finally:
        stop_group(launched)
