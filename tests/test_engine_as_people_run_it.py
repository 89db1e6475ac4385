"""llama-server as its README starts it (no --metrics), and with /slots off too: the column is read from
whatever the engine answers, and each figure says where it came from."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from tests.conftest import start_engine
from tests.shown import show
from tui.base.process import stop_group
from tui.engines.install_llamacpp import demo_argv
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine_metrics import METRICS_OFF
from tui.sources.engine_source import EngineSource
from widgets.engine_panel import render_engine

pytestmark = pytest.mark.engine

ENGINETOP = [sys.executable, "-m", "tui"]
CLIENTS, TURNS, TOKENS, THINK_S = 3, 2, 32, 0.5


def plain_llama(name: str, *extra: str):
    """The demo llama-server without --metrics, as llama-server's own README starts one."""
    return start_engine(name, "llama-server",
                        lambda port: [a for a in demo_argv(port, *extra) if a != "--metrics"])


async def _agent(client: httpx.AsyncClient, url: str, n: int) -> list[int]:
    """One agent: TURNS requests in a row, a think time between them; the tokens each response reported."""
    told = []
    for turn in range(TURNS):
        reply = await client.post(f"{url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": f"Agent {n}, step {turn}: list some fruit."}],
            "max_tokens": TOKENS, "temperature": 0})
        reply.raise_for_status()
        told.append(reply.json()["usage"]["completion_tokens"])
        await asyncio.sleep(THINK_S)
    return told


async def _watch_while(url: str, traffic) -> tuple[Store, list[int]]:
    """The engine polled once a second, as the dashboard does, while `traffic` runs."""
    store = Store()
    transports = Transports()
    source = EngineSource(EngineTarget("plain", url), transports)
    try:
        job = asyncio.ensure_future(traffic)
        while not job.done():
            for sample in await source.read():
                store.add(sample)
            await asyncio.wait({job}, timeout=1.0)
        for _ in range(2):  # the slots as they stand once the last request ended
            await asyncio.sleep(0.3)
            for sample in await source.read():
                store.add(sample)
        return store, job.result()
    finally:
        await transports.aclose()


def test_llama_server_without_metrics_is_read_from_its_slots_props_and_models() -> None:
    engine = plain_llama("plain", "--parallel", "4")
    try:
        async def traffic() -> list[int]:
            async with httpx.AsyncClient() as client:
                runs = await asyncio.gather(*(_agent(client, engine.url, n) for n in range(CLIENTS)))
            return [t for run in runs for t in run]

        store, told = asyncio.run(_watch_while(engine.url, traffic()))
        state = store.engines["plain"]
        reading = state.sample.reading
        assert reading is not None and reading.origin == "/slots"
        show("generated, counted from /slots vs the responses' own", (reading.generation_tokens_total,
                                                                     sum(told)))
        assert abs(reading.generation_tokens_total - sum(told)) <= 0.10 * sum(told)
        assert reading.requests_finished_total >= CLIENTS * TURNS - 1  # the first poll is the baseline
        assert reading.prompt_tokens_processed_total > 0 and state.stats.gen_tps is not None
        config = state.sample.config
        assert config is not None and config.sources[:3] == ("/props", "/v1/models", "/slots")
        assert (config.quantization, config.train_context, config.slots) == ("Q4_K - Medium", 32768, 4)
        assert config.params and config.params > 200e6 and config.model_bytes and config.model_bytes > 100e6
        panel = render_engine(state, width=200).plain
        show("the column", panel)
        assert "from /slots: llama-server runs without --metrics" in panel and METRICS_OFF not in panel
        assert "Q4_K - Medium · 268.1M params" in panel
        out = subprocess.run([*ENGINETOP, "snapshot", "--engine", f"plain={engine.url}", "--json",
                              "--interval", "0.5"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        snap = json.loads(out.stdout)["engines"]["plain"]
        assert snap["config"] is not None and snap["slots"] is not None
        assert snap["config"]["facts"].startswith("Q4_K - Medium · 268.1M params")
    finally:
        stop_group(engine.launched)


def test_llama_server_with_neither_metrics_nor_slots_says_which_is_off_and_shows_its_props() -> None:
    engine = plain_llama("bare", "--no-slots")
    try:
        async def poll() -> Store:
            store = Store()
            transports = Transports()
            source = EngineSource(EngineTarget("bare", engine.url), transports)
            for sample in await source.read():
                store.add(sample)
            await transports.aclose()
            return store

        state = asyncio.run(poll()).engines["bare"]
        assert state.sample.health == "up" and state.sample.metrics_error == METRICS_OFF
        config = state.sample.config
        assert config is not None and config.context_tokens == 4096 and config.quantization == "Q4_K - Medium"
        panel = render_engine(state, width=200).plain
        show("the column", panel)
        assert "metrics disabled: start llama-server with --metrics" in panel
        assert "/slots is off: start llama-server without --no-slots" in panel
    finally:
        stop_group(engine.launched)
