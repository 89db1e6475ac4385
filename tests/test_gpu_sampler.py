"""GpuSampler against the real pynvml (no driver here) and the scripted fake at pynvml's boundary."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import threading
import time

import pynvml
import pytest
from fake_pynvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeNvml,
    h200,
    rtx4090,
)

from tui.model.samples import GpuSample
from tui.sources import gpu as gpu_module
from tui.sources.gpu import INIT_RETRY_S, NO_LIBRARY, GpuSampler, peak_bandwidth_gbps, throttle_words

GiB = 1 << 30


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def one(report, index: int = 0) -> GpuSample:
    assert report.unavailable is None, report.unavailable
    return report.gpus[index]


def _drm() -> str:
    """Where the sampler looked for AMD and Intel GPUs: the empty sysfs every test gets (conftest)."""
    return os.path.join(os.environ["ENGINETOP_SYSFS_ROOT"], "class", "drm")


def driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# ---- no driver --------------------------------------------------------------------------------------


def test_real_pynvml_without_driver_gives_one_line_reason() -> None:
    sampler = GpuSampler()  # the real pynvml module
    report = sampler.sample()
    if driver_present():  # a GPU machine: the real thing must then work
        assert report.unavailable is None and report.gpus and report.driver_version
        assert all(g.error is None for g in report.gpus)
        sampler.close()
        return
    assert report.gpus == ()
    assert report.unavailable == ("no NVIDIA driver found (NVML: NVML Shared Library Not Found); "
                                  f"no AMD or Intel GPU in {_drm()}: GPU panel off")
    assert "\n" not in report.unavailable
    # the real library raises the class the sampler catches, in the words the sampler gives without asking
    # it (pynvml is not imported where its library does not load), and the fake copies exactly that
    with pytest.raises(pynvml.NVMLError_LibraryNotFound) as raised:
        pynvml.nvmlInit()
    assert str(raised.value) == NO_LIBRARY


def test_pynvml_is_imported_only_where_its_library_loads() -> None:
    code = ("import sys; from tui.sources.gpu import GpuSampler; report = GpuSampler().sample(); "
            "print(report.unavailable); print('pynvml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    words, imported = out.stdout.strip().splitlines()
    if driver_present():  # a GPU machine: read through pynvml
        assert imported == "True" and not words.startswith("no NVIDIA driver"), words
    else:
        assert words.startswith(f"no NVIDIA driver found (NVML: {NO_LIBRARY})") and imported == "False"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_fake_without_driver(code: int, words: str) -> None:
    nvml = FakeNvml(init_error=code)
    report = GpuSampler(nvml).sample()
    assert report.gpus == () and report.driver_version is None
    assert report.unavailable == (f"no NVIDIA driver found (NVML: {words}); no AMD or Intel GPU in "
                                  f"{_drm()}: GPU panel off")


def test_other_init_error_is_reported_in_words() -> None:
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    report = GpuSampler(nvml).sample()
    assert report.unavailable == (
        "NVIDIA driver unusable (NVML: RM has detected an NVML/RM version mismatch.); no AMD or Intel GPU in "
        f"{_drm()}: GPU panel off"
    )


def test_init_is_retried_rarely_and_recovers_when_the_driver_appears() -> None:
    clock = FakeClock()
    nvml = FakeNvml([h200()], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    sampler = GpuSampler(nvml, clock=clock)
    for step in range(10):  # 10 samples within the retry interval: one init attempt
        clock.now = 1000.0 + step * (INIT_RETRY_S / 10 - 0.01)
        assert sampler.sample().unavailable is not None
    assert nvml.calls["nvmlInit"] == 1
    nvml.init_error = None  # driver loaded meanwhile
    clock.now = 1000.0 + INIT_RETRY_S - 0.01
    assert sampler.sample().unavailable is not None
    assert nvml.calls["nvmlInit"] == 1
    clock.now = 1000.0 + INIT_RETRY_S
    report = sampler.sample()
    assert nvml.calls["nvmlInit"] == 2
    assert one(report).name == "NVIDIA H200"


def test_zero_devices_is_unavailable() -> None:
    nvml = FakeNvml([])
    report = GpuSampler(nvml).sample()
    assert report.unavailable == ("no NVIDIA GPU found (NVML sees 0 devices); no AMD or Intel GPU in "
                                  f"{_drm()}: GPU panel off")
    assert nvml.initialized is False  # shut down again


def test_missing_binding_module_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    monkeypatch.setattr(gpu_module, "nvml_library_loads", lambda: True)  # a driver, without its binding
    report = GpuSampler().sample()
    assert report.unavailable is not None
    assert report.unavailable.startswith("nvidia-ml-py is not installed")


# ---- healthy GPUs ----------------------------------------------------------------------------------


def test_all_fields_of_an_h200() -> None:
    gpu = h200(util_gpu=87, util_mem=41, power_mw=523_456, temp_c=64, sm_clock_mhz=1755, mem_clock_mhz=2619,
               vram_used=97 * GiB)
    nvml = FakeNvml([gpu], driver_version="570.172.08")
    sampler = GpuSampler(nvml)
    assert nvml.calls["nvmlInit"] == 0  # lazy
    report = sampler.sample()
    s = one(report)
    assert report.driver_version == "570.172.08"
    assert (s.index, s.name, s.uuid) == (0, "NVIDIA H200", gpu.uuid)
    assert (s.util_gpu_pct, s.util_mem_pct) == (87.0, 41.0)
    assert s.power_w == pytest.approx(523.456)
    assert s.power_limit_w == pytest.approx(700.0)
    assert s.temp_c == 64.0
    assert (s.sm_clock_mhz, s.mem_clock_mhz) == (1755.0, 2619.0)
    assert (s.vram_used_bytes, s.vram_total_bytes) == (97 * GiB, gpu.vram_total)
    # peak from the MAX memory clock, not the current one
    assert s.peak_bw_gbps == pytest.approx(3201e6 * 2 * 6144 / 8 / 1e9)
    assert s.error is None
    sampler.sample()
    assert nvml.calls["nvmlInit"] == 1


def test_peak_bandwidth_formula_matches_known_cards() -> None:
    assert peak_bandwidth_gbps(10501, 384) == pytest.approx(1008.1, abs=0.1)  # RTX 4090: 1008 GB/s
    assert peak_bandwidth_gbps(6001, 128) == pytest.approx(192.0, abs=0.1)  # GTX 1650 GDDR6
    assert peak_bandwidth_gbps(None, 384) is None
    assert peak_bandwidth_gbps(10501, 0) is None


def test_static_facts_are_read_once_per_device() -> None:
    nvml = FakeNvml([h200(), rtx4090()])
    sampler = GpuSampler(nvml)
    for _ in range(4):
        sampler.sample()
    for fn in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryBusWidth",
               "nvmlDeviceGetMaxClockInfo", "nvmlGpmQueryDeviceSupport"):
        assert nvml.calls[fn] == 2, fn
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 8
    assert nvml.calls["nvmlSystemGetDriverVersion"] == 1


def test_vram_falls_in_steps() -> None:
    nvml = FakeNvml([h200(vram_used=120 * GiB)])
    sampler = GpuSampler(nvml)
    seen = []
    for used in (120 * GiB, 80 * GiB, 30 * GiB, 512 << 20):
        nvml.set_vram_used(0, used)
        seen.append(one(sampler.sample()).vram_used_bytes)
    assert seen == [120 * GiB, 80 * GiB, 30 * GiB, 512 << 20]
    with pytest.raises(ValueError):
        nvml.set_vram_used(0, nvml.gpus[0].vram_total + 1)


# ---- NotSupported / NoPermission / FunctionNotFound ------------------------------------------------


def test_not_supported_and_no_permission_are_none_not_zero() -> None:
    gpu = rtx4090(util_mem=30, not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryBusWidth",
                                              "nvmlDeviceGetComputeRunningProcesses"},
                  no_permission={"nvmlDeviceGetEnforcedPowerLimit"}, compute_procs=[(4242, GiB)],
                  graphics_procs=[(777, None)])
    sampler = GpuSampler(FakeNvml([gpu]))
    s = one(sampler.sample())
    assert s.power_w is None and s.power_limit_w is None
    assert s.peak_bw_gbps is None and s.mem_bw_gbps is None
    # without a peak the controller busy % is still shown, labelled as such
    assert (s.mem_bw_pct, s.mem_bw_source) == (30.0, "util.memory x peak")
    assert [p.pid for p in s.processes] == [777]
    assert s.temp_c == 31.0 and s.util_gpu_pct == 0.0  # the rest still answers


def test_utilisation_not_supported_leaves_bandwidth_unknown() -> None:
    gpu = rtx4090(not_supported={"nvmlDeviceGetUtilizationRates"})
    s = one(GpuSampler(FakeNvml([gpu])).sample())
    assert s.util_gpu_pct is None and s.util_mem_pct is None
    assert s.mem_bw_pct is None and s.mem_bw_gbps is None and s.mem_bw_source is None


def test_old_driver_falls_back_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    old = {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"}
    nvml = FakeNvml([rtx4090(temp_c=55, clock_event_mask=pynvml.nvmlClocksThrottleReasonSwPowerCap)],
                    missing_functions=old)
    sampler = GpuSampler(nvml)
    with caplog.at_level(logging.WARNING, logger="tui.sources.gpu"):
        for _ in range(3):
            s = one(sampler.sample())
            assert s.temp_c == 55.0
            assert s.clock_event_mask == 0x004 and s.throttle_reasons == ("power cap",) and s.throttled
    for fn in old:
        assert nvml.calls[fn] == 1, fn  # remembered as missing, never called again
        assert sum(fn in r.getMessage() for r in caplog.records) == 1
    assert nvml.calls["nvmlDeviceGetTemperature"] == 3
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_very_old_driver_without_any_reason_call() -> None:
    nvml = FakeNvml([rtx4090()], missing_functions={"nvmlDeviceGetCurrentClocksEventReasons",
                                                     "nvmlDeviceGetCurrentClocksThrottleReasons"})
    s = one(GpuSampler(nvml).sample())
    assert s.clock_event_mask is None and s.throttle_reasons == () and s.throttled is False


def test_event_reasons_not_supported_does_not_fall_back() -> None:
    gpu = rtx4090(not_supported={"nvmlDeviceGetCurrentClocksEventReasons"})
    nvml = FakeNvml([gpu])
    s = one(GpuSampler(nvml).sample())
    assert s.clock_event_mask is None
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0


# ---- throttle reasons -----------------------------------------------------------------------------


def test_throttle_reason_switching_on() -> None:
    nvml = FakeNvml([h200()])
    sampler = GpuSampler(nvml)
    s = one(sampler.sample())
    assert s.throttle_reasons == ("idle",) and not s.throttled
    power_cap_and_hw = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
    nvml.set_clock_event_mask(0, power_cap_and_hw)
    s = one(sampler.sample())
    assert s.throttle_reasons == ("power cap", "HW slowdown") and s.throttled
    nvml.set_clock_event_mask(0, pynvml.nvmlClocksEventReasonApplicationsClocksSetting)
    s = one(sampler.sample())
    assert s.throttle_reasons == ("applications clocks setting",) and not s.throttled
    nvml.set_clock_event_mask(0, 0)
    s = one(sampler.sample())
    assert s.clock_event_mask == 0 and s.throttle_reasons == () and not s.throttled


def test_unknown_reason_bits_are_shown_not_dropped() -> None:
    assert throttle_words(pynvml.nvmlClocksThrottleReasonBoardLimit | 0x020) == (
        "thermal slowdown (SW)", "other reason bits 0x200")


# ---- GPU lost --------------------------------------------------------------------------------------


def test_gpu_lost_mid_run_others_continue() -> None:
    nvml = FakeNvml([rtx4090(), h200(util_gpu=50)])
    sampler = GpuSampler(nvml)
    assert one(sampler.sample(), 1).error is None
    nvml.lose_gpu(0)
    report = sampler.sample()
    lost, fine = report.gpus
    assert lost.error == "GPU lost (NVML: GPU is lost)"
    assert lost.name == "NVIDIA GeForce RTX 4090"  # static facts read before the loss remain
    assert lost.util_gpu_pct is None and lost.vram_used_bytes is None and lost.processes == ()
    assert fine.error is None and fine.util_gpu_pct == 50.0
    assert report.unavailable is None
    # stays an error (GetHandleByIndex now raises GpuIsLost too) and comes back after a reset
    assert sampler.sample().gpus[0].error == "GPU lost (NVML: GPU is lost)"
    nvml.gpus[0].lost = False
    assert one(sampler.sample()).error is None


def test_gpu_lost_from_the_start() -> None:
    nvml = FakeNvml([h200()])
    nvml.lose_gpu(0)
    s = GpuSampler(nvml).sample().gpus[0]
    assert s.error == "GPU lost (NVML: GPU is lost)" and s.name is None


def test_unexpected_exception_becomes_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([rtx4090(), h200()])

    def broken(handle):
        raise RuntimeError("binding bug")

    monkeypatch.setattr(nvml, "nvmlDeviceGetPowerUsage", broken)
    report = GpuSampler(nvml).sample()
    assert [g.error for g in report.gpus] == ["GPU sampling failed (RuntimeError: binding bug)"] * 2


# ---- memory bandwidth: GPM and util.memory -------------------------------------------------------------


def test_gpm_dram_bandwidth_between_samples_without_leaks() -> None:
    nvml = FakeNvml([h200(util_mem=20)])
    sampler = GpuSampler(nvml)
    peak = 3201e6 * 2 * 6144 / 8 / 1e9
    nvml.gpus[0].dram_bw_util_pct = 37.5
    first = one(sampler.sample())  # baseline only: falls back to util.memory
    assert first.mem_bw_source == "util.memory x peak"
    assert first.mem_bw_pct == 20.0 and first.mem_bw_gbps == pytest.approx(0.20 * peak)
    assert nvml.live_gpm_samples() == 1
    nvml.gpus[0].dram_bw_util_pct = 62.0
    s = one(sampler.sample())
    assert s.mem_bw_source == "gpm"
    assert s.mem_bw_pct == pytest.approx(62.0)  # the interval ending now, not the previous one
    assert s.mem_bw_gbps == pytest.approx(0.62 * peak)
    assert s.util_mem_pct == 20.0
    nvml.gpus[0].dram_bw_util_pct = 5.0
    assert one(sampler.sample()).mem_bw_pct == pytest.approx(5.0)
    assert nvml.live_gpm_samples() == 1  # the previous sample is freed each time
    assert nvml.calls["nvmlGpmSampleAlloc"] == nvml.calls["nvmlGpmSampleFree"] + 1
    sampler.close()
    assert nvml.live_gpm_samples() == 0
    assert nvml.initialized is False


def test_no_gpm_on_a_consumer_card() -> None:
    nvml = FakeNvml([rtx4090(util_mem=50)])
    sampler = GpuSampler(nvml)
    for _ in range(2):
        s = one(sampler.sample())
        assert s.mem_bw_source == "util.memory x peak"
        assert s.mem_bw_gbps == pytest.approx(0.5 * 10501e6 * 2 * 384 / 8 / 1e9)
    assert nvml.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_sample_not_supported_later_stops_gpm() -> None:
    nvml = FakeNvml([h200(util_mem=10, not_supported={"nvmlGpmSampleGet"})])  # e.g. MIG mode
    sampler = GpuSampler(nvml)
    for _ in range(3):
        assert one(sampler.sample()).mem_bw_source == "util.memory x peak"
    assert nvml.calls["nvmlGpmSampleGet"] == 1
    assert nvml.live_gpm_samples() == 0


def test_gpm_metric_failing_falls_back_for_that_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([h200(util_mem=10, dram_bw_util_pct=70.0)])
    sampler = GpuSampler(nvml)
    sampler.sample()
    real_get = nvml.nvmlGpmMetricsGet

    def per_metric_failure(mg):
        real_get(mg)
        mg.metrics[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return mg

    monkeypatch.setattr(nvml, "nvmlGpmMetricsGet", per_metric_failure)
    s = one(sampler.sample())
    assert (s.mem_bw_source, s.mem_bw_pct) == ("util.memory x peak", 10.0)
    monkeypatch.setattr(nvml, "nvmlGpmMetricsGet", real_get)
    assert one(sampler.sample()).mem_bw_source == "gpm"
    assert nvml.live_gpm_samples() == 1


def test_gpm_samples_freed_when_the_gpu_is_lost() -> None:
    nvml = FakeNvml([h200()])
    sampler = GpuSampler(nvml)
    sampler.sample()
    sampler.sample()
    assert nvml.live_gpm_samples() == 1
    nvml.lose_gpu(0)
    assert sampler.sample().gpus[0].error == "GPU lost (NVML: GPU is lost)"
    assert nvml.live_gpm_samples() == 0


# ---- processes -------------------------------------------------------------------------------------


def test_processes_mapped_to_engines() -> None:
    gpu = h200(compute_procs=[(100, 40 * GiB), (201, 2 * GiB), (300, GiB)],
               graphics_procs=[(201, None), (999, None)])
    sampler = GpuSampler(FakeNvml([gpu]))
    s = one(sampler.sample({"vllm": {100, 101}, "llama": {200, 201}}))
    by_pid = {p.pid: p for p in s.processes}
    assert len(s.processes) == 4 and set(by_pid) == {100, 201, 300, 999}
    assert (by_pid[100].used_bytes, by_pid[100].engine) == (40 * GiB, "vllm")
    assert (by_pid[201].used_bytes, by_pid[201].engine) == (2 * GiB, "llama")  # known size wins
    assert (by_pid[300].engine, by_pid[999].used_bytes, by_pid[999].engine) == (None, None, None)
    unmapped = one(sampler.sample())
    assert all(p.engine is None for p in unmapped.processes)


def test_fake_process_objects_are_shaped_like_pynvml() -> None:
    nvml = FakeNvml([h200(compute_procs=[(5, None), (6, 123)])])
    nvml.nvmlInit()
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(0))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(5, None), (6, 123)]
    assert isinstance(procs[0], pynvml.nvmlFriendlyObject)
    assert {"gpuInstanceId", "computeInstanceId"} <= set(vars(procs[0]))


def test_fake_refuses_calls_before_init_and_unfaked_functions() -> None:
    nvml = FakeNvml([h200()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(AttributeError):
        nvml.nvmlDeviceGetFanSpeed  # noqa: B018
    assert nvml.NVML_CLOCK_MEM == pynvml.NVML_CLOCK_MEM


def test_a_gpu_without_a_handle_says_why() -> None:
    nvml = FakeNvml([h200(), rtx4090()])
    real = nvml.nvmlDeviceGetHandleByIndex

    def no_permission_for_first(index: int):
        if index == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return real(index)

    nvml.nvmlDeviceGetHandleByIndex = no_permission_for_first
    first, second = GpuSampler(nvml).sample().gpus
    assert first.error == "no handle for this GPU (NVML: Insufficient Permissions)"
    assert second.error is None and second.name == "NVIDIA GeForce RTX 4090"


def test_polling_drain_and_close_at_once_never_overlap_nvml_calls_or_free_twice() -> None:
    """The dashboard's polling loop and a switch's drain thread share one sampler, and the app closes it on
    exit. Each sample frees the previous GPM sample: unserialised, two threads free or use the same one
    (a double free on a real driver), and init runs twice. The fake records every call made while another
    thread is inside NVML, and every freed sample used again."""
    nvml = FakeNvml([h200(dram_bw_util_pct=40.0), h200(uuid="GPU-second", dram_bw_util_pct=40.0)])
    nvml.call_delay_s = 0.0002  # each NVML call takes a moment, as a real one does: room for a race
    sampler = GpuSampler(nvml)
    reports = []
    errors: list[BaseException] = []
    together = threading.Barrier(3)

    def run(work) -> None:
        try:
            together.wait(timeout=10)
            work()
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    def poll() -> None:
        for _ in range(40):
            reports.append(sampler.sample())

    def close_now_and_then() -> None:
        for _ in range(5):
            time.sleep(0.01)
            sampler.close()  # the next sample initialises NVML again

    threads = [threading.Thread(target=run, args=(w,)) for w in (poll, poll, close_now_and_then)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    sampler.close()
    assert not errors and len(reports) == 80
    assert nvml.misuse == []
    assert nvml.live_gpm_samples() == 0  # every GPM sample freed exactly once
    assert all(r.unavailable is None and len(r.gpus) == 2 for r in reports)
