"""Energy: NVML's energy counter (the fake, at pynvml's boundary), AMD and Intel GPUs and RAPL from sysfs
trees in the kernel's layout with counters that advance at known rates, the store's windows, joules per token
per engine and whose they are, idle power, a probe's energy, a run's."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml, h200, rtx4090
from sysfs_tree import amd_card, drm_fd, intel_i915_card, intel_xe_card, rapl_package

from tui.live.store import Store
from tui.model.samples import EngineReading, EngineSample, GpuProcess, GpuReport, GpuSample, HostSample
from tui.probe.results import ProbeResult
from tui.sources.energy import MIXED, POWER_TIME, Point, Track, run_energy, span_of_reports
from tui.sources.energy import energy_of_readings as over
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler
from tui.sources.rapl import DEFAULT_MAX_W, UDEV_RULE, RaplReader, RaplReading, RaplSpan, root_only_line
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



def test_vram_no_listed_process_holds_is_someone_enginetop_cannot_see(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """NVML in a container's PID namespace lists no process (or not the host's): GPU 0 has 30 GiB in use
    and lists only vllm's 20 GiB, so vllm's figure is the GPU's shared with an unseen process, never
    "engine"; GPU 1 has 40 GiB in use and lists nothing, so the CPU engine llama beside it is not given the
    CPU package's energy (the engine might be the one holding GPU 1); a GPU that reads neither power nor
    energy says so instead of waiting for readings forever."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    zone = rapl_package(tmp_path, 0, energy_uj=5_000_000)
    clock = Clock()
    nvml = FakeNvml([h200(power_mw=300_000, compute_procs=[(4242, 20 * GiB)]),
                     h200(power_mw=300_000, compute_procs=[]),
                     rtx4090(compute_procs=[(77, GiB)], not_supported={
                         "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"})])
    nvml.set_vram_used(0, 30 * GiB)
    nvml.set_vram_used(1, 40 * GiB)
    nvml.set_vram_used(2, 2 * GiB)
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    host_sampler = HostSampler()
    store = Store(rate_window_s=10.0)
    for i in range(8):
        store.add(sampler.sample({"vllm": {4242}, "dark": {77}}))
        sample = host_sampler.sample()
        store.add(dataclasses.replace(host(clock.now, sample.cpu_energy_j, ("llama",)),
                                      cpu_energy_domains=sample.cpu_energy_domains))
        for name in ("vllm", "llama", "dark"):
            store.add(engine(name, clock.now, 100.0 * i))
        zone.add(30_000_000)
        clock.now += 1.0
        nvml.advance(1.0)
    vllm, llama, dark = (store.engines[n].stats for n in ("vllm", "llama", "dark"))
    assert vllm.energy_scope == "gpu 0" and vllm.energy_shared_with == ("a process enginetop does not watch",)
    assert vllm.joules_per_token == pytest.approx(3.0)
    assert llama.joules_per_token is None and llama.energy_scope is None
    assert llama.energy_note == ("not attributed: its processes hold no GPU, but gpu 0+1 is used by "
                                 "processes enginetop cannot name (a container?) or cannot be read: see the "
                                 "GPU panel")
    assert store.host.cpu_energy is not None  # the package was read: only its attribution was withheld
    store.add_probe("llama", probe("llama", clock.now - 4.0, clock.now - 2.0), t=clock.now - 2.0)
    store.add(sampler.sample({"vllm": {4242}, "dark": {77}}))
    [(_, done)] = store.engines["llama"].probes
    assert done.energy_j is None and done.energy_note.startswith(
        "not attributed: its processes hold no GPU, but gpu 0+1 is used by")  # a probe says as the column
    assert dark.joules_per_token is None
    assert dark.energy_note == "gpu 2 reports neither power nor an energy counter: no energy figure"
    reports = [GpuReport(t=float(t), gpus=(GpuSample(index=1, t=float(t), energy_j=300.0 * t, vendor="NVIDIA",
                                                     vram_used_bytes=40 * GiB),)) for t in range(5)]
    run = run_energy(span_of_reports(reports), {"cpu_energy_j": 100.0, "cpu_energy_s": 4.0}, 400, True,
                     engine="llama")
    assert run["joules_per_token"] is None and "had processes enginetop cannot name" in run["energy_note"]

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


