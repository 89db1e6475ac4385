"""Every place the energy figures go: the engine column's rows, the GPU and host panels, recordings (kept as
counters, replayed through the store, their report's Energy section, the export's counters), the exporter's
series, the fleet table from dcgm-exporter's energy counter, A/B and sweep-param arms, bench and capacity."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from test_energy import engine, host, plain

from tui.exporter.metrics import ProbeMetrics
from tui.live.store import Store
from tui.model.events import ProbeEvent
from tui.model.samples import (
    EnergyWindow,
    EngineStats,
    GpuProcess,
    GpuReport,
    GpuSample,
    HostSample,
    ProcessTreeMemory,
)
from tui.probe.results import ProbeResult
from widgets.energy import energy_rows, window_text
from widgets.fmt import Rows

GiB = 1 << 30


def gpu_at(t: float, joules: float, watts: float = 300.0, engine_name: str = "vllm",
           host_name: str | None = None, index: int = 0) -> GpuSample:
    held = (GpuProcess(pid=42, used_bytes=GiB, engine=engine_name),) if not host_name else ()
    return GpuSample(index=index, t=t, name="NVIDIA H200", uuid=f"GPU-{index}", power_w=watts,
                     energy_j=joules, vendor="NVIDIA", driver="dcgm" if host_name else "nvml", host=host_name,
                     processes=held)


# ---- drawing ------------------------------------------------------------------------------------------


def test_the_column_rows_say_joules_per_token_whose_and_why_not() -> None:
    grid = Rows()
    energy_rows(grid, EngineStats(gen_tps=150.0, energy_w=300.0, joules_per_token=2.0, tokens_per_joule=0.5,
                                  energy_source="counter", energy_scope="gpu 0",
                                  energy_shared_with=("llama",)))
    assert grid.text().plain.splitlines() == ["energy 2.00 J/tok · 0.50 tok/J at 300.0 W",
                                              "       gpu 0, shared with llama, counter"]
    idle = Rows()
    energy_rows(idle, EngineStats(gen_tps=0.0, energy_w=31.0, energy_source="counter", energy_scope="engine"))
    assert idle.text().plain.startswith("energy – J/tok (no tokens generated) at 31.0 W")
    note = Rows()
    energy_rows(note, EngineStats(energy_note="CPU energy (RAPL) is readable by root only here: ..."))
    assert note.text().plain == "energy CPU energy (RAPL) is readable by root only here: ..."
    nothing = Rows()
    energy_rows(nothing, EngineStats())  # a remote engine: nothing of this machine is its energy
    assert nothing.text().plain == ""


def test_a_co_holders_unknown_rate_is_said_not_no_tokens() -> None:
    """vllm generates 100 tok/s on a GPU it shares with llama, whose rate is not known yet (one reading):
    no J/token, and the column says whose rate is missing, not "no tokens generated"."""
    store = Store()
    for i in range(6):
        t = float(i)
        store.add(GpuReport(t=t, gpus=(GpuSample(
            index=0, t=t, power_w=300.0, energy_j=300.0 * t, vendor="NVIDIA", driver="nvml",
            processes=(GpuProcess(1, GiB, engine="vllm"), GpuProcess(2, GiB, engine="llama"))),)))
        store.add(engine("vllm", t, 100.0 * i))
    store.add(engine("llama", 5.0, 0.0))
    stats = store.engines["vllm"].stats
    assert stats.energy_w == pytest.approx(300.0) and stats.joules_per_token is None
    assert stats.energy_note == "generation rate of llama not known yet"
    grid = Rows()
    energy_rows(grid, stats)
    assert grid.text().plain.splitlines()[0] == \
        "energy – J/tok (generation rate of llama not known yet) at 300.0 W"


def test_gpu_and_host_panels_draw_energy_and_idle_power() -> None:
    from widgets.gpu_panel import render_gpus
    from widgets.host_panel import render_host

    window = EnergyWindow(seconds=10.0, joules=3000.0, watts=300.0, source="counter", idle_w=81.5)
    assert window_text(window) == "300.0 W avg (3,000 J in 10 s, counter)  idle 81.5 W"
    report = GpuReport(t=1.0, gpus=(GpuSample(index=0, t=1.0, name="NVIDIA H200", power_w=300.0,
                                              power_limit_w=700.0, energy=window, vendor="NVIDIA"),))
    assert "energy 300.0 W avg (3,000 J in 10 s, counter)  idle 81.5 W" in plain(render_gpus(report))
    cpu = HostSample(t=1.0, cpu_pct=50.0, cpu_count=2, cpu_energy=EnergyWindow(10.0, 300.0, 30.0, "counter"))
    assert "CPU energy 30.0 W avg (300.0 J in 10 s, counter)" in render_host(cpu).plain
    root_only = HostSample(t=1.0,
                           cpu_energy_error="CPU energy (RAPL) is readable by root only here: `sudo …`")
    assert "CPU energy CPU energy (RAPL) is readable by root only here" in render_host(root_only).plain


# ---- recordings ---------------------------------------------------------------------------------------


def test_recordings_keep_the_counters_and_their_report_and_export_show_energy(tmp_path: Path) -> None:
    """A recording keeps each GPU's energy counter and the CPU package's (never the windows derived from
    them); its report feeds them through the store as the dashboard did: J/token per engine, each device's
    energy over the recording, each probe's joules; the export writes the counters as counters."""
    from tui.record.export import write_openmetrics
    from tui.record.reader import Recording
    from tui.record.report import render_recording
    from tui.record.writer import Recorder

    path = tmp_path / "e.enginetop.sqlite"
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    store = Store()
    store.listeners.append(rec)
    for i in range(40):
        t = 1000.0 + i
        store.add(GpuReport(t=t, gpus=(gpu_at(t, 5000.0 + 300.0 * i),)))
        if i % 2 == 0:
            store.add(HostSample(t=t, cpu_energy_j=100.0 + 30.0 * i, engines=(
                ProcessTreeMemory(engine="vllm", pid=42, rss_bytes=GiB, processes=1, pids=(42,)),)))
        store.add(engine("vllm", t, 150.0 * i))
        if i == 20:
            store.add_probe("vllm", ProbeResult(
                engine="vllm", url="http://127.0.0.1:8000", workload="short", index=0, wall_start=t,
                sent_at=t - 4.0, first_token_at=t - 3.9, last_token_at=t, ended_at=t, status=200,
                completion_tokens=100), t=t)
    rec.close()
    assert store.engines["vllm"].stats.joules_per_token == pytest.approx(2.0)
    recording = Recording(path)
    gpus = [r.item for r in recording.rows() if isinstance(r.item, GpuReport)]
    assert gpus[-1].gpus[0].energy_j == pytest.approx(5000.0 + 300.0 * 39) and gpus[-1].gpus[0].energy is None
    probes = [r.item for r in recording.rows() if isinstance(r.item, ProbeEvent)]
    assert probes[0].result.energy_j is None  # derived, not recorded: a replay derives it again
    html = render_recording(recording)
    assert "Energy" in html and "J/token (median while generating)" in html
    assert "<td class=\"n\">2.000</td>" in html  # vllm: 300 W / 150 tok/s
    assert "1200.0 J (12 J/token)" in html  # the probe: 4 s at 300 W over its 100 tokens
    assert "11,700.0 J" in html and "300.0 W" in html  # the GPU's counter over the recording
    out = io.StringIO()
    write_openmetrics(recording, out)
    text = out.getvalue()
    assert "# TYPE enginetop_gpu_energy_joules counter" in text
    assert 'enginetop_gpu_energy_joules_total{job="enginetop"' in text
    assert "# TYPE enginetop_host_cpu_energy_joules counter" in text


