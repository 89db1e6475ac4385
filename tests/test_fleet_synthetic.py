"""The fleet view against a real Prometheus scraping a SYNTHETIC fleet (tests/synthetic_fleet.py): 210
engines of the three dialects (vLLM with new and pre-0.11 names) and 52 dcgm-exporter GPUs on 13 nodes, all
on loopback with the real metric names and labels. The synthetic counters move at known rates, so every
figure Prometheus computes for the table can be checked against what the engine was made to do.

One Prometheus (1 s scrapes, enginetop's alert rules loaded) serves the whole module.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx
import pytest
from prom_proxy import PromProxy
from prometheus_server import running_prometheus
from rich.text import Text
from screen import screen_text
from synthetic_fleet import ITL_BOUNDS, ITL_CDF, TTFT_BOUNDS, TTFT_CDF, make_fleet
from textual.widgets import Input
from waiting import until_async

from tui.base.process import free_port
from tui.fleet.alerts import KV_SATURATED, QUEUE_GROWING, STALLED, THROTTLED_DROP, rule_group
from tui.fleet.backfill import throttle_expr
from tui.fleet.dcgm import DcgmDirectSource, DcgmPrometheusSource
from tui.fleet.match import gpus_of
from tui.fleet.options import FleetOptions
from tui.fleet.prometheus import PromError, PrometheusClient
from tui.fleet.source import ALERT_FIGURES, FleetSource
from tui.net.policy import InsecureSecret
from tui.record.reader import Recording
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.replay import ReplayApp, fleet_source
from tui.ui.screens.dashboard import Dashboard
from tui.ui.screens.fleet import EngineScreen, FleetView, GpusScreen
from widgets.engine_panel import EnginePanel
from widgets.fleet_table import COLUMNS, WIDTHS, build_rows
from widgets.gpu_panel import GpuPanel
from widgets.plots import TimePlot
from widgets.probe_panel import ProbePanel

N_ENGINES, N_NODES, GPUS_PER_NODE = 210, 13, 4
RATE_TOLERANCE = 0.03  # for ratios of two rates over the same samples: their shortfalls cancel
# rate() extrapolates to the window's ends only by up to 1.1 average scrape intervals: when scrapes come late
# (a busy machine) it covers less of the window and reads LOW, never high, as the stamped counters are exact.
# 6.4 % low was seen once beside the engine tests; a neighbouring engine's rate is 12 % off or more.
RATE_SHORTFALL = 0.10
# A scrape that misses Prometheus' 1 s timeout (a stalled machine: a real engine starting on the other worker)
# reads its target down until the next: a test about something else reads again.
SCRAPED = "a read after every scrape answered in time"
SPECIAL = ("flapping", "stalled", "vanishing", "queue", "slowing")


def rate_of(want: float):
    """What Prometheus' rate() may read for a counter that moves at exactly `want` per second."""
    return pytest.approx(want * (1 - RATE_SHORTFALL / 2), rel=RATE_SHORTFALL / 2 + 0.01)


def plain(content) -> str:
    """The characters of what a panel last drew (a Text, or Groups of them)."""
    if hasattr(content, "renderables"):
        return "\n".join(plain(part) for part in content.renderables)
    return content.plain


def expected_quantile(q: float, bounds, cdf) -> float:
    """histogram_quantile's linear interpolation inside the bucket where the quantile falls."""
    lower, below = 0.0, 0.0
    for bound, frac in zip(bounds, cdf, strict=True):
        if frac >= q:
            return lower + (bound - lower) * (q - below) / (frac - below)
        lower, below = bound, frac
    raise AssertionError("quantile beyond the last finite bucket")


@pytest.fixture(scope="module")
def fleet_prom(tmp_path_factory):
    fleet = make_fleet(N_ENGINES, N_NODES, GPUS_PER_NODE)
    fleet.vanish_after_s = 14.0
    fleet.spawn()  # its own process: the scrapes must not slow the app under test
    rules = tmp_path_factory.mktemp("rules") / "enginetop-rules.json"
    rules.write_text(json.dumps({"groups": [rule_group()]}))
    try:
        with running_prometheus({}, scrapes=fleet.scrapes(1.0), rule_files=[rules]) as prom:
            prom.wait_for("up", min_series=N_ENGINES + N_NODES)
            # a rate over a window the series started in is extrapolated from less: wait for full windows
            time.sleep(12)
            yield fleet, prom, rules
    finally:
        fleet.stop()


async def read(prom_url: str, match: str | None = None, **kw) -> tuple[FleetSource, dict]:
    client = PrometheusClient(prom_url, **kw)
    source = FleetSource(client, match)
    try:
        samples = await source.read()
    finally:
        await client.aclose()
    return source, {s.name: s for s in samples}


async def test_every_synthetic_engine_is_found_with_prometheus_figures_matching_its_rates(fleet_prom):
    fleet, prom, _ = fleet_prom

    async def every_plain_engine_up() -> tuple[FleetSource, dict] | None:
        source, samples = await read(prom.url)
        plain = [samples.get(e.instance) for e in fleet.engines if e.kind not in SPECIAL]
        return (source, samples) if all(s is not None and s.health == "up" for s in plain) else None

    source, samples = await until_async(every_plain_engine_up, SCRAPED, timeout=30, every=1)
    assert source.error is None
    assert len(samples) == N_ENGINES
    ttft50 = expected_quantile(0.5, TTFT_BOUNDS, TTFT_CDF)
    ttft90 = expected_quantile(0.9, TTFT_BOUNDS, TTFT_CDF)
    itl50 = expected_quantile(0.5, ITL_BOUNDS, ITL_CDF)
    for e in fleet.engines:
        s = samples[e.instance]
        assert (s.job, s.instance, s.host) == (e.job, e.instance, e.instance.split(":")[0])
        if e.kind in SPECIAL:
            continue
        assert s.reading.dialect == e.dialect.removesuffix("-old")
        assert s.stats.gen_tps == rate_of(e.gen_rate), e
        assert s.reading.running == e.running and s.reading.waiting == e.waiting
        if e.dialect == "llamacpp":
            # llama.cpp counts prompt tokens without the cached ones: processed = computed + cached
            assert s.stats.prompt_processed_tps == rate_of(e.prompt_rate)
            assert s.model is None and s.reading.kv_cache_usage is None and s.stats.ttft_p50_s is None
        else:
            assert s.stats.prompt_processed_tps == rate_of(e.prompt_rate)
            assert s.reading.kv_cache_usage == pytest.approx(e.kv)
            assert s.model == e.model
            assert s.stats.ttft_p50_s == pytest.approx(ttft50, rel=1e-6)
            assert s.stats.ttft_p90_s == pytest.approx(ttft90, rel=1e-6)
            # the pre-0.11 time_per_output_token_seconds counts as ITL; gpu_cache_usage_perc as KV
            assert s.stats.itl_p50_s == pytest.approx(itl50, rel=1e-6)
        assert s.stats.prefix_cache_hit_rate == pytest.approx(0.4, rel=RATE_TOLERANCE)