def test_rapl_wrap_is_undone_exactly_as_the_kernel_wraps(tmp_path: Path) -> None:
    """intel_rapl_common.c: energy_uj is a 32-bit register of energy units (61.035 µJ here) and
    max_energy_range_uj is 0xffffffff of them, so the counter comes back to where it was after one unit MORE
    than max_energy_range_uj. 1000 units (61,035 µJ) across the wrap read as 61,035 µJ, within the µJ the
    kernel truncates each reading to; a wrap of max_energy_range_uj (or + 1) would lose ~61 µJ each time.
    Each step takes the time a package needs to draw it (a wrap must be energy the package could draw in the
    time between reads: else it was a reset, test_a_rapl_step_back_no_package_could_draw_is_a_reset)."""
    zone = rapl_package(tmp_path, 0, unit_nj=61_035)
    max_uj = int((tmp_path / "class" / "powercap" / "intel-rapl:0" / "max_energy_range_uj").read_text())
    assert max_uj == 262_143_328_850  # 0xffffffff x 61.035 µJ, truncated
    period = 2**32 * 61.035
    zone.add(period - 10 * 61.035)  # 10 units below the wrap
    clock = Clock()
    reader = RaplReader(tmp_path, clock=clock)
    start = reader.read().joules
    zone.add(1000 * 61.035)  # 1000 units: past the wrap, the register at 990
    clock.now += 0.01
    assert zone.value == int(990 * 61.035)
    assert (reader.read().joules - start) * 1e6 == pytest.approx(61_035.0, abs=2.0)
    for _ in range(5):  # around the range several times, read at each step (each under one wrap)
        zone.add(0.9 * period)
        clock.now += 600.0  # 236 kJ in 10 minutes: 393 W
        reader.read()
    assert (reader.read().joules - start) * 1e6 == pytest.approx(61_035.0 + 4.5 * period, abs=10.0)
    # AMD's and servers' unit, 2^-16 J (15.258 µJ as the driver truncates it): the same rule
    other = tmp_path / "amd"
    amd = rapl_package(other, 0, unit_nj=15_258)
    amd.add(2**32 * 15.258 - 3 * 15.258)
    amd_reader = RaplReader(other)
    first = amd_reader.read().joules
    amd.add(7 * 15.258)
    assert (amd_reader.read().joules - first) * 1e6 == pytest.approx(7 * 15.258, abs=2.0)