# ---- the exporter -------------------------------------------------------------------------------------


def test_the_exporter_serves_each_devices_counter_and_each_engines_joules_per_token() -> None:
    metrics = ProbeMetrics(process=False)
    metrics.devices(GpuReport(t=1.0, gpus=(gpu_at(1.0, 1234.5),)), HostSample(t=1.0, cpu_energy_j=88.0))
    metrics.engine("vllm", (), EngineStats(joules_per_token=2.0, tokens_per_joule=0.5, energy_scope="engine"))
    body = metrics.exposition().decode()
    assert "# TYPE enginetop_energy_joules_total counter" in body
    assert 'enginetop_energy_joules_total{device="gpu0",vendor="NVIDIA"} 1234.5' in body
    assert 'enginetop_energy_joules_total{device="cpu-package",vendor=""} 88.0' in body
    assert 'enginetop_joules_per_token{engine="vllm",scope="engine"} 2.0' in body
    assert 'enginetop_tokens_per_joule{engine="vllm",scope="engine"} 0.5' in body
    metrics.gone("vllm")  # down: its figure is no longer served
    assert "enginetop_joules_per_token{" not in metrics.exposition().decode()
    # read between its counter's readings (amd-smi every few seconds): the last value stands; lost: gone
    between = dataclasses.replace(gpu_at(2.0, 1234.5), energy_j=None)
    metrics.devices(GpuReport(t=2.0, gpus=(between,)), None)
    assert 'enginetop_energy_joules_total{device="gpu0",vendor="NVIDIA"} 1234.5' in \
        metrics.exposition().decode()
    metrics.devices(GpuReport(t=3.0, gpus=(dataclasses.replace(between, error="GPU is lost"),)), None)
    assert 'device="gpu0"' not in metrics.exposition().decode()


