"""tui.run: the one function that builds a run's sources, and the one from a profile to its target."""

from __future__ import annotations

from pathlib import Path

from fake_pynvml import FakeNvml, h200

from tui.fleet.options import FleetOptions
from tui.lifecycle.profile_files import load_profiles
from tui.model.samples import GpuReport
from tui.model.targets import EngineTarget
from tui.run.sources import RunOptions, build_sources
from tui.run.targets import profile_target
from tui.sources.gpu import GpuSampler

TARGET = EngineTarget("llama", "http://127.0.0.1:1")


def _build(options: RunOptions):
    return build_sources(options, gpu_sampler=lambda: GpuSampler(FakeNvml([h200()])))


async def test_nvml_reads_the_gpus_unless_dcgm_exporters_do() -> None:
    alone = _build(RunOptions(watched=[TARGET]))
    dcgm = _build(RunOptions(watched=[TARGET], fleet=FleetOptions(dcgm=["http://127.0.0.1:9/metrics"])))
    both = _build(RunOptions(watched=[TARGET], fleet=FleetOptions(dcgm=["http://127.0.0.1:9/metrics"]),
                             nvml=True))
    try:
        assert alone.gpu is not None and alone.machine is not None and alone.machine.gpu is alone.gpu
        assert dcgm.gpu is None and dcgm.machine is not None and dcgm.machine.gpu is None
        assert dcgm.fleet is not None and dcgm.fleet.gpus is not None
        # what each run reads: exactly one source writes GPU reports
        assert len([s for s in alone.all() if getattr(s, "gpu", None) is not None]) == 1
        assert len([s for s in dcgm.all() if getattr(s, "gpu", None) is not None]) == 0
        assert dcgm.fleet.gpus in dcgm.all()
        assert both.gpu is not None
        # the machine source of a --dcgm run makes host samples only
        samples = await dcgm.machine.read()
        assert samples and not [s for s in samples if isinstance(s, GpuReport)]
    finally:
        for run in (alone, dcgm, both):
            await run.aclose()


async def test_engines_come_in_order_watched_then_launched() -> None:
    launched = EngineTarget("p", "http://127.0.0.1:2")
    run = _build(RunOptions(watched=[TARGET], launched=[launched], poll_interval_s=0.5, poll_timeout_s=3.0))
    try:
        assert [(e.target, e.launched_by_us) for e in run.engines] == [(TARGET, False), (launched, True)]
        assert all(e.interval_s == 0.5 and e.timeout_s == 3.0 for e in run.engines)
    finally:
        await run.aclose()


async def test_the_fleet_table_reads_no_machine() -> None:
    run = _build(RunOptions(fleet=FleetOptions(prometheus="http://127.0.0.1:9"), machine=False))
    try:
        assert run.machine is None and run.gpu is None and run.host is None
    finally:
        await run.aclose()


def test_a_profiles_target_carries_its_key_and_paths(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "config"
    (config / "enginetop" / "profiles").mkdir(parents=True)
    (tmp_path / "key").write_text("sk-profile-target\n")
    text = (Path(__file__).parent.parent / "profiles" / "demo-cpu-threads1.toml").read_text()
    text = text.replace('name = "demo-cpu-threads1"',
                        f'name = "keyed"\napi_key_file = "{tmp_path / "key"}"\nhealth_path = "/ready"')
    (config / "enginetop" / "profiles" / "keyed.toml").write_text(text)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("ENGINETOP_LLAMA_SERVER", "/bin/true")
    monkeypatch.setenv("ENGINETOP_DEMO_MODEL", "/dev/null")
    target = profile_target(load_profiles().get("keyed"))
    assert target.api_key == "sk-profile-target" and target.health_path == "/ready"
    assert target.url == "http://127.0.0.1:8090" and "sk-profile" not in repr(target)