def test_a_rapl_step_back_no_package_could_draw_is_a_reset_and_counts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """energy_uj also goes back when the register starts again (a resume from suspend, a CPU reset). Taken for
    a wrap, that adds period - before + after: up to a whole range (65-262 kJ) never drawn. A wrap is what a
    package could draw in the time between the reads: at most twice its largest constraint_N_max_power_uw
    (here 250 W: 500 W), else DEFAULT_MAX_W (AMD's zones have no constraints); more than that is a reset,
    counted as nothing and said so (the reading's note, a span's and a run's energy_note)."""
    from tui.sources.energy import run_energy

    intel = tmp_path / "intel"
    zone = rapl_package(intel, 0, energy_uj=100_000_000_000, max_power_uw=(125_000_000, 250_000_000))
    period = zone.period
    assert period is not None
    clock = Clock()
    reader = RaplReader(intel, clock=clock)
    last = {"joules": reader.read().joules}

    def step(amount_uj: float, seconds: float) -> tuple[float, RaplReading]:
        """The counter moved by `amount_uj` (mod its period), read `seconds` on: joules counted, reading."""
        zone.add(amount_uj)
        clock.now += seconds
        got = reader.read()
        assert got.joules is not None and got.error is None and last["joules"] is not None
        moved, last["joules"] = got.joules - last["joules"], got.joules
        return moved, got

    # the register back to 5 J from 100 kJ, a second on: as a wrap 162 kJ (162 kW), so a reset: nothing
    moved, got = step(5_000_000 - zone.exact, 1.0)
    assert moved == 0.0  # today: 162,148 J
    assert got.note is not None and got.note.startswith(
        "intel-rapl:0 package-0: energy_uj went back from 100,000.0 J to 5.0 J in 1.0 s: as a wrap that is "
        "162,148 J, more than the package draws at 500 W: a reset")
    assert got.note.endswith("nothing counted for it")
    moved, got = step(10_000_000, 1.0)  # counting on from the reset
    assert moved == pytest.approx(10.0) and got.note is None
    # 300 J below the top, then 800 J on: across the wrap. In 2 s (400 W) a wrap, counted whole...
    step(period - 300_000_000 - zone.exact, 1000.0)
    moved, got = step(800_000_000, 2.0)
    assert moved == pytest.approx(800.0, abs=1e-3) and got.note is None
    # ... in 1 s (800 W, above the package's 500 W) no wrap: a reset
    step(period - 300_000_000 - zone.exact, 1000.0)
    moved, got = step(800_000_000, 1.0)
    assert moved == 0.0 and got.note is not None and "a reset" in got.note

    # AMD (2^-16 J units, a 65.5 kJ range, no power constraints): DEFAULT_MAX_W bounds a wrap
    amd_root = tmp_path / "amd"
    amd = rapl_package(amd_root, 0, energy_uj=30_000_000_000, unit_nj=15_258)
    assert amd.period is not None and not list((amd_root / "class" / "powercap" / "intel-rapl:0")
                                               .glob("constraint_*"))
    clock = Clock()
    reader = RaplReader(amd_root, clock=clock)
    start = reader.read().joules
    amd.add(1_000_000_000 - amd.exact)  # 30 kJ back to 1 kJ: as a wrap 36.5 kJ in 1 s
    clock.now += 1.0
    got = reader.read()
    assert got.joules == start  # today: start + 36.5 kJ
    assert got.note is not None and f"at {DEFAULT_MAX_W:.0f} W: a reset" in got.note
    amd.add(amd.period - 500_000_000 - amd.exact)  # 500 J below the top, a long while on
    clock.now += 600.0
    before = reader.read().joules
    amd.add(900_000_000)  # 900 J on in 1 s: a wrap a package can draw
    clock.now += 1.0
    got = reader.read()
    assert got.note is None and got.joules - before == pytest.approx(900.0, abs=1e-3)

    # a span (an A/B block, a bench run) with a reset in it says so in its result, and the run's figure too
    zone = rapl_package(intel, 0, energy_uj=100_000_000_000, max_power_uw=(125_000_000, 250_000_000))
    clock = Clock()
    span = RaplSpan(RaplReader(intel, clock=clock), clock=clock)
    zone.add(20_000_000)
    clock.now += 1.0
    span.tick()
    zone.add(5_000_000 - zone.exact)  # the reset
    clock.now += 1.0
    span.tick()
    zone.add(30_000_000)
    clock.now += 1.0
    result = span.result()
    assert result["cpu_energy_j"] == pytest.approx(20.0 + 30.0)  # what was drawn around the reset, no range
    assert "a reset" in result["cpu_energy_note"]
    run = run_energy(None, result, 100, local=True, engine="llama")
    assert run["energy_scope"] == "cpu package" and run["joules_per_token"] == pytest.approx(0.5)
    assert run["energy_note"] == result["cpu_energy_note"]

    # the dashboard's host sampler, reading the tree through ENGINETOP_SYSFS_ROOT: its counter never jumps
    # by a range at a reset (the reads are milliseconds apart here)
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(intel))
    sampler = HostSampler()
    first = sampler.sample().cpu_energy_j
    zone.add(1_000_000 - zone.exact)
    second = sampler.sample().cpu_energy_j
    assert first is not None and second == first


def test_a_rapl_span_reads_between_its_ends_so_no_wrap_is_lost(tmp_path: Path) -> None:
    """A span longer than the wrap period: each read of energy_uj here comes 0.6 of a wrap period after the
    one before (a package drawing hard for minutes between reads). Read at its ends only, a span would see
    0.6 of a period whatever the number of wraps between; read every `every_s` in its own thread (`with`), or
    ticked by the EnergyMeter's loop, it sums every change, each wrap undone."""
    from tui.sources.energy_meter import EnergyMeter, EnginePids

    zone = rapl_package(tmp_path, 0, energy_uj=1_000)
    step = 0.6 * zone.period
    reads = {"n": 0}

    def minutes() -> float:  # the reader's clock: each read 10 minutes after the one before (262 W)
        return reads["n"] * 600.0

    def advancing(path: Path) -> str:
        if path.name == "energy_uj" and path.parent.name == "intel-rapl:0":
            reads["n"] += 1
            zone.add(step)
        return path.read_text()

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 20.0
        while reads["n"] < n and time.monotonic() < deadline:
            time.sleep(0.01)

    with RaplSpan(RaplReader(tmp_path, read_file=advancing, clock=minutes), every_s=0.005) as span:
        wait_for(6)
    got = span.result()
    assert reads["n"] >= 7  # the start, the thread's reads, the end
    assert got["cpu_energy_j"] * 1e6 == pytest.approx((reads["n"] - 1) * step, rel=1e-9)

    reads["n"] = 0
    pids = EnginePids("llama", "http://127.0.0.1:9", pid=os.getpid())  # this process stands in for it
    with EnergyMeter(None, interval_s=0.005, rapl=RaplReader(tmp_path, read_file=advancing, clock=minutes),
                     pids=pids) as meter:
        wait_for(6)
        time.sleep(1.05)  # a run shorter than MIN_SPAN_S is "too short to read"
    out = meter.result(1000, local=True)
    assert out["energy_scope"] == "cpu package"
    assert out["energy_j"] * 1e6 == pytest.approx((reads["n"] - 1) * step, rel=1e-9)


