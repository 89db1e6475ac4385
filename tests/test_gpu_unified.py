"""Unified memory (DGX Spark's GB10, Jetson): NVML answers NotSupported for the GPU's memory while
utilisation, power, temperature, clocks and the process list answer. The GPU is said `unified_memory`, its
memory figures are None (never 0), the panel points at the host's RAM, and a process whose memory NVML does
not give shows n/a, not 0. A GPU with its own memory beside it is unchanged.

The GB10 is scripted at pynvml's function boundary (tests/fake_pynvml.py): its name, and the memory call
raising exactly what pynvml raises, `NVMLError(NVML_ERROR_NOT_SUPPORTED)`, which is NVMLError_NotSupported.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml
import pytest
from fake_pynvml import FakeGpu, FakeNvml, h200

from tui.model.samples import GpuReport, GpuSample
from tui.record.codec import decode, encode
from tui.sources.gpu import GpuSampler, is_unified_name
from widgets.gpu_panel import render_gpus

GiB = 1 << 30
MiB = 1 << 20
# Above the kernel's pid_max, so no process on the machine running the tests can have them: the host's RSS
# is read for a unified GPU's processes, and a real pid 5353 (seen in CI) gave one 1.7 GB.
_PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())
ENGINE_PID, OTHER_PID = _PID_MAX + 4242, _PID_MAX + 5353
# pid_max lowered at run time leaves the processes above it alive: the premise is checked, not assumed
assert not any(psutil.pid_exists(p) for p in (ENGINE_PID, OTHER_PID)), "a test pid names a real process"


def gb10(**changes: Any) -> FakeGpu:
    """A DGX Spark's GB10: its memory is the host's, so NVML's memory call (v1 and v2), the power limit and
    the bus width answer NotSupported; utilisation, power, temperature, clocks and processes answer, the
    processes without their memory (usedGpuMemory None, as pynvml gives NVML_VALUE_NOT_AVAILABLE)."""
    values: dict[str, Any] = dict(
        name="NVIDIA GB10",
        uuid="GPU-0b10aaaa-0000-4000-8000-00000000gb10",
        vram_total=0,  # never answered: nvmlDeviceGetMemoryInfo raises NotSupported
        vram_used=0,
        max_sm_clock_mhz=3003,
        max_mem_clock_mhz=4266,
        bus_width_bits=256,
        power_limit_mw=140_000,
        util_gpu=93,
        util_mem=0,
        power_mw=41_250,
        temp_c=58,
        sm_clock_mhz=2418,
        compute_procs=[(ENGINE_PID, None), (OTHER_PID, None)],
        not_supported={"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetEnforcedPowerLimit",
                       "nvmlDeviceGetMemoryBusWidth"},
    )
    values.update(changes)
    return FakeGpu(**values)


def plain(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def blocks(text: str) -> dict[str, str]:
    """The panel's text per GPU, by the GPU's title line ("[0] NVIDIA H200")."""
    out: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("["):
            title = line.split("  ")[0].strip()
            out[title] = ""
        elif title is not None:
            out[title] += line + "\n"
    return out


def test_the_gb10_fake_raises_what_pynvml_raises() -> None:
    nvml = FakeNvml([gb10()])
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA GB10"
    for version in (None, pynvml.nvmlMemory_v2):  # the v1 and the v2 call
        with pytest.raises(pynvml.NVMLError_NotSupported) as raised:
            nvml.nvmlDeviceGetMemoryInfo(h, version)
        assert type(raised.value) is type(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
        assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED and str(raised.value) == "Not Supported"
    assert nvml.nvmlDeviceGetUtilizationRates(h).gpu == 93
    assert [(p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)] == [
        (ENGINE_PID, None), (OTHER_PID, None)]


def test_a_gb10_is_unified_memory_with_no_made_up_zero(caplog: pytest.LogCaptureFixture) -> None:
    sampler = GpuSampler(FakeNvml([gb10()]))
    with caplog.at_level(logging.INFO, logger="tui.sources.gpu"):
        for _ in range(3):  # NotSupported every sample: nothing raises, nothing is logged as an error
            report = sampler.sample({"vllm": {ENGINE_PID, 1}})
    assert report.unavailable is None and report.error is None
    (g,) = report.gpus
    assert g.error is None and g.name == "NVIDIA GB10" and g.unified_memory is True
    assert g.vram_used_bytes is None and g.vram_total_bytes is None  # never 0
    # everything else NVML answers is there
    assert (g.util_gpu_pct, g.power_w, g.temp_c, g.sm_clock_mhz) == (93.0, 41.25, 58.0, 2418.0)
    assert g.power_limit_w is None and g.peak_bw_gbps is None and g.mem_bw_gbps is None
    assert [(p.pid, p.used_bytes, p.engine) for p in g.processes] == [
        (ENGINE_PID, None, "vllm"), (OTHER_PID, None, None)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # NotSupported is said once at INFO, not every sample
    assert sum("nvmlDeviceGetMemoryInfo" in r.getMessage() for r in caplog.records) == 1

    text = plain(render_gpus(report))
    assert "unified memory: see host RAM" in text
    assert "VRAM" not in text and "0.0 GiB" not in text
    assert f"pid {ENGINE_PID} (vllm) n/a" in text
    assert f"pid {OTHER_PID} (not watched) n/a" in text


def test_a_normal_gpu_beside_the_gb10_is_unchanged() -> None:
    nvml = FakeNvml([h200(vram_used=97 * GiB, compute_procs=[(ENGINE_PID, 90 * GiB)]), gb10()])
    report = GpuSampler(nvml).sample({"vllm": {ENGINE_PID}})
    big, spark = report.gpus
    assert big.unified_memory is False and spark.unified_memory is True
    assert (big.vram_used_bytes, big.vram_total_bytes) == (97 * GiB, 143_771 * MiB)
    assert big.power_limit_w == pytest.approx(700.0) and big.peak_bw_gbps is not None
    assert [(p.pid, p.used_bytes, p.engine) for p in big.processes] == [(ENGINE_PID, 90 * GiB, "vllm")]
    assert spark.vram_used_bytes is None and spark.vram_total_bytes is None

    panel = blocks(plain(render_gpus(report)))
    assert set(panel) == {"[0] NVIDIA H200", "[1] NVIDIA GB10"}
    assert "VRAM" in panel["[0] NVIDIA H200"] and "97.0 GiB / 140.4 GiB" in panel["[0] NVIDIA H200"]
    assert f"pid {ENGINE_PID} (vllm) 90.0 GiB" in panel["[0] NVIDIA H200"]
    assert "unified" not in panel["[0] NVIDIA H200"]
    spark_text = panel["[1] NVIDIA GB10"]
    assert "unified memory: see host RAM" in spark_text and "VRAM" not in spark_text


def test_memory_not_supported_on_any_name_is_unified() -> None:
    """What makes it unified is NVML's answer, not only a name enginetop knows."""
    report = GpuSampler(FakeNvml([gb10(name="NVIDIA Some Future iGPU")])).sample()
    (g,) = report.gpus
    assert g.unified_memory is True and g.vram_used_bytes is None and g.vram_total_bytes is None