def test_the_exporter_watch_reads_this_machines_energy(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """watch_engines reads the host (RAPL under ENGINETOP_SYSFS_ROOT) and GPUs into its store each round."""
    import asyncio

    from fake_pynvml import FakeNvml
    from sysfs_tree import rapl_package

    from tui.exporter.watch import watch_engines
    from tui.sources.gpu import GpuSampler
    from tui.sources.host import HostSampler

    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    rapl_package(tmp_path, 0, energy_uj=42_000_000)
    metrics = ProbeMetrics(process=False)

    async def run() -> None:
        task = asyncio.create_task(watch_engines([], metrics, 0.05, gpu=GpuSampler(FakeNvml()),
                                                 host=HostSampler()))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    body = metrics.exposition().decode()
    assert 'enginetop_energy_joules_total{device="cpu-package",vendor=""} 42.0' in body
    assert 'enginetop_energy_joules_total{device="gpu0",vendor="NVIDIA"} 123456.789' in body


# ---- the fleet ----------------------------------------------------------------------------------------


def test_dcgm_energy_counter_and_the_fleet_tables_joules_per_token() -> None:
    """dcgm-exporter's DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) becomes the GPU's energy counter; the fleet
    table's J/tok is the engine's GPUs' energy over its tokens, or a node's over every engine's there, the
    tokens counted over the energy's own window (a minute: dcgm's counter moves every 30 s), never a rate
    over another window: Prometheus's 10 s gen tok/s caught a burst (400 and 200 tok/s) while over the
    minute the engines made 100 and 200 tok/s: 600 W / 300 tok/s = 2 J/tok, not 600 / 600."""
    from tui.fleet.dcgm import build_report, parse_exposition
    from tui.model.samples import EngineReading, EngineSample
    from widgets.fleet_table import COLUMNS, build_rows

    text = ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",'
            'Hostname="node-7"} 9876543\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",modelName="NVIDIA H200",Hostname="node-7"} 612.5\n')
    [g] = build_report(parse_exposition(text)).gpus
    assert g.energy_j == pytest.approx(9876.543)
    assert (g.vendor, g.driver, g.host) == ("NVIDIA", "dcgm", "node-7")
    store = Store()
    for i in range(4):  # dcgm's counter, read every 30 s: 600 W between readings
        t = 30.0 * i
        store.add(GpuReport(t=t, gpus=(GpuSample(index=0, t=t, host="node-7", uuid="GPU-a", power_w=600.0,
                                                 energy_j=9876.5 + 600.0 * t),)))
    window = store.gpu.gpus[0].energy
    assert window.source == "counter" and window.watts == pytest.approx(600.0)
    assert window.seconds == pytest.approx(60.0)
    for port, (name, burst, rate) in enumerate((("a", 400.0, 100.0), ("b", 200.0, 200.0))):
        for i in range(10):  # the fleet's engine samples every 10 s: Prometheus's rates, and the counter
            t = 10.0 * i
            store.add(EngineSample(name=name, url=f"http://node-7:800{port}", t=t, wall=t, health="up",
                                   host="node-7", instance=f"node-7:800{port}",
                                   stats=EngineStats(gen_tps=burst),
                                   reading=EngineReading(dialect="vllm", generation_tokens_total=rate * t)))
    rows = {r.name: r for r in build_rows(store.engines, store.gpu.gpus)}
    jpt = [c.label for c in COLUMNS].index("J/tok")
    assert rows["a"].values[jpt] == pytest.approx(600.0 / 300.0)  # the node's GPU over both engines' tokens
    assert rows["a"].cells[jpt].style == "dim" and rows["b"].values[jpt] == pytest.approx(2.0)