async def test_queries_per_refresh_do_not_grow_with_the_fleet(fleet_prom):
    _, prom, _ = fleet_prom

    # A target that goes down between a read's targets query and its `up` query costs that read one targets
    # query more, for its lastError (the flapping engines do it by design, and a scrape that missed its
    # timeout on a busy machine too: 21 against 20 seen once): pairs of reads until neither had one.
    async def same_queries() -> int | None:
        whole, all_samples = await read(prom.url)
        few, few_samples = await read(prom.url, match='{instance=~"synthetic-node-0[12]:.*"}')
        assert len(all_samples) == N_ENGINES and 0 < len(few_samples) < 40
        return whole.queries_per_read if whole.queries_per_read == few.queries_per_read else None

    queries = await until_async(same_queries, "two reads without a target gone down between", timeout=30,
                                every=1)
    assert queries <= 20


async def test_a_bad_selector_shows_prometheus_own_error_and_keeps_nothing_fake(fleet_prom):
    _, prom, _ = fleet_prom
    bad = 'job=~"("'
    source, samples = await read(prom.url, match=bad)
    assert samples == {}
    direct = httpx.post(f"{prom.url}/api/v1/query", data={"query": f"up{{{bad}}}"}).json()
    assert direct["status"] == "error"
    assert source.error_kind == "bad_query"
    assert f"{direct['errorType']}: " in source.error
    # Prometheus' words, verbatim (its message names the whole expression it parsed, so compare the end)
    assert direct["error"].split(": ")[-1] in source.error


async def test_prometheus_going_away_leaves_the_last_values_marked_stale(fleet_prom):
    fleet, _, _ = fleet_prom
    engine = fleet.engines[10]
    assert engine.dialect == "vllm"
    # a Prometheus of its own, stopped in the middle of the test
    static = [{"targets": [f"127.0.0.1:{fleet.port}"],
               "labels": {"__metrics_path__": f"/engine/{engine.index}/metrics", "instance": "only-one:1"}}]
    with running_prometheus({}, scrapes=[{"job_name": "small", "scrape_interval": "1s",
                                          "static_configs": static}]) as small:
        small.wait_for("rate(vllm:generation_tokens_total[5s]) > 0")
        client = PrometheusClient(small.url, timeout=2.0)
        source = FleetSource(client)
        [good] = await source.read()
        assert good.health == "up" and not good.stale and good.stats.gen_tps is not None
    [stale] = await source.read()
    await client.aclose()
    assert stale.stale and source.error_kind == "down"
    assert "refused the connection" in stale.metrics_error
    assert stale.stats == good.stats and stale.reading == good.reading  # the last good values, kept


async def test_401_not_ready_and_timeout_each_say_what_happened(fleet_prom):
    _, prom, _ = fleet_prom
    proxy = PromProxy(prom.url, token="s3cret-token")
    try:
        source, samples = await read(proxy.url)
        assert samples == {} and source.error_kind == "auth"
        assert "needs a token" in source.error and "--prometheus-key-file" in source.error
        source, samples = await read(proxy.url, token="wrong")
        assert source.error_kind == "auth" and "refused" in source.error and "wrong" not in source.error
        source, samples = await read(proxy.url, token="s3cret-token")
        assert source.error is None and len(samples) == N_ENGINES
        client = PrometheusClient(proxy.url, token="s3cret-token", timeout=4.0)
        source = FleetSource(client)
        await source.read()
        assert source.error is None, source.error
        proxy.mode = "not_ready"
        stale = await source.read()
        assert source.error_kind == "not_ready" and "503" in source.error
        assert len(stale) == N_ENGINES and all(s.stale for s in stale)
        with pytest.raises(PromError) as exc:
            await client.ready()
        assert exc.value.kind == "not_ready"
        proxy.mode, proxy.stall_s = "stall", 6.0
        await source.read()
        assert source.error_kind == "timeout" and "within 4s" in source.error
        proxy.mode = "pass"
        fresh = await source.read()
        assert source.error is None and not any(s.stale for s in fresh)
        await client.aclose()
    finally:
        proxy.stop()


async def test_a_flapping_target_reads_down_with_prometheus_own_last_error(fleet_prom):
    fleet, prom, _ = fleet_prom
    flapping = next(e for e in fleet.engines if e.kind == "flapping")
    client = PrometheusClient(prom.url)
    source = FleetSource(client)
    seen = set()
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and seen != {"up", "down with 500"}:
            s = {x.name: x for x in await source.read()}[flapping.instance]
            if s.health == "down":
                assert s.health_reason.startswith("Prometheus cannot scrape it: "), s.health_reason
                # a read whose scrape succeeded again between the `up` query and the targets' has no
                # lastError left to show; Prometheus' own words whenever it has them
                seen.add("down with 500" if "500" in s.health_reason else "down")
            else:
                seen.add(s.health)
            await asyncio.sleep(1.0)
    finally:
        await client.aclose()
    assert {"up", "down with 500"} <= seen


async def test_a_series_that_disappears_leaves_the_engine_listed_with_that_figure_na(fleet_prom):
    fleet, _, _ = fleet_prom
    prom = fleet_prom[1]
    gone = next(e for e in fleet.engines if e.kind == "vanishing")
    while time.monotonic() - fleet.started < fleet.vanish_after_s + 6:  # its gauges stop, then go stale
        await asyncio.sleep(1)

    async def gone_up():
        _, samples = await read(prom.url)
        s = samples[gone.instance]
        return s if s.health == "up" else None

    s = await until_async(gone_up, SCRAPED, timeout=30, every=1)
    assert s.reading.running is None and s.reading.waiting is None
    # its counters stay; unstamped (as a real engine's), they carry the time Prometheus asked, so a scrape
    # that waited for the busy fleet process moves the rate either way (63.4 for 74.1 seen under load)
    assert s.stats.gen_tps == pytest.approx(gone.gen_rate, rel=0.3)