def test_rapl_root_only_names_the_side_channel_and_the_safer_ways_to_read_it(tmp_path: Path) -> None:
    """Since Linux 5.10 energy_uj is 0400 root: readable by everyone it is the PLATYPUS power side channel
    (CVE-2020-8694). The line says so, offers the safer ways first (enginetop as root; one group's read
    through a udev rule that runs at each boot), and says what the quick chmod re-opens. Tests run as root
    here, where chmod cannot take a read away, so the reader's file read is replaced by one that raises what
    open() raises for a non-root user."""
    rapl_package(tmp_path, 0)

    def denied(path: Path) -> str:
        if path.name == "energy_uj":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return path.read_text()

    got = RaplReader(tmp_path, read_file=denied).read()
    path = tmp_path / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
    assert got.joules is None and got.error == root_only_line([path])
    assert got.error.startswith("CPU energy (RAPL) is readable by root only here (since Linux 5.10: the "
                                "PLATYPUS power side channel, CVE-2020-8694): run enginetop as root, or let "
                                "one group (here `power`) read it with a udev rule in /etc/udev/rules.d/: ")
    assert f"`{UDEV_RULE}`" in got.error
    assert got.error.endswith(f"`sudo chmod o+r {path}` works until the next boot but re-opens that side "
                              "channel to every local user")
    # the rule: each powercap zone with a counter (%p its device path under /sys), added at boot, gives the
    # group the read; control types (no energy_uj) are skipped
    assert UDEV_RULE.startswith('ACTION=="add", SUBSYSTEM=="powercap", TEST=="energy_uj", ')
    assert 'RUN+="/bin/chmod g+r /sys%p/energy_uj"' in UDEV_RULE and "o+r" not in UDEV_RULE
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


def test_an_amd_gpu_holding_the_engine_is_never_called_its_alone(tmp_path: Path) -> None:
    """sysfs lists only the processes of the PIDs it is given: another program on the AMD GPU cannot be
    seen, so the column and a probe say the whole GPU's energy ("gpu 0 (the whole GPU: ...)"), never
    "engine" as NVML's complete list allows."""
    counters = amd_card(tmp_path, 0, energy_uj=10_000_000, power_file="power1_input", power_uw=220_000_000)
    proc = tmp_path / "proc"
    drm_fd(proc, 4242, 12, "0000:03:00.0", client=7, vram_kib=1 << 20)
    clock = Clock(0.0)
    sampler = GpuSampler(FakeNvml([]), clock=clock,
                         sysfs=SysfsGpus(tmp_path, proc_root=proc, clock=clock, amd_smi=None))
    store = Store()
    for i in range(8):
        store.add(sampler.sample({"vllm": {4242}}))
        store.add(engine("vllm", clock.now, 110.0 * i))
        clock.now += 1.0
        counters["energy"].add(220_000_000)  # 220 W
    stats = store.engines["vllm"].stats
    whole = "gpu 0 (the whole GPU: AMD sysfs cannot show other processes on it)"
    assert stats.energy_scope == whole and stats.energy_shared_with == ()
    assert stats.joules_per_token == pytest.approx(2.0)  # 220 W / 110 tok/s
    store.add_probe("vllm", probe("vllm", 2.5, 5.5), t=5.5)
    store.add(sampler.sample({"vllm": {4242}}))
    [(_, done)] = store.engines["vllm"].probes
    assert done.energy_scope == whole and done.energy_j == pytest.approx(3 * 220.0)


