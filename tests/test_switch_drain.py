"""The drain step of a safe switch against a scripted NVML (tests/fake_pynvml.py, read through the real
GpuSampler): the next engine starts only once VRAM is below the threshold and no old PID holds the GPU.

The old engine is a real process with a real listening port (python -m http.server); the target is the
real llama-server demo profile, so "never started" and "started" are checked on the real port.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_pynvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeNvml, h200, rtx4090

from tui.base.process import free_port, port_open, stop_group
from tui.lifecycle import drain as switch_mod
from tui.lifecycle.drain import cuda_visible_indices
from tui.lifecycle.engine import EngineInstance, launch_instance
from tui.lifecycle.profile_files import load_profiles
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import GIB, Profile
from tui.lifecycle.switch import EngineManager
from tui.model.samples import GpuReport
from tui.model.status import StepEvent
from tui.sources.gpu import GpuSampler

DEMO = """\
name = "{name}"
engine = "llama.cpp"
argv = ["${{ENGINETOP_LLAMA_SERVER}}", "--model", "${{ENGINETOP_DEMO_MODEL}}", "--host", "127.0.0.1",
        "--port", "${{PORT}}", "--metrics", "--ctx-size", "2048", "--threads", "1"]
port = {port}
start_timeout_s = 120
stop_timeout_s = 10
drain_timeout_s = {drain}
vram_threshold_gib = 4
"""


def demo_profile(tmp_path: Path, name: str, drain: float = 30) -> Profile:
    path = tmp_path / f"{name}.toml"
    path.write_text(DEMO.format(name=name, port=free_port(), drain=drain), encoding="utf-8")
    loaded = load_profiles([tmp_path])
    assert not [i for i in loaded.issues if i.path == path], loaded.issues
    return loaded.get(name)


@pytest.fixture
def old_engine(tmp_path: Path) -> Iterator[EngineInstance]:
    """A real process on a real port, standing in for the engine being switched away from."""
    port = free_port()
    profile = Profile(
        name="old-engine",
        engine="other",
        port=port,
        path=tmp_path / "old.toml",
        argv=(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"),
    )
    instance = launch_instance(resolve(profile), log_dir=tmp_path)
    deadline = time.monotonic() + 15
    while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert port_open("127.0.0.1", port), instance.log_tail()
    yield instance
    if instance.alive():
        stop_group(instance.launched)


class ScriptedGpu:
    """The real GpuSampler over FakeNvml; each sample applies the next (VRAM GiB, old PID on GPU?) stage."""

    def __init__(self, old_pid: int, stages: list[tuple[float, bool]]) -> None:
        self.nvml = FakeNvml([h200()])
        self.sampler = GpuSampler(self.nvml)
        self.old_pid = old_pid
        self.stages = stages
        self.reports: list[GpuReport] = []
        self.log: list[tuple[str, object]] = []  # samples and step events, interleaved in time order

    def __call__(self) -> GpuReport:
        gib, holds = self.stages[min(len(self.reports), len(self.stages) - 1)]
        self.nvml.set_vram_used(0, int(gib * GIB))
        self.nvml.gpus[0].compute_procs = [(self.old_pid, int(gib * GIB))] if holds else []
        report = self.sampler.sample()
        self.reports.append(report)
        self.log.append(("sample", gib))
        return report

    def on_step(self, event: StepEvent) -> None:
        self.log.append(("step", event))


@pytest.fixture
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(switch_mod, "DRAIN_POLL_S", 0.05)


@pytest.mark.engine  # resolves the demo profile: the real llama-server
def test_vram_that_stays_high_never_starts_the_next_engine(
    tmp_path: Path, old_engine: EngineInstance, fast_poll: None
) -> None:
    target = demo_profile(tmp_path, "target-never", drain=1.5)
    gpu = ScriptedGpu(old_engine.pid, [(20.0, False)])
    manager = EngineManager(gpu=gpu, log_dir=tmp_path, record_state=False)
    manager.adopt(old_engine)
    result = manager.switch(target, on_step=gpu.on_step)

    assert not result.ok and result.failed_step == "drain"
    assert result.message.startswith("step 'drain' timed out after 2 s")
    assert "GPU 0: VRAM used 20.0 GiB (threshold 4 GiB)" in result.message
    assert [s.name for s in result.steps] == ["resolve", "stop", "drain"]
    assert not old_engine.alive()  # the stop itself succeeded
    assert not port_open("127.0.0.1", target.port)  # nothing was started
    assert not list(tmp_path.glob("target-never-*.log"))
    assert len(gpu.reports) >= 10  # it kept polling until the timeout
    assert manager.poll_status().state == "idle"


@pytest.mark.engine  # resolves the demo profile: the real llama-server
def test_vram_falling_in_steps_starts_only_once_drained(
    tmp_path: Path, old_engine: EngineInstance, fast_poll: None
) -> None:
    target = demo_profile(tmp_path, "target-drained")
    # 30 -> 20 -> 10 GiB, then 3 GiB while an old PID still holds the GPU, then 3 GiB and released.
    stages = [(30.0, True), (20.0, True), (10.0, True), (3.0, True), (3.0, False)]
    gpu = ScriptedGpu(old_engine.pid, stages)
    manager = EngineManager(gpu=gpu, log_dir=tmp_path, record_state=False)
    manager.adopt(old_engine)
    result = manager.switch(target, on_step=gpu.on_step)
    try:
        assert result.ok, result.message
        assert [s.name for s in result.steps] == ["resolve", "stop", "drain", "port", "start", "ready"]
        samples_before_start = []
        for kind, item in gpu.log:
            if kind == "sample":
                samples_before_start.append(item)
            elif item.name == "start":
                break
        assert samples_before_start == [30.0, 20.0, 10.0, 3.0, 3.0]  # no start before the last stage
        waits = [e.message for k, e in gpu.log if k == "step" and e.name == "drain" and e.status == "running"]
        assert f"old engine PIDs {old_engine.pid} still hold GPU memory" in waits[-1]
        assert "VRAM used 10.0 GiB" in waits[-2]
        assert "GPU 0 VRAM used 3.0 GiB" in result.steps[2].message
        assert httpx.get(f"{target.url}/health", timeout=5).status_code == 200  # it really runs
    finally:
        assert manager.stop().ok


@pytest.mark.engine  # resolves the demo profile: the real llama-server
def test_cancel_during_drain_starts_nothing(
    tmp_path: Path, old_engine: EngineInstance, fast_poll: None
) -> None:
    target = demo_profile(tmp_path, "target-cancelled", drain=60)
    gpu = ScriptedGpu(old_engine.pid, [(20.0, True)])
    manager = EngineManager(gpu=gpu, log_dir=tmp_path, record_state=False)
    manager.adopt(old_engine)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    began = time.monotonic()
    result = manager.switch(target, cancel=cancel)
    assert time.monotonic() - began < 10
    assert not result.ok and result.failed_step == "drain"
    assert result.steps[-1].status == "cancelled" and "cancelled during step 'drain'" in result.message
    assert not port_open("127.0.0.1", target.port)


def test_without_a_gpu_the_drain_checks_processes_and_port(
    tmp_path: Path, old_engine: EngineInstance, llama_server
) -> None:
    """NVML unavailable (no driver): the drain is processes gone + port closed; the target here attaches to
    the shared real llama-server, so nothing is launched and readiness is checked over real HTTP."""
    attach = tmp_path / "attach.toml"
    attach.write_text(
        f'name = "attached"\nengine = "llama.cpp"\nport = {llama_server.port}\n', encoding="utf-8"
    )
    target = load_profiles([tmp_path]).get("attached")
    sampler = GpuSampler(FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    manager = EngineManager(gpu=sampler.sample, log_dir=tmp_path, record_state=False)
    manager.adopt(old_engine)
    result = manager.switch(target)
    assert result.ok, result.message
    drain = result.steps[2]
    assert drain.name == "drain" and drain.status == "ok"
    assert "old processes gone, old port closed; no GPU (" in drain.message
    assert [s.status for s in result.steps] == ["ok", "ok", "ok", "skipped", "skipped", "ok"]
    status = manager.poll_status()
    assert status.state == "ready" and status.attached and status.url == llama_server.url
    stop = manager.stop()  # an attached server is never stopped by enginetop
    assert stop.ok and stop.steps[0].status == "skipped" and llama_server.launched.alive()


# ---------------------------------------------------------------- only the GPUs that matter (item 17)


@pytest.fixture
def other_engine() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not the old engine: another engine's process on the same machine."""
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