async def test_remote_gpus_through_prometheus_and_directly_decode_the_same(fleet_prom):
    fleet, prom, _ = fleet_prom
    client = PrometheusClient(prom.url)

    async def every_gpu():
        [via_prom] = await DcgmPrometheusSource(client).read()
        return via_prom if len(via_prom.gpus) == N_NODES * GPUS_PER_NODE else None

    via_prom = await until_async(every_gpu, SCRAPED, timeout=30, every=1)
    await client.aclose()
    direct_source = DcgmDirectSource([fleet.dcgm_url(n) for n in range(N_NODES)])
    [direct] = await direct_source.read()
    assert len(via_prom.gpus) == len(direct.gpus) == N_NODES * GPUS_PER_NODE
    for a, b in zip(via_prom.gpus, direct.gpus, strict=True):
        assert (a.host, a.index, a.uuid) == (b.host, b.index, b.uuid)
        assert (a.util_gpu_pct, a.power_w, a.clock_event_mask, a.mem_bw_pct) == \
            (b.util_gpu_pct, b.power_w, b.clock_event_mask, b.mem_bw_pct)
    by = {(g.host, g.index): g for g in via_prom.gpus}
    for sg in fleet.gpus:
        g = by[(sg.host, sg.gpu)]  # `Hostname` on even nodes, `hostname` on odd ones: both read
        assert g.util_gpu_pct == sg.util and g.temp_c == sg.temp and g.name == "NVIDIA H200"
        assert g.clock_event_mask == sg.mask  # the old field name on nodes 2, 6, 10 too
        assert g.throttled == bool(sg.mask & 0xFC)
        assert g.xid_error == sg.xid
        assert (g.mem_bw_pct is None) == (sg.node == 4)  # the blank sentinel reads n/a
    throttled = by[("synthetic-node-03", 0)]
    assert throttled.throttle_reasons == ("power cap", "thermal slowdown (SW)")  # 0x24, as the local panel
    assert by[("synthetic-node-00", 0)].vram_used_bytes == 120000 * 2**20

    # one exporter stops answering: its node's GPUs stay, marked stale, and the message names it
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    direct_source.urls.append(dead)
    [partial] = await direct_source.read()
    assert "refused the connection" in partial.error and dead in partial.error
    assert len(partial.gpus) == N_NODES * GPUS_PER_NODE and not any(g.stale for g in partial.gpus)
    direct_source.urls = [dead]
    [all_dead] = await direct_source.read()
    assert all(g.stale for g in all_dead.gpus) and "refused" in all_dead.error
    await direct_source.aclose()


async def test_in_app_alerts_come_from_the_same_figures(fleet_prom):
    fleet, prom, _ = fleet_prom
    stalled = next(e for e in fleet.engines if e.kind == "stalled")
    full = next(e for e in fleet.engines if e.kind == "kv_full")
    healthy = fleet.engines[20]

    async def every_one_up() -> tuple[FleetSource, dict] | None:
        client = PrometheusClient(prom.url)
        source = FleetSource(client)
        source.backfilled = True  # no history asked: the tracker counts from this read, as it did at first
        try:
            samples = {x.name: x for x in await source.read()}
        finally:
            await client.aclose()
        up = all(samples[e.instance].health == "up" for e in (stalled, full, healthy))
        return (source, samples) if up else None

    source, samples = await until_async(every_one_up, SCRAPED, timeout=30, every=1)
    s, f = samples[stalled.instance], samples[full.instance]
    assert s.reading.running == stalled.running and s.stats.gen_tps == 0  # Prometheus' own figures
    assert s.alerts == () and f.alerts == ()  # not yet: the condition must hold for 60 s / 5 min
    later = time.monotonic() + 301
    assert STALLED in source.alerts.update(s.name, later, "up", s.reading, s.stats, False)
    assert KV_SATURATED in source.alerts.update(f.name, later, "up", f.reading, f.stats, False)
    h = samples[healthy.instance]
    assert source.alerts.update(h.name, later, "up", h.reading, h.stats, True) == ()


def test_snapshot_prints_the_fleet_with_todays_keys_plus_job_instance_host(fleet_prom):
    fleet, prom, _ = fleet_prom
    proc = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--prometheus", prom.url],
                          capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    assert len(out["engines"]) == N_ENGINES and len(out["gpus"]) == N_NODES * GPUS_PER_NODE
    any_down = any(e["health"] == "down" for e in out["engines"].values())
    assert proc.returncode == (3 if any_down else 0), proc.stderr
    e = fleet.engines[20]
    row = out["engines"][e.instance]
    for key in ("url", "dialect", "health", "model", "running", "waiting", "kv_cache_usage", "gen_tps",
                "prompt_processed_tps", "ttft_p50_s", "itl_p50_s", "generation_tokens_total", "interval_s",
                "job", "instance", "host"):
        assert key in row, key
    assert (row["job"], row["instance"], row["host"]) == (e.job, e.instance, e.instance.split(":")[0])
    assert row["gen_tps"] == rate_of(e.gen_rate)
    gpu = out["gpus"][0]
    for key in ("util_gpu_pct", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz", "throttle_reasons",
                "throttled", "host"):
        assert key in gpu, key
    direct = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--dcgm", fleet.dcgm_url(3)],
                            capture_output=True, text=True, timeout=60)
    gpus = json.loads(direct.stdout)["gpus"]
    assert direct.returncode == 0 and [g["host"] for g in gpus] == ["synthetic-node-03"] * GPUS_PER_NODE
    assert gpus[0]["throttle_reasons"] == ["power cap", "thermal slowdown (SW)"] and gpus[0]["throttled"]
    down = subprocess.run([sys.executable, "-m", "tui", "snapshot", "--json", "--prometheus",
                           f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "refused the connection" in down.stderr


async def test_the_table_filters_sorts_opens_an_engine_back_filled_and_returns(fleet_prom):
    fleet, prom, _ = fleet_prom
    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=prom.url, refresh_s=2.0), horizon_s=1800.0,
                                 redraw_interval_s=0.5))
    app_started = time.monotonic()
    async with app.run_test(size=(220, 60)) as pilot:
        view = app.screen.query_one(FleetView)
        await wait_until(pilot, lambda: view.table.row_count >= N_ENGINES, 20, "every engine listed")
        assert view.table.row_count == N_ENGINES
        rates = [r.values[5] for r in view.table.rows if r.values[5] is not None]
        assert rates == sorted(rates, reverse=True)  # busiest first by default
        assert app.focused is view.table  # keys are commands until `/` opens the filter, as in htop
        await pilot.press("slash", *"node-03 vllm")
        expect = [e for e in fleet.engines if e.node == 3 and e.job == "vllm"]
        await wait_until(pilot, lambda: view.table.row_count == len(expect), 5, "the filter applied")
        assert view.table.row_count == len(expect) > 0
        names = {r.name for r in view.table.rows}
        assert names == {e.instance for e in expect}
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not view.table.sort_reverse, 5, "the order reversed")
        rates = [r.values[5] for r in view.table.rows if r.values[5] is not None]
        assert rates == sorted(rates)
        picked = view.table.selected
        await pilot.press("enter")
        assert isinstance(app.screen, EngineScreen) and app.screen.engine_name == picked
        await wait_until(pilot, lambda: not app.screen.backfill, 15, "the back-fill")
        assert app.screen.backfill == ""
        points = app.store.engines[picked].series["gen_tps"].points
        assert points[0][0] < app_started - 5  # history from before the app started, from query_range
        throttle = app.screen.throttle.points
        assert throttle and all(v == 1.0 for _, v in throttle)  # node 3's GPUs are throttled (0x24)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, EngineScreen), 5, "the table again")
        assert app.screen.query_one(FleetView) is view
        await pilot.press("ctrl+g")  # every remote GPU, node by node
        await wait_until(pilot, lambda: isinstance(app.screen, GpusScreen), 5, "the GPUs screen")
        text = plain(app.screen.query_one("#fleet-gpus")._last)
        assert text.count("NVIDIA H200") == N_NODES * GPUS_PER_NODE and "THROTTLED" in text
        await pilot.press("escape")