# ---- A/B, sweep-param, bench, capacity ----------------------------------------------------------------


def test_ab_arms_carry_joules_per_token_beside_tok_s_in_the_analysis_and_report() -> None:
    from tui.compare.analysis import analyze_arm
    from tui.compare.report_figures import _joules_cell
    from tui.compare.sweep_param import sweep_table

    blocks = [{"arm": "a", "instance": i, "block": b, "decode_tps": 30.0 + b, "ttft_s": 0.1,
               "prefill_tps": 1.0, "server_decode_tps": None, "requests": [], "gpu": {},
               "joules_per_token": 1.0 + 0.1 * b, "energy_scope": "cpu package", "energy_source": "counter"}
              for i in range(2) for b in range(3)]
    result = {"config": {"cv_threshold_pct": 5.0, "workload": "short"}, "blocks": blocks, "instances": [],
              "arms": [{"name": "a", "param": {"value": "2"}}]}
    arm = analyze_arm(result, result["arms"][0])
    assert arm["joules_per_token"]["median"] == pytest.approx(1.1) and arm["energy_scope"] == "cpu package"
    cell = _joules_cell(arm["joules_per_token"], arm["energy_scope"], None)
    assert cell.startswith("1.1 ") and "(cpu package)" in cell
    result["analysis"] = {"arms": {"a": arm}}
    [row] = sweep_table(result)
    assert row["joules_per_token"] == pytest.approx(1.1) and row["energy_scope"] == "cpu package"


def test_bench_and_capacity_results_carry_joules_per_token() -> None:
    from tui.workload.bench import EngineRun, summarize, table
    from tui.workload.capacity import CapacityResult, Level, curve_table

    run = EngineRun("llama", "http://127.0.0.1:8080", duration_s=10.0,
                    energy={"energy_j": 300.0, "joules_per_token": 1.5, "tokens_per_joule": 0.667,
                            "energy_source": "counter", "energy_scope": "cpu package", "energy_note": None})
    summary = summarize(run)
    assert summary.joules_per_token == 1.5 and summary.energy_scope == "cpu package"
    text = table([summary])
    assert "J / output token" in text and "1.5" in text
    assert "llama: energy 300.0 J of cpu package (counter)" in text
    level = Level(rate=2.0, planned=10, sent=10, ok=10, good=10, duration_s=5.0, achieved_rps=2.0,
                  attainment=1.0, ttft_p50_s=0.1, ttft_p90_s=0.2, goodput_rps=2.0, passed=True,
                  joules_per_token=0.8, energy_scope="cpu package")
    result = CapacityResult("llama", "u", "ttft:100", 0.9, "poisson", capacity_rps=2.0, levels=[level])
    curve = curve_table([result])
    assert "J/token" in curve and "     0.8  pass" in curve
    assert result.json()["levels"][0]["joules_per_token"] == 0.8


def test_the_host_panel_and_store_without_rapl_say_nothing_wrong() -> None:
    """No RAPL (a VM): the CPU engine's column says why there is no figure; the store keeps no window."""
    store = Store()
    store.add(host(1.0, None, ("llama",), error="no CPU package energy: no RAPL package zone under /x"))
    store.add(engine("llama", 1.0, 0.0))
    store.add(engine("llama", 2.0, 20.0))
    assert store.host.cpu_energy is None
    assert store.engines["llama"].stats.energy_note.startswith("no CPU package energy")
