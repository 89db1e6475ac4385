"""Real llama-server runs of `enginetop ab` and `enginetop sweep-param` (the CPU demo profiles), the report
rendered in headless Chromium with the network off. Economical: 2 cores, few and short requests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.test_report import render_in_chromium

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


def enginetop(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_ab_demo_profiles_2x2_and_report_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    html = tmp_path / "report.html"
    run = enginetop(
        "ab",
        "demo-cpu-threads1",
        "demo-cpu-threads2",
        "--instances",
        "2",
        "--blocks",
        "2",
        "--requests",
        "2",
        "--max-tokens",
        "24",
        "--warmup",
        "1",
        "--bandwidth",
        "20GB/s",
        "-o",
        str(out),
        "--report",
        str(html),
        "--json",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result == json.loads(out.read_text())
    # every instance was a fresh, verified start, and every engine is gone afterwards
    starts = [i for i in result["instances"] if i["ok"]]
    assert sorted((i["arm"], i["instance"]) for i in starts) == [
        ("demo-cpu-threads1", 0),
        ("demo-cpu-threads1", 1),
        ("demo-cpu-threads2", 0),
        ("demo-cpu-threads2", 1),
    ]
    assert len({i["pid"] for i in starts}) == 4
    assert all(i["cold_start_s"] > 0 for i in starts)
    assert not any(
        psutil.pid_exists(i["pid"]) and psutil.Process(i["pid"]).status() != psutil.STATUS_ZOMBIE
        for i in starts
    )
    for name in ("demo-cpu-threads1", "demo-cpu-threads2"):
        arm = result["analysis"]["arms"][name]
        assert arm["blocks_used"] == 4 and arm["instances"] == 2
        assert arm["token_source"] == "server"
        assert arm["decode_tps"]["median"] > 1
        assert arm["server_decode_tps"]["median"] > 1
        assert arm["verdict"] in ("reproducible", "not reproducible")
    argvs = {a["name"]: a["argv"] for a in result["arms"]}
    assert argvs["demo-cpu-threads1"][argvs["demo-cpu-threads1"].index("--threads") + 1] == "1"
    assert all("${" not in " ".join(v) for v in argvs.values())  # exactly what ran, variables substituted
    assert all(a["engine_version"] for a in result["arms"])
    # blocks alternate arms within each round
    order = [b["arm"] for b in sorted(result["blocks"], key=lambda b: b["seq"])]
    assert order[:4] == ["demo-cpu-threads1", "demo-cpu-threads2"] * 2
    # every request asked for 24 tokens and the server says it produced 24
    assert {r["completion_tokens"] for b in result["blocks"] for r in b["requests"]} == {24}
    assert result["roofline_input"]["bytes_source"].endswith("(file size)")
    for suffix in (".arms.csv", ".blocks.csv", ".requests.csv"):
        assert (tmp_path / f"ab{suffix}").is_file()

    shot = REPO / "screenshots" / "report.png"
    shot.parent.mkdir(exist_ok=True)
    dom = render_in_chromium(html, tmp_path / "report.png", tmp_path)
    shutil.copyfile(tmp_path / "report.png", shot)
    assert len(re.findall(r"<svg\b", dom)) >= 3
    assert "demo-cpu-threads2 / demo-cpu-threads1" in dom


def test_sweep_param_threads_on_the_demo(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    run = enginetop(
        "sweep-param",
        "demo-cpu-threads2",
        "--param",
        "threads=1,2",
        "--instances",
        "2",
        "--blocks",
        "1",
        "--requests",
        "1",
        "--max-tokens",
        "16",
        "--warmup",
        "0",
        "-o",
        str(out),
        "--report",
        str(tmp_path / "sweep.html"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["kind"] == "sweep" and result["sweep"]["option"] == "--threads"
    values = {a["name"]: a["argv"][a["argv"].index("--threads") + 1] for a in result["arms"]}
    assert values == {"threads=1": "1", "threads=2": "2"}
    assert all(a["blocks_used"] == 2 for a in result["analysis"]["arms"].values())
    assert "threads=1" in run.stdout and "threads=2" in run.stdout  # the summary table
    assert "Parameter sweep" in (tmp_path / "sweep.html").read_text()


def test_ab_attached_servers_are_not_restarted(llama_server, tmp_path: Path) -> None:
    url = llama_server.url
    pid = llama_server.launched.pid
    run = enginetop(
        "ab",
        f"one={url}",
        f"two={url}",
        "--instances",
        "2",
        "--blocks",
        "1",
        "--requests",
        "1",
        "--max-tokens",
        "12",
        "--warmup",
        "0",
        "-o",
        str(tmp_path / "att.json"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "att.json").read_text())
    assert result["config"]["mode"] == "coresident"
    assert all(a["attached"] for a in result["arms"])
    assert result["analysis"]["arms"]["one"]["instance_unit"].startswith("rounds")
    assert llama_server.launched.alive() and llama_server.launched.pid == pid


def test_bad_input_gets_a_clear_message() -> None:
    run = enginetop("ab", "demo-cpu-threads1", "no-such-profile", "--instances", "1")
    assert run.returncode == 2
    assert "no profile named 'no-such-profile'" in run.stderr
    run = enginetop("sweep-param", "demo-cpu-threads1", "--param", "threads")
    assert run.returncode == 2 and "expected OPTION=V1,V2" in run.stderr
    run = enginetop("ab", "demo-cpu-threads1", "demo-cpu-threads2", "--bandwidth", "fast")
    assert run.returncode == 2 and "not a bandwidth" in run.stderr