async def test_dcgm_alone_feeds_the_dashboards_gpu_panel_without_prometheus(fleet_prom):
    fleet, _, _ = fleet_prom
    app = EnginetopApp(AppConfig(fleet=FleetOptions(dcgm=[fleet.dcgm_url(3), fleet.dcgm_url(4)],
                                                    refresh_s=1.0), redraw_interval_s=0.5))
    async with app.run_test(size=(200, 60)) as pilot:
        await wait_until(pilot, lambda: app.store.gpu is not None and app.store.gpu.gpus, 10, "GPU reports")
        assert {g.host for g in app.store.gpu.gpus} == {"synthetic-node-03", "synthetic-node-04"}
        panel = app.screen.query_one("#gpu")
        await wait_until(pilot, lambda: "synthetic-node-04 [0]" in plain(panel._last or Text("")), 10,
                         "the GPU panel drawn")
        text = plain(app.screen.query_one("#gpu")._last)
        assert "synthetic-node-03 [0] NVIDIA H200  THROTTLED: power cap, thermal slowdown (SW)" in text
        assert "synthetic-node-04 [0]" in text


def one_engine(fleet, engine) -> list[dict]:
    """Scrape config of a Prometheus of its own for one synthetic engine, labelled as in the fleet."""
    labels = {"__metrics_path__": f"/engine/{engine.index}/metrics", "instance": engine.instance}
    return [{"job_name": engine.job, "scrape_interval": "1s",
             "static_configs": [{"targets": [f"127.0.0.1:{fleet.port}"], "labels": labels}]}]


async def test_a_partial_answer_shows_prometheus_warning_and_keeps_the_values_fresh(fleet_prom):
    """A Prometheus whose remote_read endpoint is dead answers `success` with `warnings` (its fanout storage
    turns a failed secondary read into a warning): the figures still show, not stale, with the warning."""
    fleet, _, _ = fleet_prom
    engine = fleet.engines[10]
    dead = f"http://127.0.0.1:{free_port()}/api/v1/read"
    scrapes = one_engine(fleet, engine)
    with running_prometheus({}, scrapes=scrapes, config={"remote_read": [{"url": dead, "read_recent": True,
                                                     "remote_timeout": "2s"}]}) as partial:
        partial.wait_for("rate(vllm:generation_tokens_total[5s]) > 0")
        time.sleep(10)  # a full 10 s rate window
        direct = httpx.post(f"{partial.url}/api/v1/query", data={"query": "up"}).json()
        assert direct["status"] == "success" and direct["warnings"], direct

        async def read() -> tuple[FleetSource, object] | None:
            client = PrometheusClient(partial.url)
            source = FleetSource(client)
            try:
                [s] = await source.read()
            finally:
                await client.aclose()
            # rate() reads low while scrapes come late (RATE_SHORTFALL; 25 % low once beside the engine
            # tests): read again until a window held its scrapes
            return (source, s) if s.stats.gen_tps == rate_of(engine.gen_rate) else None

        source, s = await until_async(read, "a read whose rate window held its scrapes", timeout=60, every=1)
    assert source.error_kind == "warning"
    assert source.error.startswith("Prometheus warned: ") and direct["warnings"][0] in source.error
    assert not s.stale and s.health == "up" and s.metrics_error is None
    assert s.reading.running == engine.running


async def test_an_execution_error_422_is_shown_verbatim_and_keeps_the_last_values_stale(fleet_prom):
    """A real 422 from a real Prometheus: one that may load at most 5 samples into a query."""
    fleet, prom, _ = fleet_prom
    engine = fleet.engines[10]
    scrapes = one_engine(fleet, engine)
    with running_prometheus({}, scrapes=scrapes, extra_args=["--query.max-samples=5"]) as tiny:
        tiny.wait_for("vllm:num_requests_running")
        expr = "last_over_time(vllm:generation_tokens_total[1m])"
        deadline = time.monotonic() + 30
        while True:  # 1 s scrapes: a minute's window holds more than 5 samples within seconds
            answer = httpx.post(f"{tiny.url}/api/v1/query", data={"query": expr})
            if answer.status_code != 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
        body = answer.json()
        assert answer.status_code == 422 and body["errorType"] == "execution", body
        client = PrometheusClient(tiny.url)
        with pytest.raises(PromError) as exc:
            await client.query(expr)
        await client.aclose()
        assert exc.value.kind == "bad_query"
        assert f"answered 422: execution: {body['error']}" in exc.value.message

        # the same Prometheus behind a proxy: the fleet read well through the module's, then this one refuses
        proxy = PromProxy(prom.url)
        try:
            client = PrometheusClient(proxy.url)
            source = FleetSource(client)
            good = {s.name: s for s in await source.read()}
            assert source.error is None and len(good) == N_ENGINES
            proxy.upstream = tiny.url
            stale = {s.name: s for s in await source.read()}
            await client.aclose()
        finally:
            proxy.stop()
    assert source.error_kind == "bad_query" and "answered 422: execution: " in source.error
    assert body["error"] in source.error  # Prometheus' own words (this limit's message names no query)
    assert stale.keys() == good.keys()
    for name, s in stale.items():
        assert s.stale and s.metrics_error == source.error
        assert (s.stats, s.reading, s.health) == (good[name].stats, good[name].reading, good[name].health)


