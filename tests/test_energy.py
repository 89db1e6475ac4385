"""Energy: NVML's energy counter (the fake, at pynvml's boundary), AMD and Intel GPUs and RAPL from sysfs
trees in the kernel's layout with counters that advance at known rates, the store's windows, joules per token
per engine and whose they are, idle power, a probe's energy, a run's."""

from __future__ import annotations

import dataclasses
import errno
import io
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml, h200, rtx4090
from sysfs_tree import amd_card, drm_fd, intel_i915_card, intel_xe_card, rapl_package

from tui.live.store import Store
from tui.model.samples import EngineReading, EngineSample, GpuProcess, GpuReport, GpuSample, HostSample
from tui.probe.results import ProbeResult
from tui.sources.energy import MIXED, POWER_TIME, Point, Track, over, run_energy, span_of_reports
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.sources.rapl import RaplReader, RaplSpan, root_only_line
from tui.sources.sysfs_gpu import SysfsGpus, amd_throttle_words, parse_gpu_metrics

GiB = 1 << 30


def plain(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reading(tokens: float, running: float = 1.0) -> EngineReading:
    return EngineReading(dialect="vllm", generation_tokens_total=tokens, running=running, waiting=0.0)


def engine(name: str, t: float, tokens: float, running: float = 1.0) -> EngineSample:
    return EngineSample(name=name, url=f"http://127.0.0.1:80{len(name)}", t=t, wall=t, health="up",
                        reading=reading(tokens, running))


def host(t: float, cpu_j: float | None = None, engines: tuple[str, ...] = (), error: str | None = None
         ) -> HostSample:
    from tui.model.samples import ProcessTreeMemory

    trees = tuple(ProcessTreeMemory(engine=e, pid=100 + i, rss_bytes=1 << 30, processes=1, pids=(100 + i,))
                  for i, e in enumerate(engines))
    return HostSample(t=t, engines=trees, cpu_energy_j=cpu_j, cpu_energy_error=error)


# ---- NVML's counter through the fake ------------------------------------------------------------------


def test_nvml_energy_counter_gives_the_gpus_joules_and_one_engines_joules_per_token() -> None:
    """An H200 at 300 W held by vLLM alone (NVML's per-process VRAM says so) generating 150 tok/s: 300 J a
    second from the counter's change (mJ -> J), so 2 J per token, 0.5 tokens per joule, scope "engine"."""
    clock = Clock()
    nvml = FakeNvml([h200(power_mw=300_000, compute_procs=[(4242, 60 * GiB)])])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    store = Store(rate_window_s=10.0)
    for i in range(13):
        store.add(sampler.sample({"vllm": {4242}}))
        store.add(engine("vllm", clock.now, 150.0 * i))
        clock.now += 1.0
        nvml.advance(1.0)
    g = store.gpu.gpus[0]
    assert g.vendor == "NVIDIA" and g.energy_j == pytest.approx((123_456_789 + 12 * 300_000) / 1000)
    assert g.energy.source == "counter" and g.energy.seconds == pytest.approx(10.0)
    assert g.energy.joules == pytest.approx(3000.0) and g.energy.watts == pytest.approx(300.0)
    stats = store.engines["vllm"].stats
    assert stats.gen_tps == pytest.approx(150.0)
    assert stats.energy_scope == "engine" and stats.energy_source == "counter"
    assert stats.energy_shared_with == ()
    assert stats.joules_per_token == pytest.approx(2.0) and stats.tokens_per_joule == pytest.approx(0.5)
    assert stats.energy_w == pytest.approx(300.0)


def test_without_the_counter_power_times_time_stands_in_and_says_so() -> None:
    """NotSupported on nvmlDeviceGetTotalEnergyConsumption (pre-Volta): power x time, labelled; a counter
    that does not move (a frozen dcgm value) likewise, with the reason."""
    clock = Clock()
    nvml = FakeNvml([rtx4090(power_mw=200_000, not_supported={"nvmlDeviceGetTotalEnergyConsumption"})])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    store = Store()
    for _ in range(5):
        store.add(sampler.sample())
        clock.now += 1.0
    g = store.gpu.gpus[0]
    assert g.energy_j is None
    assert g.energy.source == POWER_TIME and g.energy.watts == pytest.approx(200.0)
    assert g.energy.note == "no energy counter: power × time"
    frozen = over([Point(0.0, 50.0, 100.0), Point(5.0, 50.0, 120.0)])
    assert frozen == (pytest.approx(550.0), 5.0, POWER_TIME,
                      "the energy counter did not move in 5 s: power × time")
    back = over([Point(0.0, 50.0, 100.0), Point(1.0, 10.0, 100.0)])
    assert back is not None and back[2] == POWER_TIME and "went back" in (back[3] or "")


def test_two_engines_on_one_gpu_share_its_joules_and_say_so() -> None:
    """llama and vllm both hold VRAM on GPU 0 (400 W): the figure is the GPU's over both engines' tokens
    (100 + 100 tok/s: 2 J/token), scope "gpu 0", each naming the other; a process no engine owns holding a
    GPU makes the same GPU shared with "a process enginetop does not watch"."""
    clock = Clock()
    nvml = FakeNvml([h200(power_mw=400_000, compute_procs=[(1, 10 * GiB), (2, 20 * GiB)]),
                     rtx4090(power_mw=100_000, compute_procs=[(3, GiB), (9999, GiB)])])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    store = Store()
    pids = {"llama": {1}, "vllm": {2}, "solo": {3}}
    for i in range(12):
        store.add(sampler.sample(pids))
        for name in ("llama", "vllm", "solo"):
            store.add(engine(name, clock.now, 100.0 * i))
        clock.now += 1.0
        nvml.advance(1.0)
    llama, vllm, solo = (store.engines[n].stats for n in ("llama", "vllm", "solo"))
    assert llama.energy_scope == vllm.energy_scope == "gpu 0"
    assert llama.energy_shared_with == ("vllm",) and vllm.energy_shared_with == ("llama",)
    assert llama.joules_per_token == pytest.approx(2.0) and vllm.joules_per_token == pytest.approx(2.0)
    assert solo.energy_scope == "gpu 1" and solo.energy_shared_with == ("a process enginetop does not watch",)
    assert solo.joules_per_token == pytest.approx(1.0)


def test_idle_power_is_the_draw_while_its_engines_serve_nothing() -> None:
    """Busy at 350 W, then nothing running and no tokens: the idle power is the 80 W it drew meanwhile."""
    clock = Clock()
    gpu = h200(power_mw=350_000, compute_procs=[(7, GiB)])
    nvml = FakeNvml([gpu])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    store = Store(rate_window_s=5.0)
    tokens = 0.0
    for i in range(30):
        busy = i < 12
        gpu.power_mw = 350_000 if busy else 80_000
        tokens += 50.0 if busy else 0.0
        store.add(engine("e", clock.now, tokens, running=1.0 if busy else 0.0))
        store.add(sampler.sample({"e": {7}}))
        clock.now += 1.0
        nvml.advance(1.0)
    window = store.gpu.gpus[0].energy
    assert window.idle_w == pytest.approx(80.0)
    stats = store.engines["e"].stats
    assert stats.joules_per_token is None and stats.energy_w == pytest.approx(80.0)  # idle: no J/token


# ---- RAPL ---------------------------------------------------------------------------------------------


def test_rapl_packages_summed_subzones_and_mmio_duplicates_left_out(tmp_path: Path) -> None:
    p0 = rapl_package(tmp_path, 0, energy_uj=1_000_000)
    p1 = rapl_package(tmp_path, 1, energy_uj=2_000_000)
    rapl_package(tmp_path, 0, energy_uj=77, control="intel-rapl-mmio")  # the same package-0 again
    reader = RaplReader(tmp_path)
    first = reader.read()
    assert first.error is None and first.joules == pytest.approx(3.0)
    assert first.domains == ("intel-rapl:0 package-0", "intel-rapl:1 package-1")
    p0.add(30_000_000)
    p1.add(5_000_000)
    assert reader.read().joules == pytest.approx(38.0)


def test_rapl_wrap_at_max_energy_range_is_undone(tmp_path: Path) -> None:
    """energy_uj wraps to 0 after max_energy_range_uj: 400 µJ before the wrap, 600 µJ after it are 1000 µJ."""
    zone = rapl_package(tmp_path, 0, energy_uj=999_600, max_uj=1_000_000)
    reader = RaplReader(tmp_path)
    start = reader.read().joules
    zone.add(1_001)  # past the wrap: 999,600 + 1,001 = 1,000,601 -> 600 (0 .. 1,000,000, then 0)
    assert zone.value == 600
    assert reader.read().joules - start == pytest.approx(1_001 / 1e6, abs=2e-6)
    for _ in range(5):  # around the range several times, read at each step (each under one wrap)
        zone.add(900_000)
        reader.read()
    assert reader.read().joules - start == pytest.approx((1_001 + 4_500_000) / 1e6, abs=1e-5)


def test_rapl_root_only_says_the_one_line_that_makes_it_readable(tmp_path: Path) -> None:
    """Since Linux 5.10 energy_uj is 0400 root. Tests run as root here, where chmod cannot take a read away,
    so the reader's file read is replaced by one that raises what open() raises for a non-root user."""
    rapl_package(tmp_path, 0)

    def denied(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return path.read_text()

    got = RaplReader(tmp_path, read_file=denied).read()
    path = tmp_path / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
    assert got.joules is None and got.error == root_only_line([path])
    assert got.error == (f"CPU energy (RAPL) is readable by root only here: `sudo chmod o+r {path}` makes it "
                         "readable (until the next boot)")
    # the same line reaches the engine's column for an engine on this machine's CPU
    store = Store()
    store.add(HostSampler(RaplReader(tmp_path, read_file=denied)).sample())
    store.add(host(1.0, engines=("llama",), error=got.error))
    store.add(engine("llama", 1.0, 0.0))
    store.add(engine("llama", 2.0, 10.0))
    assert store.engines["llama"].stats.energy_note == got.error


def test_rapl_other_read_errors_and_no_rapl_in_words(tmp_path: Path) -> None:
    """A real OSError (energy_uj a directory: EISDIR) is named; no zone at all says why."""
    zone = tmp_path / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").mkdir()
    got = RaplReader(tmp_path).read()
    assert got.joules is None and got.error.startswith("CPU energy (RAPL) unreadable: ")
    assert "energy_uj: Is a directory" in got.error
    empty = RaplReader(tmp_path / "nothing").read()
    assert empty.joules is None
    assert empty.error.startswith("no CPU package energy: no RAPL package zone under")


def test_cpu_engine_joules_per_token_from_rapl_through_the_host_sampler(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENGINETOP_SYSFS_ROOT moves the whole of sysfs: the host sampler reads RAPL there. A CPU engine at 20
    tok/s beside a package at 30 W: 1.5 J/token, scope "cpu package"."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    zone = rapl_package(tmp_path, 0, energy_uj=5_000_000)
    sampler = HostSampler()
    store = Store(rate_window_s=10.0)
    t0 = 0.0
    for i in range(8):
        sample = sampler.sample()
        sample = dataclasses.replace(host(t0 + 2 * i, sample.cpu_energy_j, ("llama",)),
                                     cpu_energy_domains=sample.cpu_energy_domains)
        store.add(sample)
        store.add(engine("llama", t0 + 2 * i, 40.0 * i))
        zone.add(60_000_000)  # 30 W for the 2 s until the next sample
    assert store.host.cpu_energy.source == "counter" and store.host.cpu_energy.watts == pytest.approx(30.0)
    stats = store.engines["llama"].stats
    assert stats.energy_scope == "cpu package" and stats.joules_per_token == pytest.approx(1.5)
    assert RaplSpan(RaplReader(tmp_path)).result()["cpu_energy_error"] is None


# ---- AMD and Intel from sysfs -------------------------------------------------------------------------


def test_amdgpu_card_every_figure_and_who_holds_it(tmp_path: Path) -> None:
    """An amdgpu card: busy %, memory busy, VRAM, hwmon power (power1_average, µW), cap, edge temperature by
    its label, sclk / mclk in Hz, fan; gpu_metrics v1.3's throttle status in words; vLLM's process holding
    it found through its DRM fdinfo (drm-pdev, drm-memory-vram; two fds of one client count once)."""
    amd_card(tmp_path, 0, throttle=(1 << 0) | (1 << 36))
    proc = tmp_path / "proc"
    drm_fd(proc, 4242, 12, "0000:03:00.0", client=7, vram_kib=20 * (1 << 20))
    drm_fd(proc, 4242, 13, "0000:03:00.0", client=7, vram_kib=20 * (1 << 20))
    clock = Clock()
    reader = SysfsGpus(tmp_path, proc_root=proc, clock=clock, amd_smi=None)
    [g] = reader.sample({"vllm": {4242}}, first_index=0)
    assert (g.vendor, g.driver, g.name, g.uuid) == ("AMD", "amdgpu", "AMD Radeon RX 7900 XTX", "0000:03:00.0")
    assert (g.util_gpu_pct, g.util_mem_pct) == (87.0, 41.0)
    assert (g.vram_used_bytes, g.vram_total_bytes) == (20 * GiB, 24 * GiB)
    assert g.power_w == pytest.approx(250.0) and g.power_limit_w == pytest.approx(300.0)
    assert g.temp_c == pytest.approx(61.0) and g.fan_rpm == 1450.0
    assert g.sm_clock_mhz == pytest.approx(2400.0) and g.mem_clock_mhz == pytest.approx(1250.0)
    assert g.throttled and g.throttle_reasons == ("power limit (PPT0)", "thermal (hotspot)")
    assert g.processes == (GpuProcess(pid=4242, used_bytes=20 * GiB, engine="vllm"),)
    assert g.energy_j is None  # no energy1_input on this board, no amd-smi: power x time in the store
    assert parse_gpu_metrics(b"\x78\x00\x01\x04" + bytes(116)) is None  # another revision: not read
    assert amd_throttle_words(1 << 60) == ("other throttle bits 0x1000000000000000",)


def test_amd_energy_from_hwmon_when_present_else_power_times_time(tmp_path: Path) -> None:
    counters = amd_card(tmp_path, 0, energy_uj=10_000_000, power_file="power1_input", power_uw=220_000_000)
    clock = Clock()
    store = Store()
    sampler = GpuSampler(FakeNvml([]), clock=clock, sysfs=SysfsGpus(tmp_path, clock=clock, amd_smi=None))
    for _ in range(6):
        store.add(sampler.sample())
        clock.now += 1.0
        counters["energy"].add(220_000_000)  # 220 W
    g = store.gpu.gpus[0]
    assert g.index == 0 and g.power_w == pytest.approx(220.0)
    assert g.energy.source == "counter" and g.energy.watts == pytest.approx(220.0)


def test_intel_xe_utilisation_power_energy_throttle_and_vram(tmp_path: Path) -> None:
    """xe: utilisation from gtidle's idle residency (250 ms idle a second: 75 % busy), power from
    energy1_input's change (µJ: 95 W), freq0/act_freq, throttle reasons in words, the tile's VRAM size."""
    c = intel_xe_card(tmp_path, 1, throttle={"status": 1, "reason_pl1": 1, "reason_thermal": 1})
    clock = Clock()
    reader = SysfsGpus(tmp_path, clock=clock, amd_smi=None)
    [first] = reader.sample({}, first_index=3)
    assert first.util_gpu_pct is None and first.power_w is None  # a rate needs two readings
    for _ in range(3):
        clock.now += 1.0
        c["idle"].add(250)
        c["energy"].add(95_000_000)
        [g] = reader.sample({}, first_index=3)
    assert (g.index, g.vendor, g.driver, g.uuid) == (3, "Intel", "xe", "0000:05:00.0")
    assert g.util_gpu_pct == pytest.approx(75.0) and g.power_w == pytest.approx(95.0)
    assert g.energy_j == pytest.approx(5.0 + 3 * 95.0) and g.power_limit_w == pytest.approx(190.0)
    assert g.sm_clock_mhz == 2850.0 and g.temp_c == pytest.approx(55.0)
    assert g.vram_total_bytes == 12 * GiB and g.vram_used_bytes is None
    assert g.throttled and g.throttle_reasons == ("power limit PL1", "thermal")


def test_intel_i915_rc6_throttle_and_lmem(tmp_path: Path) -> None:
    c = intel_i915_card(tmp_path, 2, throttle={"throttle_reason_status": 1, "throttle_reason_vr_tdc": 1})
    clock = Clock()
    reader = SysfsGpus(tmp_path, clock=clock, amd_smi=None)
    reader.sample({})
    clock.now += 2.0
    c["idle"].add(1500)  # idle 1.5 s of 2
    c["energy"].add(2 * 60_000_000)
    [g] = reader.sample({})
    assert g.driver == "i915" and g.util_gpu_pct == pytest.approx(25.0) and g.power_w == pytest.approx(60.0)
    assert (g.vram_used_bytes, g.vram_total_bytes) == (6 * GiB, 16 * GiB)
    assert g.throttle_reasons == ("VR current (TDC)",) and g.sm_clock_mhz == 2100.0


def test_a_mixed_host_nvidia_amd_and_intel_in_one_report(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's GPUs first, then the sysfs cards in card order, each with its vendor; with NVML absent the AMD
    and Intel GPUs still make the panel (no "no NVIDIA driver found")."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    amd_card(tmp_path, 0)
    intel_xe_card(tmp_path, 1)
    report = GpuSampler(FakeNvml([h200()])).sample()
    assert [(g.index, g.vendor, g.driver) for g in report.gpus] == [
        (0, "NVIDIA", "nvml"), (1, "AMD", "amdgpu"), (2, "Intel", "xe")]
    from fake_pynvml import NVML_ERROR_LIBRARY_NOT_FOUND

    alone = GpuSampler(FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)).sample()
    assert alone.unavailable is None and [g.vendor for g in alone.gpus] == ["AMD", "Intel"]
    assert alone.driver_version is None

    from widgets.gpu_panel import render_gpus

    text = plain(render_gpus(report))
    assert "[0] NVIDIA H200" in text and "[1] AMD Radeon RX 7900 XTX (amdgpu)" in text
    assert "[2] Intel GPU 0xe20b (xe)" in text and "fan 1450 RPM" in text


# ---- a probe's energy, a run's energy -----------------------------------------------------------------


def probe(engine_name: str, sent: float, ended: float, tokens: int = 64) -> ProbeResult:
    return ProbeResult(engine=engine_name, url="http://127.0.0.1:8080", workload="short", index=0,
                       wall_start=sent, sent_at=sent, first_token_at=sent + 0.1, last_token_at=ended,
                       ended_at=ended, status=200, completion_tokens=tokens)


def test_a_probe_gets_its_joules_once_readings_pass_its_end_or_says_too_short() -> None:
    clock = Clock(0.0)
    nvml = FakeNvml([h200(power_mw=250_000, compute_procs=[(5, GiB)])])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    store = Store()
    for _ in range(3):
        store.add(sampler.sample({"e": {5}}))
        clock.now += 1.0
        nvml.advance(1.0)
    store.add_probe("e", probe("e", 1.5, 5.5), t=5.5)  # 4 s at 250 W, readings at 2..5 inside it
    store.add_probe("e", probe("e", 2.2, 2.6), t=2.6)  # 0.4 s: too short
    assert store.engines["e"].probes[0][1].energy_j is None  # no reading after its end yet
    for _ in range(4):
        store.add(sampler.sample({"e": {5}}))
        clock.now += 1.0
        nvml.advance(1.0)
    long, short = (r for _, r in store.engines["e"].probes)
    assert long.energy_j == pytest.approx(1000.0) and long.energy_scope == "engine"
    assert long.energy_source == "counter" and long.joules_per_token == pytest.approx(1000.0 / 64)
    assert short.energy_j is None and short.energy_note.startswith("too short to read (0.40 s")
    assert long.to_json()["energy_j"] == pytest.approx(1000.0)
    from widgets.probe_panel import render_probes

    table = render_probes([long, short]).renderables[1]
    cells = [list(col.cells) for col in table.columns]
    assert table.columns[-1].header == "energy"
    assert cells[-1][0].plain == "1,000 J 15.6 J/tok" and cells[-1][1].plain == "too short to read"


def test_a_span_of_reports_and_a_runs_joules_per_token() -> None:
    reports = [GpuReport(t=t, gpus=(GpuSample(index=0, t=t, energy_j=100.0 + 300.0 * t, power_w=300.0,
                                              processes=(GpuProcess(1, GiB),)),
                                    GpuSample(index=1, t=t, power_w=50.0)))
               for t in (0.0, 1.0, 2.0, 4.0)]
    span = span_of_reports(reports)
    assert span["energy_j"] == pytest.approx(1200.0 + 200.0) and span["energy_source"] == MIXED
    assert span["energy_gpus_busy"] == [0]
    got = run_energy(span, None, 700, local=True)
    assert got["joules_per_token"] == pytest.approx(2.0) and got["energy_scope"].startswith("gpu 0")
    cpu_only = run_energy({"energy_j": None}, {"cpu_energy_j": 90.0, "cpu_energy_s": 3.0}, 30, local=True)
    assert cpu_only["energy_scope"] == "cpu package" and cpu_only["joules_per_token"] == pytest.approx(3.0)
    remote = run_energy(span, None, 700, local=False)
    assert remote["joules_per_token"] is None and "not on this machine" in remote["energy_note"]


def test_track_window_uses_two_readings_however_far_apart() -> None:
    track = Track(keep_s=120.0)
    track.add(Point(0.0, 0.0, None), None)
    track.add(Point(30.0, 3000.0, None), None)
    window = track.window(10.0)
    assert window is not None and window.seconds == 30.0 and window.watts == pytest.approx(100.0)