def test_bench_and_ab_name_the_engines_processes_so_its_amd_gpu_is_used(tmp_path: Path) -> None:
    """The EnergyMeter (bench, capacity, probe) and the A/B's GpuWatch give the sampler the engine's process
    tree (EnginePids: this test's own process stands in for the engine), so the AMD GPU whose DRM fdinfo
    shows it is the run's energy: 250 W for 10 s over 1000 tokens, not the CPU package's beside it."""
    from tui.compare.gpu_watch import GpuWatch
    from tui.sources.energy_meter import EnergyMeter, EnginePids

    me = os.getpid()
    counters = amd_card(tmp_path, 0, energy_uj=10_000_000, power_file="power1_input")
    rapl_package(tmp_path, 0, energy_uj=5_000_000)  # a CPU package too: never taken for this engine
    proc = tmp_path / "proc"
    drm_fd(proc, me, 12, "0000:03:00.0", client=7, vram_kib=1 << 20)
    clock = Clock(0.0)
    sampler = GpuSampler(FakeNvml([]), clock=clock,
                         sysfs=SysfsGpus(tmp_path, proc_root=proc, clock=clock, amd_smi=None))
    pids = EnginePids("vllm", "http://127.0.0.1:9", pid=me)
    with EnergyMeter(sampler.sample, interval_s=3600.0, rapl=RaplReader(tmp_path), pids=pids) as meter:
        clock.now += 10.0
        counters["energy"].add(2_500_000_000)  # 250 W for 10 s
    got = meter.result(1000, local=True)
    assert pids.found and got["energy_j"] == pytest.approx(2500.0)
    assert got["joules_per_token"] == pytest.approx(2.5) and got["energy_source"] == "counter"
    assert got["energy_scope"] == "gpu 0 (the whole GPU: AMD sysfs cannot show other processes on it)"
    with GpuWatch(sampler.sample, 3600.0, EnginePids("vllm", "http://127.0.0.1:9", pid=me)) as watch:
        clock.now += 10.0
        counters["energy"].add(2_500_000_000)
    summary = watch.summary()
    [gpu] = summary["energy_gpus"]
    assert gpu["engines"] == ["vllm"] and gpu["energy_j"] == pytest.approx(2500.0)
    assert run_energy(summary, {"cpu_energy_j": 99.0}, 1000, True, "vllm")["joules_per_token"] == \
        pytest.approx(2.5)



def test_a_cpu_engine_on_a_workstation_keeps_the_packages_figure(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """The desktop's Xorg on the NVIDIA card (a graphics process, 300 MiB) is no sign that the CPU engine is
    on the GPU: the engine, on no GPU, gets the CPU package's joules per token in the column and in a run."""
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path))
    zone = rapl_package(tmp_path, 0, energy_uj=5_000_000)
    clock = Clock()
    nvml = FakeNvml([rtx4090(power_mw=30_000, graphics_procs=[(1234, 300 << 20)])])
    nvml.set_vram_used(0, 400 << 20)
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    host_sampler = HostSampler()
    store = Store(rate_window_s=10.0)
    for i in range(8):
        report = sampler.sample({"llama": {4242}})
        store.add(report)
        sample = host_sampler.sample()
        store.add(dataclasses.replace(host(clock.now, sample.cpu_energy_j, ("llama",)),
                                      cpu_energy_domains=sample.cpu_energy_domains))
        store.add(engine("llama", clock.now, 20.0 * i))
        zone.add(30_000_000)
        clock.now += 1.0
        nvml.advance(1.0)
    assert report.gpus[0].processes[0].graphics and report.gpus[0].processes[0].engine is None
    stats = store.engines["llama"].stats
    assert stats.energy_scope == "cpu package" and stats.joules_per_token == pytest.approx(1.5)
    run = run_energy(span_of_reports([report]), {"cpu_energy_j": 60.0, "cpu_energy_s": 2.0}, 40, True,
                     engine="llama")
    assert run["energy_scope"] == "cpu package" and run["joules_per_token"] == pytest.approx(1.5)


def test_a_gpu_lost_unreadable_or_dark_in_a_run_gives_no_figure_and_never_the_cpu_packages(
        tmp_path: Path) -> None:
    """The real sampler never raises: a GPU lost mid-run comes back as a GPU with an error. Its readings stop
    short of the run, so no figure (not its part over all the tokens); a GPU that errs from the start may be
    the engine's, so the CPU package's energy is not given to an engine seen on no GPU; a GPU holding the
    engine that reads neither power nor energy says so (no CPU package in its place)."""
    from tui.sources.energy_meter import EnergyMeter, EnginePids

    rapl_package(tmp_path, 0, energy_uj=5_000_000)
    me = os.getpid()
    clock = Clock(0.0)
    nvml = FakeNvml([h200(power_mw=300_000, compute_procs=[(me, 20 * GiB)])])
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    with EnergyMeter(sampler.sample, interval_s=3600.0, rapl=RaplReader(tmp_path),
                     pids=EnginePids("vllm", "http://127.0.0.1:9", pid=me)) as meter:
        clock.now += 10.0
        nvml.advance(10.0)
        nvml.lose_gpu(0)
    got = meter.result(1000, local=True)
    assert got["joules_per_token"] is None and got["energy_scope"] is None
    assert got["energy_note"].startswith("a GPU was lost during the run (gpu 0: ") and \
        got["energy_note"].endswith("): no energy figure")
    lost = GpuSample(index=0, t=0.0, error="GPU is lost")
    unread = [GpuReport(t=float(t), gpus=(lost,)) for t in range(5)]
    cpu = {"cpu_energy_j": 50.0, "cpu_energy_s": 4.0}
    got = run_energy(span_of_reports(unread), cpu, 100, True, engine="llama")
    assert got["joules_per_token"] is None and "gpu 0 had processes" in got["energy_note"]
    dark = [GpuReport(t=float(t), gpus=(GpuSample(index=0, t=float(t), vendor="NVIDIA", processes=(
        GpuProcess(me, GiB, engine="llama"),)),)) for t in range(5)]
    got = run_energy(span_of_reports(dark), cpu, 100, True, engine="llama")
    assert got["joules_per_token"] is None and got["energy_note"] == \
        "gpu 0 reports neither power nor an energy counter: no energy figure"