async def test_gpus_are_matched_to_engines_by_kubernetes_pod_where_both_name_one_else_by_host(fleet_prom):
    fleet, prom, _ = fleet_prom
    pod_a, pod_b = (next(e for e in fleet.engines if e.pod == f"synthetic-vllm-{p}") for p in "ab")
    plain_engine = next(e for e in fleet.engines if e.node == 7 and not e.pod)
    node3_engine = next(e for e in fleet.engines if e.node == 3 and e.kind == "")
    client = PrometheusClient(prom.url)

    async def every_gpu_and_engine() -> tuple | None:
        [report] = await DcgmPrometheusSource(client).read()
        _, samples = await read(prom.url)
        up = all(samples[e.instance].health == "up" for e in (pod_a, pod_b, plain_engine, node3_engine))
        return (report, samples) if up and len(report.gpus) == N_NODES * GPUS_PER_NODE else None

    try:
        report, samples = await until_async(every_gpu_and_engine, SCRAPED, timeout=30, every=1)
        # the engine view's throttle spans (backfill.throttle_expr) pick the same GPUs: pod a's is throttled
        # (0x8), pod b's is not, node 7 as a whole is
        spans = [await client.query(throttle_expr("synthetic-node-07", pod)) for pod in (
            ("synthetic-llm", "synthetic-vllm-a"), ("synthetic-llm", "synthetic-vllm-b"), None)]
    finally:
        await client.aclose()
    assert [[v for _, v in answer] for answer in spans] == [[1.0], [0.0], [1.0]]
    a, b = samples[pod_a.instance], samples[pod_b.instance]
    # the pod's target labels ride through every figure to the sample
    assert dict(a.labels)["pod"] == "synthetic-vllm-a" and dict(a.labels)["namespace"] == "synthetic-llm"
    assert a.stats.gen_tps is not None and a.reading.running == pod_a.running
    node7 = [g for g in report.gpus if g.host == "synthetic-node-07"]
    assert [(g.index, g.pod, g.namespace) for g in node7] == [
        (0, "synthetic-vllm-a", "synthetic-llm"), (1, "synthetic-vllm-b", "synthetic-llm"), (2, None, None),
        (3, None, None)]
    # pod a's instance is its pod address: the host finds nothing, the pod finds its GPU
    assert a.host != "synthetic-node-07" and [(g.host, g.index) for g in gpus_of(a, report.gpus)] == [
        ("synthetic-node-07", 0)]
    # pod b shares node 7's network: the host would give all four GPUs, the pod gives its own
    assert b.host == "synthetic-node-07" and [g.index for g in gpus_of(b, report.gpus)] == [1]
    # engines without a pod: their node's GPUs, as before
    plain = samples[plain_engine.instance]
    assert [g.index for g in gpus_of(plain, report.gpus)] == [0, 1, 2, 3]
    node3 = samples[node3_engine.instance]
    assert {(g.host, g.throttled) for g in gpus_of(node3, report.gpus)} == {("synthetic-node-03", True)}
    # the fleet table's GPU columns use the same matching: pod a's row is throttled, pod b's is not
    from tui.live.store import Store
    from widgets.fleet_table import GPUS, THROTTLE, build_rows

    store = Store()
    for sample in (a, b):
        store.add(sample)
    rows = {r.name: r.values for r in build_rows(store.engines, report.gpus)}
    assert rows[a.name][THROTTLE] and not rows[b.name][THROTTLE], (rows[a.name], rows[b.name])
    assert rows[a.name][GPUS] == "1 own" and rows[b.name][GPUS] == "1 own"  # by pod: each its own GPU
    # the directly-read exporter labels the same pods
    direct = DcgmDirectSource([fleet.dcgm_url(7)])
    [report7] = await direct.read()
    await direct.aclose()
    assert [g.index for g in gpus_of(a, report7.gpus)] == [0]
    assert [g.index for g in gpus_of(b, report7.gpus)] == [1]


def openmetrics(series: list[tuple[str, dict[str, str], list[tuple[float, float]]]]) -> str:
    """OpenMetrics text of (name, labels, [(unix time, value), ...]) for promtool's block import."""
    lines = []
    for name, labels, points in series:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines += [f"{name}{{{inner}}} {v:g} {t:.3f}" for t, v in points]
    return "\n".join([*lines, "# EOF", ""])


async def test_back_fill_reaches_history_from_before_enginetop_started(fleet_prom):
    """KV full and a growing queue need 5 minutes of history, more than this module runs: a Prometheus of
    their own is given 10 minutes of past (promtool writes it into its TSDB before it starts), then scrapes
    the same synthetic engines on. `kv_full` was at 95% all along; its twin (the same exporter scraped as
    another instance) only for the last 4 minutes, not enough; `queue` grew all along."""
    fleet, _, _ = fleet_prom
    full = next(e for e in fleet.engines if e.kind == "kv_full")
    queue = next(e for e in fleet.engines if e.kind == "queue")
    assert full.dialect == queue.dialect == "vllm"
    twin = "synthetic-node-01:18001"
    now = time.time()
    steps = [now - 600 + 2 * k for k in range(299)]  # every 2 s, up to 2 s ago (the scrapes continue)
    age_now = time.monotonic() - fleet.started
    waiting_now = queue.waiting + 5 + age_now / 10  # what the queue engine will say when scraped
    history = []
    for engine, instance in ((full, full.instance), (full, twin), (queue, queue.instance)):
        labels = {"job": engine.job, "instance": instance, "model_name": engine.model, "engine": "0"}
        kv = [(t, 0.95 if instance != twin or t > now - 240 else 0.5) for t in steps]
        waiting = [(t, 5 + (waiting_now - 5) * (t - steps[0]) / (now - steps[0]) if engine is queue
                    else engine.waiting) for t in steps]
        history += [("vllm:num_requests_running", labels, [(t, engine.running) for t in steps]),
                    ("vllm:num_requests_waiting", labels, waiting), ("vllm:kv_cache_usage_perc", labels, kv)]
    scrapes = one_engine(fleet, full) + one_engine(fleet, queue)
    scrapes[0]["static_configs"].append({"targets": [f"127.0.0.1:{fleet.port}"], "labels": {
        "__metrics_path__": f"/engine/{full.index}/metrics", "instance": twin}})
    scrapes[1]["job_name"] = "vllm-queue"  # one job per scrape config: named apart, relabelled back
    scrapes[1]["relabel_configs"] = [{"target_label": "job", "replacement": "vllm"}]
    with running_prometheus({}, scrapes=scrapes, history=openmetrics(history)) as seeded:
        seeded.wait_for("up == 1", min_series=3)
        client = PrometheusClient(seeded.url)
        source = FleetSource(client, interval_s=2.0)
        try:
            samples = {s.name: s for s in await source.read()}
        finally:
            await client.aclose()
    assert source.error is None, source.error
    assert set(samples) == {full.instance, twin, queue.instance}
    assert all(s.health == "up" for s in samples.values())
    assert samples[full.instance].alerts == (KV_SATURATED,)  # 10 minutes above 90%
    assert samples[twin].alerts == ()  # 4 minutes and the few seconds since: not yet 5
    assert samples[queue.instance].alerts == (QUEUE_GROWING,)