def test_a_unified_name_whose_memory_answers_keeps_nvmls_figures() -> None:
    """A Jetson whose NVML does answer its memory: said unified, the figures NVML gave are shown as the
    shared memory's, not dropped."""
    orin = gb10(name="NVIDIA Jetson AGX Orin", not_supported=set(), vram_total=64 * GiB, vram_used=12 * GiB)
    report = GpuSampler(FakeNvml([orin])).sample()
    (g,) = report.gpus
    assert g.unified_memory is True and (g.vram_used_bytes, g.vram_total_bytes) == (12 * GiB, 64 * GiB)
    text = plain(render_gpus(report))
    assert "12.0 GiB / 64.0 GiB (unified memory, shared with host RAM)" in text and "VRAM" not in text


@pytest.mark.parametrize(("name", "unified"), [
    ("NVIDIA GB10", True), ("NVIDIA Jetson AGX Orin", True), ("Orin (nvgpu)", True), ("NVIDIA Thor", True),
    ("NVIDIA GB200", False), ("NVIDIA GB100", False), ("NVIDIA H200", False),
    ("NVIDIA GeForce RTX 4090", False),
    (None, False), ("", False),
])
def test_unified_names(name: str | None, unified: bool) -> None:
    assert is_unified_name(name) is unified


def test_nvmls_not_available_value_from_an_older_binding_is_none() -> None:
    """An older nvidia-ml-py hands usedGpuMemory back as NVML_VALUE_NOT_AVAILABLE (2**64 - 1) instead of
    None: that is no memory figure either, never 2**64 - 1 bytes and never 0."""

    class OlderBinding(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
            gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
            return [SimpleNamespace(pid=pid, usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                                    if used is None else used) for pid, used in gpu.compute_procs]

    report = GpuSampler(OlderBinding([gb10()])).sample({"vllm": {ENGINE_PID}})
    processes = report.gpus[0].processes
    assert [(p.pid, p.used_bytes) for p in processes] == [(ENGINE_PID, None), (OTHER_PID, None)]


def test_a_unified_gpu_is_recorded_and_read_back() -> None:
    report = GpuSampler(FakeNvml([gb10()])).sample({"vllm": {ENGINE_PID}})
    back = decode(GpuReport, encode(report))
    assert back.gpus[0].unified_memory is True and back.gpus[0].vram_total_bytes is None
    assert back.gpus[0].processes == report.gpus[0].processes
    # a recording made before the field existed reads as a GPU with its own memory
    old = encode(GpuSample(index=0, t=1.0, name="NVIDIA H200", vram_total_bytes=GiB))
    assert "unified_memory" not in old and decode(GpuSample, old).unified_memory is False


def test_a_unified_gpus_processes_take_their_share_from_the_host() -> None:
    """NVML gives a GB10's processes no memory: each one's share is its resident memory on the host (the
    same pages), said so; a process that cannot be read stays n/a, never 0."""
    me = os.getpid()
    sampler = GpuSampler(FakeNvml([gb10(compute_procs=[(me, None), (OTHER_PID, None)])]))
    gpu = sampler.sample({"llama": {me}}).gpus[0]
    mine, other = sorted(gpu.processes, key=lambda p: p.pid != me)
    assert mine.engine == "llama" and mine.host_memory
    assert mine.used_bytes == pytest.approx(psutil.Process(me).memory_info().rss, rel=0.2)
    assert (other.used_bytes, other.host_memory) == (None, False)
    assert f"pid {me} (llama)" in plain(render_gpus(sampler.sample({"llama": {me}})))
    assert "host RSS" in plain(render_gpus(sampler.sample({"llama": {me}})))