class StagedGpus:
    """The real GpuSampler over FakeNvml; `stage(n, nvml)` scripts the n-th sample (0-based) first."""

    def __init__(self, gpus: list, stage) -> None:
        self.nvml = FakeNvml(gpus)
        self.sampler = GpuSampler(self.nvml)
        self.stage = stage
        self.count = 0

    def __call__(self) -> GpuReport:
        self.stage(self.count, self.nvml)
        self.count += 1
        return self.sampler.sample()


def demo_with_env(tmp_path: Path, name: str, env: str = "", drain: float = 3) -> Profile:
    path = tmp_path / f"{name}.toml"
    text = DEMO.format(name=name, port=free_port(), drain=drain) + (f"\n[env]\n{env}\n" if env else "")
    path.write_text(text, encoding="utf-8")
    return load_profiles([tmp_path]).get(name)


def switch_with(tmp_path: Path, old: EngineInstance, target: Profile, gpu: StagedGpus):
    manager = EngineManager(gpu=gpu, log_dir=tmp_path, record_state=False)
    manager.adopt(old)
    return manager, manager.switch(target)


@pytest.mark.engine  # resolves the demo profile: the real llama-server
def test_another_engine_on_a_second_gpu_does_not_block_the_switch(
    tmp_path: Path, old_engine: EngineInstance, other_engine: subprocess.Popen[bytes], fast_poll: None
) -> None:
    """Old engine on GPU 0 (seen there before the stop), another engine holding 20 GiB on GPU 1: only
    GPU 0 is waited on. Before: every GPU had to fall under the threshold, so this never switched."""

    def stage(n: int, nvml: FakeNvml) -> None:
        held = n == 0  # the sample taken before the stop sees the old engine on GPU 0
        nvml.set_vram_used(0, int((30 if held else 1) * GIB))
        nvml.gpus[0].compute_procs = [(old_engine.pid, 29 * GIB)] if held else []
        nvml.set_vram_used(1, 20 * GIB)
        nvml.gpus[1].compute_procs = [(other_engine.pid, 20 * GIB)]

    target = demo_with_env(tmp_path, "target-gpu0")
    gpus = StagedGpus([h200(), h200(uuid="GPU-b")], stage)
    manager, result = switch_with(tmp_path, old_engine, target, gpus)
    try:
        assert result.ok, result.message
        drain = result.steps[2].message
        assert "GPU 0 VRAM used 1.0 GiB" in drain
        assert "GPU 1 not waited on (neither the old engine's nor the new one's)" in drain
    finally:
        assert manager.stop().ok