# Last in the module: the rules need 80 s of the fleet's history, which the tests above mostly fill
def alerting(prom) -> dict[str, set[str]]:
    """Prometheus' pending and firing alerts: alert name -> instances."""
    out: dict[str, set[str]] = {}
    for a in httpx.get(f"{prom.url}/api/v1/alerts").json()["data"]["alerts"]:
        out.setdefault(a["labels"]["alertname"], set()).add(a["labels"]["instance"])
    return out


def built_to_alert(fleet) -> dict[str, set[str]]:
    """The engines made to set off each rule (tests/synthetic_fleet.make_fleet), by instance."""
    def kind(k: str) -> set[str]:
        return {e.instance for e in fleet.engines if e.kind == k}
    # a slowing engine alerts where one of its GPUs is throttled: node 3's (0x24) and pod a's GPU (0x8, by
    # pod); node 5's (idle + clocks setting + display bits only) and pod b's (host network on node 7) do not
    slowed = {e.instance for e in fleet.engines if e.kind == "slowing" and (e.node == 3 or e.pod_address)}
    return {"EngineStalled": kind("stalled"), "EngineKVCacheFull": kind("kv_full"),
            "EngineQueueGrowing": kind("queue"), "EngineThrottledGpuSlow": slowed}


# Rules need history. Measured (activeAt against the fleet's start): stalled and KV full at 6 s (the stalled
# engine's counter never moves, so its 1m rate is 0 from the second scrape), the queue at 28 s (deriv over
# two 15 s subquery points), the throttled slow engines at 76 s: a 1m rate only reaches an engine's real
# rate once the series is a minute old, so the 10-minute mean it is compared with starts low.
RULES_READY_S = 80.0


async def test_alert_rules_load_into_prometheus_and_fire_on_exactly_the_engines_built_for_them(fleet_prom):
    fleet, prom, rules = fleet_prom
    check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 4 rules found" in check.stdout
    groups = httpx.get(f"{prom.url}/api/v1/rules").json()["data"]["groups"]
    [group] = [g for g in groups if g["name"] == "enginetop-fleet"]
    assert all(r["health"] == "ok" for r in group["rules"]), [(r["name"], r.get("lastError")) for r in
                                                                group["rules"]]
    expected = built_to_alert(fleet)
    assert all(expected.values()) and len(expected["EngineThrottledGpuSlow"]) == 2
    deadline = max(time.monotonic() + 20, fleet.started + RULES_READY_S + 30)
    firing: dict[str, set[str]] = {}
    while time.monotonic() < deadline:
        firing = alerting(prom)
        if all(firing.get(name, set()) >= instances for name, instances in expected.items()):
            break
        time.sleep(1)
    # pending or firing (`for` counts down), on exactly those engines and nowhere else
    assert firing == expected, (firing, expected)


IN_APP = {STALLED: "EngineStalled", KV_SATURATED: "EngineKVCacheFull", QUEUE_GROWING: "EngineQueueGrowing",
          THROTTLED_DROP: "EngineThrottledGpuSlow"}
# Enough history for the in-app alerts, which judge FleetSource's own figures (a 10 s rate window at these
# 1 s scrapes): requests running and 0 tok/s for 60 s (the stalled engine: from its first scrapes, so 60 s
# after the fleet started, plus a refresh step); the slowing engines on throttled GPUs read under 70% of
# their mean from about 30 s. KV full and a growing queue need 5 minutes of history, more than this module
# runs (test_back_fill_reaches_history_from_before_enginetop_started gives them that).
BACKFILL_READY_S = 65.0


def by_alert(samples) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in samples:
        for a in s.alerts:
            out.setdefault(IN_APP[a], set()).add(s.instance)
    return out


async def test_in_app_alerts_are_back_filled_on_the_first_read_and_agree_with_the_rules(fleet_prom):
    fleet, prom, _ = fleet_prom
    await asyncio.sleep(max(0.0, fleet.started + BACKFILL_READY_S + 5 - time.monotonic()))
    client = PrometheusClient(prom.url)
    try:
        [report] = await DcgmPrometheusSource(client).read()
        fresh = FleetSource(client, interval_s=2.0, gpus=lambda: report)
        first = await fresh.read()
        first_calls = fresh.queries_per_read
        second = await fresh.read()
        counting = FleetSource(client, interval_s=2.0, gpus=lambda: report)
        counting.backfilled = True  # as before back-filling: the tracker starts from this read
        without = await counting.read()
    finally:
        await client.aclose()
    rules = alerting(prom)
    expected = built_to_alert(fleet)
    assert fresh.error is None, fresh.error
    in_app = by_alert(first)
    # the alerts that would already be showing had enginetop run all along show on its first refresh
    assert in_app.get("EngineStalled") == expected["EngineStalled"] == rules["EngineStalled"]
    assert in_app.get("EngineThrottledGpuSlow") == expected["EngineThrottledGpuSlow"] == \
        rules["EngineThrottledGpuSlow"]
    # the two 5-minute ones are not due yet in the app; Prometheus shows them pending, and never elsewhere
    assert in_app.get("EngineKVCacheFull", set()) <= rules["EngineKVCacheFull"]
    assert in_app.get("EngineQueueGrowing", set()) <= rules["EngineQueueGrowing"]
    assert by_alert(second) == in_app  # the history is kept, not asked again
    # one range query per figure, on the first read only (both first reads also fetched the targets)
    assert first_calls - counting.queries_per_read == len(ALERT_FIGURES)
    assert fresh.queries_per_read <= counting.queries_per_read
    assert by_alert(without) == {}  # what the first refresh showed before: nothing
# ---- the fleet UI: header clicks, the engine in the dashboard's layout, a fleet recording replayed -----

async def wait_until(pilot, condition, timeout: float, what: str) -> None:
    await until_async(condition, what, timeout, every=0.2, pause=pilot.pause)


def header_x(column: int) -> int:
    """Where a column's header label starts in the table, plus two characters."""
    return sum(WIDTHS[:column]) + column + 2


