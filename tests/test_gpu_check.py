"""scripts/gpu_check.py against the scripted NVML and a fake `nvidia-smi` that prints the real CSV format
(`--format=csv,noheader,nounits`: MiB, W with two decimals, the reasons mask as 0x%016x, [N/A]), and
refuses clocks_event_reasons.* like a pre-535 driver when asked to."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest
from fake_pynvml import FakeGpu, FakeNvml, h200, rtx4090

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20

FAKE_SMI = """\
import json, os, sys
query = next(a for a in sys.argv[1:] if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
assert "--format=csv,noheader,nounits" in sys.argv, sys.argv
if os.environ.get("FAKE_SMI_OLD") and "clocks_event_reasons.active" in query:
    print('Field "clocks_event_reasons.active" is not a valid field to query.')
    print("Run 'nvidia-smi --help-query-gpu' for usage.")
    sys.exit(2)
for row in json.loads(os.environ["FAKE_SMI_ROWS"]):
    print(", ".join(row.get(field.replace("throttle", "event"), "[N/A]") for field in query))
"""


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def table(out: str, index: int) -> dict[str, list[str]]:
    """GPU `index`'s rows: label -> the words after it (panel, nvidia-smi, diff, verdict...)."""
    section = out.split(f"\nGPU {index}: ", 1)[1].split("\nGPU ", 1)[0]
    rows = {}
    for line in section.splitlines()[2:]:
        label, _, rest = line.strip().partition("  ")
        rows[label] = rest.split()
    return rows


def smi_row(index: int, gpu: FakeGpu, **changes: str) -> dict[str, str]:
    """What the real nvidia-smi prints for this GPU (nounits)."""
    row = {
        "index": str(index), "uuid": gpu.uuid, "name": gpu.name,
        "utilization.gpu": str(gpu.util_gpu), "utilization.memory": str(gpu.util_mem),
        "memory.used": str(gpu.vram_used // MIB - 310),  # newer drivers leave the reserve out
        "memory.total": str(gpu.vram_total // MIB), "power.draw": f"{gpu.power_mw / 1000 + 1.3:.2f}",
        "enforced.power.limit": f"{gpu.power_limit_mw / 1000:.2f}", "temperature.gpu": str(gpu.temp_c),
        "clocks.sm": str(gpu.sm_clock_mhz), "clocks.mem": str(gpu.mem_clock_mhz or gpu.max_mem_clock_mhz),
        "clocks_event_reasons.active": f"0x{gpu.clock_event_mask:016x}",
    }
    row.update(changes)
    return row


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!{sys.executable}\n{FAKE_SMI}")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")

    def rows(*values: dict[str, str], old_driver: bool = False) -> None:
        monkeypatch.setenv("FAKE_SMI_ROWS", json.dumps(values))
        if old_driver:
            monkeypatch.setenv("FAKE_SMI_OLD", "1")

    return rows


def busy_gpus() -> list[FakeGpu]:
    return [
        h200(util_gpu=87, util_mem=61, vram_used=96 << 30, power_mw=612_000, temp_c=58, sm_clock_mhz=1980,
             clock_event_mask=0x0, dram_bw_util_pct=72.5),
        rtx4090(util_gpu=3, temp_c=35),
    ]


def test_everything_agrees_side_by_side(fake_smi, capsys: pytest.CaptureFixture[str]) -> None:
    gpus = busy_gpus()
    fake_smi(smi_row(0, gpus[0]), smi_row(1, gpus[1]))
    nvml = FakeNvml(gpus, energy_clock=time.monotonic)
    status = load_script().main(["--interval", "0.05", "--energy-seconds", "0.6"], nvml=nvml)
    out = capsys.readouterr().out
    print(out)
    assert status == 0
    assert nvml.live_gpm_samples() == 0 and nvml.misuse == [] and not nvml.initialized  # left clean
    assert "GPU 0: NVIDIA H200 (GPU-5c4a1f3e" in out and "GPU 1: NVIDIA GeForce RTX 4090" in out
    h200_rows = table(out, 0)
    assert h200_rows["temperature.gpu [C]"] == ["58.0", "58.0", "0.0", "ok"]
    assert h200_rows["memory.used [MiB]"] == ["98304.0", "97994.0", "310.0", "ok"]  # the driver's reserve
    assert h200_rows["power.draw [W]"] == ["612.0", "613.3", "1.3", "ok"]
    assert h200_rows["clocks_event_reasons.active (mask)"] == ["0x0", "0x0", "ok"]
    # the panel's GPM bandwidth beside an independent GPM reading over the same interval
    assert h200_rows["GPM DRAM bandwidth [% of peak]"][:4] == ["72.5", "72.5", "0.0", "ok"]
    rtx_rows = table(out, 1)
    assert rtx_rows["clocks_event_reasons.active (mask)"] == ["0x1", "0x1", "ok"]
    assert "not available on this GPU; the panel shows" in out  # the RTX 4090 has no GPM
    assert out.rstrip().endswith("2 GPU(s): everything agrees within tolerance")


def test_disagreements_are_flagged_with_an_old_driver(fake_smi, capsys: pytest.CaptureFixture[str]) -> None:
    """Temperature 12 C off and a power-cap bit only nvidia-smi sees: both flagged; the driver knows only
    clocks_throttle_reasons.active, which is used instead."""
    gpus = busy_gpus()
    fake_smi(smi_row(0, gpus[0], **{"temperature.gpu": "70", "clocks_event_reasons.active": f"0x{0x4:016x}"}),
             smi_row(1, gpus[1]), old_driver=True)
    status = load_script().main(["--interval", "0.05", "--energy-seconds", "0.3"],
                                nvml=FakeNvml(gpus, energy_clock=time.monotonic))
    out = capsys.readouterr().out
    print(out)
    assert status == 1
    rows = table(out, 0)
    assert rows["temperature.gpu [C]"] == ["58.0", "70.0", "12.0", "DISAGREE"]
    assert rows["clocks_throttle_reasons.active (mask)"] == ["0x0", "0x4", "DISAGREE"]
    assert rows["utilization.gpu [%]"][-1] == "ok"
    assert "2 GPU(s): 2 disagreement(s)" in out


def test_without_nvidia_smi_it_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert load_script().main([], nvml=FakeNvml([h200()])) == 2
    assert "nvidia-smi not found on PATH" in capsys.readouterr().err


def test_on_amd_and_intel_it_prints_what_the_panel_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """No nvidia-smi, an amdgpu and an xe card in a sysfs tree (ENGINETOP_SYSFS_ROOT), the xe card's energy
    counter advancing at 95 W: each card's figures are printed, the xe counter beside power x time; exit 0."""
    from sysfs_tree import Ticker, amd_card, intel_xe_card

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("ENGINETOP_SYSFS_ROOT", str(tmp_path / "sys"))
    amd_card(tmp_path / "sys", 0, throttle=1 << 35)
    xe = intel_xe_card(tmp_path / "sys", 1)
    with Ticker([(xe["energy"], 95e6), (xe["idle"], 400.0)]):
        status = load_script().main(["--energy-seconds", "0.8"])
    out = capsys.readouterr().out
    print(out)
    assert status == 0
    assert "GPU 0: AMD AMD Radeon RX 7900 XTX (amdgpu, 0000:03:00.0): no nvidia-smi" in out
    assert "GPU 1: Intel Intel GPU 0xe20b (xe, 0000:05:00.0)" in out
    amd, xe_rows = table(out, 0), table(out, 1)
    assert amd["power [W]"] == ["250.0"] and amd["throttling"] == ["thermal", "(edge)"]
    assert "(no energy counter; over" in " ".join(amd["energy over the check [J]"])
    counter = float(xe_rows["energy over the check [J]"][0])
    assert counter == pytest.approx(95 * 0.8, rel=0.25)
    assert "the counter's change, so nothing independent" in " ".join(xe_rows["energy over the check [J]"])
    xe_util = out.split("\nGPU 1: ", 1)[1].split("utilization [%]", 1)[1].split()[0]
    assert float(xe_util) == pytest.approx(60.0, abs=15)  # idle 400 ms a second