@pytest.mark.engine  # resolves the demo profile: the real llama-server
def test_another_engines_memory_on_the_same_gpu_is_not_counted(
    tmp_path: Path, old_engine: EngineInstance, other_engine: subprocess.Popen[bytes], fast_poll: None
) -> None:
    """One GPU, shared: 20 GiB stay in use after the old engine left, all of it held by another live
    process. The old engine's memory is gone, so the switch goes on, and says what it did not count."""

    def stage(n: int, nvml: FakeNvml) -> None:
        held = n == 0
        nvml.set_vram_used(0, int((50 if held else 20.5) * GIB))
        old = [(old_engine.pid, 30 * GIB)] if held else []
        nvml.gpus[0].compute_procs = [(other_engine.pid, 20 * GIB), *old]

    target = demo_with_env(tmp_path, "target-shared")
    manager, result = switch_with(tmp_path, old_engine, target, StagedGpus([h200()], stage))
    try:
        assert result.ok, result.message
        assert (
            f"GPU 0 VRAM used 20.5 GiB, 20.0 GiB of it held by other processes (PIDs {other_engine.pid}), "
            "not counted" in result.steps[2].message
        )
    finally:
        assert manager.stop().ok


@pytest.mark.engine  # resolves the demo profile: the real llama-server
@pytest.mark.parametrize("visible", ["1", "GPU-b", ""])
def test_cuda_visible_devices_of_the_new_profile_picks_the_gpus(
    tmp_path: Path, old_engine: EngineInstance, fast_poll: None, visible: str
) -> None:
    """GPU 0 holds 20 GiB nobody is listed for (another container's, say) and the old engine was never
    seen on a GPU: a target on GPU 1 (by index or UUID prefix) or on none starts; without
    CUDA_VISIBLE_DEVICES every GPU is waited on, and GPU 0 blocks."""

    def stage(n: int, nvml: FakeNvml) -> None:
        nvml.set_vram_used(0, 20 * GIB)
        nvml.set_vram_used(1, 1 * GIB)

    gpus = [h200(uuid="GPU-a0000000"), h200(uuid="GPU-b0000000")]
    target = demo_with_env(tmp_path, "target-visible", env=f'CUDA_VISIBLE_DEVICES = "{visible}"')
    manager, result = switch_with(tmp_path, old_engine, target, StagedGpus(gpus, stage))
    try:
        assert result.ok, result.message
        assert "GPU 0 not waited on" in result.steps[2].message
    finally:
        assert manager.stop().ok
    blocked = demo_with_env(tmp_path, "target-anywhere", drain=1)
    manager, result = switch_with(tmp_path, launch_old(tmp_path), blocked, StagedGpus(gpus, stage))
    assert not result.ok and result.failed_step == "drain" and "GPU 0: VRAM used 20.0 GiB" in result.message
    assert manager.stop().ok