async def test_a_click_on_a_column_header_sorts_by_it_and_a_second_click_reverses(fleet_prom):
    _, prom, _ = fleet_prom
    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=prom.url, refresh_s=2.0),
                                 redraw_interval_s=0.5))
    async with app.run_test(size=(220, 60)) as pilot:
        view = app.screen.query_one(FleetView)
        table = view.table
        await wait_until(pilot, lambda: table.row_count == N_ENGINES, 20, "every engine in the table")
        engine = [c.label for c in COLUMNS].index("engine")
        await pilot.click("#fleet-table", offset=(header_x(engine), 0))
        await wait_until(pilot, lambda: "engine↑" in screen_text(app), 5, "sorted by engine")
        names = [r.name for r in table.rows]
        assert (table.sort_column, table.sort_reverse) == (engine, False)
        assert names == sorted(names, key=str.lower) and len(names) == N_ENGINES
        assert "engine↑" in screen_text(app)
        await pilot.click("#fleet-table", offset=(header_x(engine), 0))  # again: the other way round
        await wait_until(pilot, lambda: "engine↓" in screen_text(app), 5, "the order reversed")
        assert table.sort_reverse and [r.name for r in table.rows] == names[::-1]
        assert "engine↓" in screen_text(app)
        temp = [c.label for c in COLUMNS].index("GPU °C")
        await pilot.click("#fleet-table", offset=(header_x(temp), 0))  # a figure: highest first
        await wait_until(pilot, lambda: "GPU °↓" in screen_text(app), 5, "sorted by temperature")
        assert (table.sort_column, table.sort_reverse) == (temp, True)
        assert "GPU °↓" in screen_text(app)  # a label as wide as its cell gives way to the arrow
        values = [r.values[temp] for r in table.rows if r.values[temp] is not None]
        assert len(values) > N_ENGINES / 2 and values == sorted(values, reverse=True)
        assert len({*values}) == N_NODES  # one per node: not an order the rows had by chance
        await pilot.click("#fleet-table", offset=(header_x(engine), 3))  # a row, not the header
        await pilot.pause(0.2)
        assert table.sort_column == temp and table.selected == table.rows[table.top + 2].name
        clicked = table.selected
        await pilot.press("enter")  # the click focused the table: enter there opens the engine too
        assert isinstance(app.screen, EngineScreen) and app.screen.engine_name == clicked


async def test_an_engine_opens_in_the_dashboards_own_layout_and_f_probes_it(fleet_prom):
    fleet, prom, _ = fleet_prom
    picked = next(e for e in fleet.engines if e.node == 3 and e.dialect == "vllm" and not e.kind)
    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=prom.url, refresh_s=2.0), horizon_s=1800.0,
                                 redraw_interval_s=0.5))
    app_started = time.monotonic()
    async with app.run_test(size=(200, 60)) as pilot:
        view = app.screen.query_one(FleetView)
        await wait_until(pilot, lambda: view.table.row_count == N_ENGINES, 20, "every engine in the table")
        await pilot.press("f")  # in the table (no engine opened) there is nothing to probe
        await pilot.pause(0.2)
        assert view.query_one(Input).value == "" and not any(s.probes for s in app.store.engines.values())
        await pilot.press("slash", *picked.instance)
        await wait_until(pilot, lambda: view.table.selected == picked.instance, 5, "the engine at the cursor")
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, EngineScreen) and screen.engine_name == picked.instance
        await wait_until(pilot, lambda: not screen.backfill, 15, "the back-fill")
        await pilot.pause(0.6)
        # the main screen's widgets, laid out as there: the column and its probes, both plots, the node's GPUs
        assert screen.query_one(Dashboard).names == [picked.instance]
        assert screen.query_one("#engine-0", EnginePanel).engine_name == picked.instance
        assert screen.query_one("#probes-0", ProbePanel) and not screen.query("#host")
        assert screen.query_one("#gpu", GpuPanel).border_title == "GPUs of synthetic-node-03"
        data, now = screen.query_one("#plot-gen", TimePlot).shown
        xs, ys = data.lines[picked.instance]
        assert now + xs[0] < app_started - 5  # back-filled from query_range
        assert ys[-1] == rate_of(picked.gen_rate)
        assert data.throttle_spans  # node 3's GPUs are throttled (0x24)
        assert screen.query_one("#plot-ttft", TimePlot).shown[0].lines[picked.instance][0]
        text = screen_text(app)
        assert "f: probe now" in text and "GPUs of synthetic-node-03" in text
        assert "synthetic-node-03 [0] NVIDIA H200  THROTTLED: power cap" in text
        assert "synthetic-node-04" not in text  # only its node's GPUs

        # `f` probes it at the origin Prometheus scrapes; a synthetic exporter has no OpenAI API: it says so
        await pilot.press("f")
        state = app.store.engines[picked.instance]
        await wait_until(pilot, lambda: state.probes, 15, "a probe result")
        _, result = state.probes[-1]
        assert result.url == f"http://127.0.0.1:{fleet.port}/engine/{picked.index}"
        assert not result.ok and result.status == 501
        await pilot.pause(0.6)
        text = screen_text(app)
        assert "failed: HTTP 501" in text and "! HTTP 501: " in text and "Error code: 501" in text
        assert app.is_running
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert app.screen.query_one(FleetView) is view


async def test_a_recorded_fleet_replays_as_the_fleet_table_with_the_same_figures(fleet_prom, tmp_path):
    _, prom, _ = fleet_prom
    out = tmp_path / "fleet.enginetop.sqlite"
    # 15 s: on a loaded machine the first read of 210 engines (after the recorder's own start) took over 5
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tui", "record", "--prometheus", prom.url, "--refresh", "1", "--duration", "15",
        "-o", str(out), stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()
    rec = Recording(out)
    assert rec.meta["fleet"] == f"Prometheus {prom.url}" and fleet_source(rec) == f"Prometheus {prom.url}"
    last, last_rate = {}, {}
    for row in rec.rows(kinds=("engine",)):
        last[row.item.name] = row.item
        if row.item.stats.gen_tps is not None:  # a read while scrapes came late has no rate: not plotted
            last_rate[row.item.name] = row.item.stats.gen_tps
    assert len(last) == N_ENGINES

    app = ReplayApp(rec, AppConfig(horizon_s=300.0), start=rec.end)
    async with app.run_test(size=(220, 60)) as pilot:
        view = app.screen.query_one(FleetView)
        table = view.table
        await wait_until(pilot, lambda: table.row_count == N_ENGINES, 10, "the replayed table")
        assert app.fleet is None and not app.slots  # no Prometheus asked, no engine columns
        rows = {r.name: r for r in table.rows}
        assert rows.keys() == last.keys()
        gpus = app.store.gpu.gpus
        for expected in build_rows({n: app.store.engines[n] for n in last}, gpus):
            assert rows[expected.name].cells == expected.cells
        for name, sample in last.items():
            values = rows[name].values
            assert values[5] == sample.stats.gen_tps and values[7] == sample.stats.ttft_p50_s
            assert values[10] == (sample.reading.running if sample.reading else None)
        text = screen_text(app)
        assert f"replay of {out.name}, recorded from Prometheus {prom.url}" in text
        assert f"{N_ENGINES} engines" in text
        paused = app.replay.paused
        await pilot.press("slash", *"node-03 vllm")  # `/`, then typed keys go to the filter, a space included
        await pilot.pause(0.3)
        assert view.query_one(Input).value == "node-03 vllm" and app.replay.paused == paused
        assert {r.name for r in table.rows} == {n for n, s in last.items() if s.host == "synthetic-node-03"
                                                and s.job == "vllm"}
        # escape leaves the filter, escape again (in the table) clears it; there space plays / pauses
        await pilot.press("escape", "escape", "space")
        await pilot.pause(0.2)
        assert app.focused is table and app.replay.paused != paused and table.row_count == N_ENGINES

        await pilot.press("enter")  # the engine under the cursor, from the replayed history
        screen = app.screen
        assert isinstance(screen, EngineScreen) and screen.backfill == ""
        await pilot.pause(0.6)
        name = screen.engine_name
        data, now = screen.query_one("#plot-gen", TimePlot).shown
        assert now == app.replay.now == rec.end
        xs, ys = data.lines[name]
        assert len(xs) >= 3 and ys[-1] == last_rate[name]  # the newest rate recorded
        await pilot.press("f")  # a replay probes nothing
        await pilot.pause(0.2)
        assert not app.store.engines[name].probes and app.is_running
        await pilot.press("escape")

    # a fleet recording made before the `fleet` meta key: told by its engines' Prometheus labels
    old = tmp_path / "old.enginetop.sqlite"
    old.write_bytes(out.read_bytes())
    with sqlite3.connect(old) as db:
        db.execute("DELETE FROM meta WHERE key = 'fleet'")
    assert fleet_source(Recording(old)) == "Prometheus"