def test_a_sampler_that_fails_mid_run_gives_no_figure_and_says_why(tmp_path: Path) -> None:
    """The GPU sampler raises after the first reading (a driver gone): the run's readings stop short of its
    end, so neither the meter nor the A/B's watch puts the part they saw over all the run's tokens, nor the
    CPU package's energy in the GPU's place; each says what failed."""
    from tui.compare.gpu_watch import GpuWatch
    from tui.sources.energy_meter import EnergyMeter

    rapl_package(tmp_path, 0, energy_uj=5_000_000)
    clock = Clock(0.0)
    sampler = GpuSampler(FakeNvml([h200(power_mw=300_000, compute_procs=[(os.getpid(), 20 * GiB)])]),
                         clock=clock, sysfs=False)
    calls = []

    def failing(pids: dict[str, set[int]] | None = None) -> GpuReport:
        calls.append(pids)
        if len(calls) > 1:
            raise RuntimeError("NVML Shutdown")
        return sampler.sample(pids)

    with EnergyMeter(failing, interval_s=3600.0, rapl=RaplReader(tmp_path)) as meter:
        clock.now += 10.0
    got = meter.result(1000, local=True)
    assert got["energy_j"] is None and got["joules_per_token"] is None and got["energy_scope"] is None
    assert got["energy_note"] == ("GPU sampling failed during the run (RuntimeError: NVML Shutdown): "
                                  "no energy figure")
    calls.clear()
    with GpuWatch(failing, 3600.0) as watch:
        clock.now += 10.0
    summary = watch.summary()
    assert summary["samples"] == 1 and summary["energy_j"] is None and summary["energy_gpus"] == []
    assert summary["energy_note"] == "GPU sampling failed during the run (RuntimeError: NVML Shutdown): " \
                                     "no energy figure"
    assert run_energy(summary, {"cpu_energy_j": 99.0}, 1000, True, None)["joules_per_token"] is None

def test_amd_smi_energy_for_every_card_matched_by_its_pci_address(tmp_path: Path) -> None:
    """Card 0 has hwmon's energy1_input, card 1 none: amd-smi gives card 1's, though card 0 never asks for
    it, and amd-smi's GPU 0 is card 1 (0000:43:00.0 in `amd-smi list`): matched by address, not by order."""
    amd_card(tmp_path, 0, pci="0000:03:00.0", energy_uj=10_000_000)
    amd_card(tmp_path, 1, pci="0000:43:00.0")
    fake = tmp_path / "amd-smi"
    listed = [{"gpu": 0, "bdf": "0000:43:00.0"}, {"gpu": 1, "bdf": "0000:03:00.0"}]
    metric = [{"gpu": i, "energy": {"total_energy_consumption": {"value": joules, "unit": "J"}}}
              for i, joules in ((0, 5000.5), (1, 7000.0))]
    fake.write_text(f"""#!{sys.executable}
import sys
print({json.dumps(listed)!r} if sys.argv[1] == "list" else {json.dumps(metric)!r})
""")
    fake.chmod(0o755)
    clock = Clock()
    reader = SysfsGpus(tmp_path, clock=clock, amd_smi=str(fake))
    card0, card1 = reader.sample({})
    assert card0.energy_j == pytest.approx(10.0)  # its own hwmon counter
    assert card1.energy_j == pytest.approx(5000.5)  # amd-smi's GPU 0, by its address
    clock.now += 1.0
    assert reader.sample({})[1].energy_j is None  # amd-smi runs again only after AMD_SMI_EVERY_S


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
    """A run's energy is that of the GPUs summed and named: the busy GPU 0's 1200 J over 700 tokens, never
    the idle GPU 1's 200 J beside them (the panel's block summary still shows every GPU's total)."""
    reports = [GpuReport(t=t, gpus=(GpuSample(index=0, t=t, energy_j=100.0 + 300.0 * t, power_w=300.0,
                                              processes=(GpuProcess(1, GiB),)),
                                    GpuSample(index=1, t=t, power_w=50.0)))
               for t in (0.0, 1.0, 2.0, 4.0)]
    span = span_of_reports(reports)
    assert span["energy_j"] == pytest.approx(1200.0 + 200.0) and span["energy_source"] == MIXED
    assert span["energy_gpus_busy"] == [0]
    got = run_energy(span, None, 700, local=True)
    assert got["energy_j"] == pytest.approx(1200.0) and got["joules_per_token"] == pytest.approx(1200.0 / 700)
    assert got["energy_source"] == "counter"
    assert got["energy_scope"] == "gpu 0 (held a compute process over the run, not matched to the engine's " \
                                  "processes)"
    cpu_only = run_energy({"energy_j": None}, {"cpu_energy_j": 90.0, "cpu_energy_s": 3.0}, 30, local=True,
                          engine="llama")
    assert cpu_only["energy_scope"] == "cpu package" and cpu_only["joules_per_token"] == pytest.approx(3.0)
    # its processes not found: on no GPU seen, but not seen on the CPU either: the package's is not its
    unfound = run_energy({"energy_j": None}, {"cpu_energy_j": 90.0, "cpu_energy_s": 3.0}, 30, local=True)
    assert unfound["joules_per_token"] is None and "processes were not found" in unfound["energy_note"]
    remote = run_energy(span, None, 700, local=False)
    assert remote["joules_per_token"] is None and "not on this machine" in remote["energy_note"]