def launch_old(tmp_path: Path) -> EngineInstance:
    port = free_port()
    profile = Profile(name="old-again", engine="other", port=port, path=tmp_path / "old2.toml",
                      argv=(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"))
    instance = launch_instance(resolve(profile), log_dir=tmp_path)
    deadline = time.monotonic() + 15
    while not port_open("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return instance


def test_cuda_visible_indices() -> None:
    same = FakeNvml([h200(uuid="GPU-aa11"), h200(uuid="GPU-bb22")])
    report = GpuSampler(same).sample()
    assert cuda_visible_indices("1", report.gpus) == {1}
    assert cuda_visible_indices("0,1", report.gpus) == {0, 1}
    assert cuda_visible_indices("GPU-bb", report.gpus) == {1}
    assert cuda_visible_indices("bb22", report.gpus) == {1}
    assert cuda_visible_indices("", report.gpus) == set()
    assert cuda_visible_indices("-1", report.gpus) == set()
    assert cuda_visible_indices("1,7,0", report.gpus) == {1}  # CUDA stops at the first invalid entry
    assert cuda_visible_indices("MIG-1234", report.gpus) is None
    mixed = GpuSampler(FakeNvml([h200(), rtx4090()])).sample()
    assert cuda_visible_indices("1", mixed.gpus) is None  # CUDA's fastest-first order may not be NVML's
    assert cuda_visible_indices(mixed.gpus[1].uuid, mixed.gpus) == {1}