def accepted_connections(prom) -> tuple[float, float]:
    """(accepted, closed) connections of a real Prometheus' web listener, from its own /metrics."""
    found = {}
    for line in httpx.get(f"{prom.url}/metrics", timeout=10).text.splitlines():
        for what in ("accepted", "closed"):
            if line.startswith(f'net_conntrack_listener_conn_{what}_total{{listener_name="http"}} '):
                found[what] = float(line.rsplit(" ", 1)[1])
    assert found.keys() == {"accepted", "closed"}, "Prometheus no longer counts its listener's connections"
    return found["accepted"], found["closed"]


async def test_a_refresh_sends_its_queries_on_at_most_four_connections_kept_for_the_next(fleet_prom):
    """Prometheus' own count of the connections it accepted: the first refresh (~20 queries at once) opens
    at most 4, the next opens none (each count also holds the one connection that reads /metrics)."""
    _, prom, _ = fleet_prom
    client = PrometheusClient(prom.url)
    source = FleetSource(client)
    try:
        before, _ = accepted_connections(prom)
        first = await source.read()
        after_first, _ = accepted_connections(prom)
        second = await source.read()
        after_second, _ = accepted_connections(prom)
    finally:
        await client.aclose()
    assert source.error is None and len(first) == len(second) == N_ENGINES
    assert source.queries_per_read >= 15
    assert 1 <= after_first - before - 1 <= 4
    assert after_second - after_first - 1 == 0


async def test_a_prometheus_that_closes_idle_connections_is_asked_again_on_fresh_ones(fleet_prom):
    """Prometheus' --web.read-timeout is also how long it keeps an idle connection: 1 s here, shorter than
    the pause between two refreshes, so every kept connection is closed by Prometheus in between."""
    fleet, _, _ = fleet_prom
    engine = fleet.engines[10]
    with running_prometheus({}, scrapes=one_engine(fleet, engine), extra_args=["--web.read-timeout=1s"]) as p:
        p.wait_for("vllm:num_requests_running")
        client = PrometheusClient(p.url)
        source = FleetSource(client)
        try:
            [first] = await source.read()
            _, closed_before = accepted_connections(p)
            await asyncio.sleep(2.5)
            _, closed_after = accepted_connections(p)
            [second] = await source.read()
            third = await client.query("vllm:num_requests_running")
        finally:
            await client.aclose()
    assert closed_after > closed_before  # Prometheus did close the kept connections meanwhile
    assert source.error is None and not second.stale and second.health == "up"
    assert second.reading.running == first.reading.running == engine.running
    assert [v for _, v in third] == [engine.running]


async def test_url_credentials_are_sent_as_basic_auth_and_shown_nowhere(fleet_prom):
    _, prom, _ = fleet_prom
    proxy = PromProxy(prom.url, basic=("alice", "pa55-word"))
    host = proxy.url.removeprefix("http://")
    try:
        source, samples = await read(f"http://alice:pa55-word@{host}")
        assert source.error is None and len(samples) == N_ENGINES
        assert set(proxy.seen_authorization) == {"Basic " + base64.b64encode(b"alice:pa55-word").decode()}
        source, samples = await read(f"http://alice:wrong-word@{host}")
        assert samples == {} and source.error_kind == "auth" and "the token was refused" in source.error
        assert "wrong-word" not in source.error and "alice" not in source.error
        assert source.error.startswith(f"Prometheus at {proxy.url} answered 401")
    finally:
        proxy.stop()


class _ForwardProxy(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: absolute-form requests, every host sent to one upstream (the real
    Prometheus), as a corporate proxy would reach a Prometheus this machine cannot resolve."""

    server: ThreadingHTTPServer

    def _forward(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        parts = urlsplit(self.path)
        headers = {"Content-Type": self.headers["Content-Type"]} if self.headers["Content-Type"] else {}
        r = httpx.request(self.command, self.server.upstream + parts.path + (f"?{parts.query}" if parts.query
                          else ""), content=body, headers=headers, timeout=30, trust_env=False)
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("Content-Type", "text/plain"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    do_GET = do_POST = _forward

    def log_message(self, *args: object) -> None:
        pass


async def test_a_prometheus_behind_the_environment_proxy_is_asked_through_it(fleet_prom, monkeypatch):
    _, prom, _ = fleet_prom
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ForwardProxy)
    server.daemon_threads, server.seen, server.upstream = True, [], prom.url
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                "all_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    remote = "http://prometheus.invalid:9090"
    try:
        source, samples = await read(remote)
        assert source.error is None and len(samples) == N_ENGINES
        assert ("POST", f"{remote}/api/v1/query", None) in server.seen
        assert ("GET", f"{remote}/api/v1/targets?state=active", None) in server.seen
        with pytest.raises(InsecureSecret, match="in clear text through the proxy"):
            PrometheusClient(remote, token="s3cret-token")
        client = PrometheusClient(remote, timeout=2.0)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(PromError) as exc:
        await client.query("up")  # the proxy is gone
    await client.aclose()
    assert exc.value.kind == "down" and "prometheus.invalid:9090" in exc.value.message