def test_a_runs_energy_is_the_gpus_holding_the_engine_and_says_whose() -> None:
    """Its processes named: only the GPUs holding them are summed (GPU 1, vllm's; never GPU 0, busy with a
    process of someone else's); alone on an NVIDIA GPU it says so; on none, with an unnamed process on a GPU,
    no figure rather than a guess."""
    def at(t: float) -> GpuReport:
        return GpuReport(t=t, gpus=(
            GpuSample(index=0, t=t, energy_j=300.0 * t, vendor="NVIDIA", processes=(GpuProcess(9, GiB),)),
            GpuSample(index=1, t=t, energy_j=200.0 * t, vendor="NVIDIA",
                      processes=(GpuProcess(4242, GiB, engine="vllm"),))))

    span = span_of_reports([at(0.0), at(5.0)])
    got = run_energy(span, None, 500, local=True, engine="vllm")
    assert got["energy_j"] == pytest.approx(1000.0) and got["joules_per_token"] == pytest.approx(2.0)
    assert got["energy_scope"] == "gpu 1 (the engine's alone)"
    cpu = {"cpu_energy_j": 90.0, "cpu_energy_s": 5.0}
    elsewhere = run_energy(span, cpu, 500, local=True, engine="llama")
    assert elsewhere["energy_j"] is None
    assert elsewhere["energy_note"].startswith("not attributed: its processes held no GPU")
    assert "gpu 0" in elsewhere["energy_note"]


def test_a_spans_energy_is_labelled_by_what_it_came_from() -> None:
    """A probe's span: the counter inside it, an edge before its first reading from an interval with no
    counter (power only): the joules are partly power x time's, so the label says power x time, never
    "counter"; all from the counter, "counter"."""
    track = Track(keep_s=120.0)
    track.add(Point(0.0, None, 100.0), None)  # no counter reading here (dropped, or not supported yet)
    for t in (1.0, 2.0, 3.0, 4.0):
        track.add(Point(t, 100.0 * t, 100.0), None)
    joules, source = track.between(0.5, 3.0)
    assert joules == pytest.approx(250.0) and source == POWER_TIME
    joules, source = track.between(1.5, 3.5)
    assert joules == pytest.approx(200.0) and source == "counter"


def test_track_window_uses_two_readings_however_far_apart() -> None:
    track = Track(keep_s=120.0)
    track.add(Point(0.0, 0.0, None), None)
    track.add(Point(30.0, 3000.0, None), None)
    window = track.window(10.0)
    assert window is not None and window.seconds == 30.0 and window.watts == pytest.approx(100.0)


def test_readings_without_the_counter_at_a_spans_ends_are_counted_not_dropped() -> None:
    """amd-smi's counter is asked every few seconds: readings at the span's ends may carry power only. Their
    time counts at power x time (and the figure says so), not only the stretch between counter readings."""
    track = Track(keep_s=60.0)
    for t, energy in ((0.0, None), (1.0, None), (2.0, 500.0), (3.0, 600.0), (4.0, None)):
        track.add(Point(t, energy, 100.0), idle=False)
    joules, source = track.between(0.0, 4.0)
    assert joules == pytest.approx(400.0) and source == "power × time"
    counter_only = Track(keep_s=60.0)
    for t in range(5):
        counter_only.add(Point(float(t), 100.0 * t, 100.0), idle=False)
    assert counter_only.between(0.0, 4.0) == (pytest.approx(400.0), "counter")


def test_a_run_shorter_than_the_counter_can_read_says_so() -> None:
    cpu = {"cpu_energy_j": 9.0, "cpu_energy_s": 0.3}
    short = run_energy(None, cpu, 50, local=True, engine="llama")
    assert short["energy_j"] is None and short["joules_per_token"] is None
    assert short["energy_note"].startswith("too short to read (0.30 s")
    assert run_energy(None, {"cpu_energy_j": 30.0, "cpu_energy_s": 3.0}, 50, local=True,
                      engine="llama")["energy_j"] == 30.0


def test_engines_run_at_once_share_the_joules_but_not_per_token(tmp_path: Path) -> None:
    """`bench --parallel-engines`: two engines on the same CPU package at once. Each part's meter reads the
    package's joules, which are both engines' work: the joules stand, with whom said; per token over one
    engine's tokens would count the other's work as its own, so it is not given."""
    from tui.sources.energy_meter import EnergyMeter, EnginePids

    zone = rapl_package(tmp_path, 0, energy_uj=5_000_000)
    pids = EnginePids("llama", "http://127.0.0.1:9", pid=os.getpid())
    with EnergyMeter(None, interval_s=3600.0, rapl=RaplReader(tmp_path), pids=pids) as meter:
        zone.add(40_000_000)
        time.sleep(1.05)
    alone = meter.result(100, local=True)
    assert alone["energy_j"] == pytest.approx(40.0) and alone["joules_per_token"] == pytest.approx(0.4)
    shared = meter.result(100, local=True, shared_with=("vllm",))
    assert shared["energy_j"] == pytest.approx(40.0) and shared["joules_per_token"] is None
    assert shared["energy_scope"] == "cpu package, shared with vllm (ran at once)"
    assert shared["energy_note"] == "per token not attributed: vllm ran at once on the same devices"
    # the engine alone on its GPU: the other engine's work is not in these joules, per token stands
    me = os.getpid()
    clock = Clock(0.0)
    nvml = FakeNvml([h200(power_mw=300_000, compute_procs=[(me, 20 * GiB)])])
    nvml.set_vram_used(0, 20 * GiB)
    sampler = GpuSampler(nvml, clock=clock, sysfs=False)
    with EnergyMeter(sampler.sample, interval_s=3600.0, pids=EnginePids("vllm", "http://127.0.0.1:9",
                                                                        pid=me)) as meter:
        clock.now += 10.0
        nvml.advance(10.0)
    own = meter.result(1000, local=True, shared_with=("llama",))
    assert own["energy_scope"] == "gpu 0 (the engine's alone)"
    assert own["joules_per_token"] == pytest.approx(3.0) and own["energy_note"] is None


def test_gpus_with_windows_of_other_lengths_count_each_over_its_own_a_window_without_tokens_still_counts():
    """Each GPU's watts against the tokens of its own window (300 W over 10 s at 100 tok/s, 100 W over 60 s
    at 50 tok/s: 3 + 2 = 5 J/tok, not 400 W / 100 tok/s); a GPU whose window saw no token (its track still
    young) against the tokens over all the windows, never no figure while tokens came."""
    from tui.model.samples import EnergyWindow, GpuSample
    from tui.sources.attribution import on_gpus

    def gpu(i: int, seconds: float, watts: float) -> GpuSample:
        return GpuSample(i, 100.0, energy=EnergyWindow(seconds, watts * seconds, watts, "counter"))

    rates = {(90.0, 100.0): 100.0, (40.0, 100.0): 50.0, (98.0, 100.0): 0.0}
    got = on_gpus([gpu(0, 10.0, 300.0), gpu(1, 60.0, 100.0)], ["e"], lambda e, t0, t1: rates[(t0, t1)])
    assert got.joules_per_token == pytest.approx(5.0) and got.energy_w == pytest.approx(400.0)
    got = on_gpus([gpu(0, 10.0, 300.0), gpu(1, 2.0, 100.0)], ["e"],
                  lambda e, t0, t1: {(90.0, 100.0): 50.0, (98.0, 100.0): 0.0}[(t0, t1)])
    assert got.joules_per_token == pytest.approx(300.0 / 50.0 + 100.0 / 50.0)
