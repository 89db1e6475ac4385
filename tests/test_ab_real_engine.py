"""Real llama-server runs of `enginetop ab` and `enginetop sweep-param` (the CPU demo profiles), the report
rendered in headless Chromium with the network off. Economical: 2 cores, few and short requests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.test_ab import implied_verdict
from tests.test_dashboard import make_app, wait_for
from tests.test_report import render_in_chromium
from tui.compare.ab import ABConfig
from tui.model.targets import EngineTarget
from tui.ui.screens.ab import ABScreen

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
        "8",
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
        cv, implied = implied_verdict(result, name)  # what the measured scatter implies at the threshold
        assert arm["instance_cv_pct"] == pytest.approx(cv) and arm["verdict"] == implied, (cv, arm)
    argvs = {a["name"]: a["argv"] for a in result["arms"]}
    assert argvs["demo-cpu-threads1"][argvs["demo-cpu-threads1"].index("--threads") + 1] == "1"
    assert all("${" not in " ".join(v) for v in argvs.values())  # exactly what ran, variables substituted
    assert all(a["engine_version"] for a in result["arms"])
    # blocks alternate arms within each round
    order = [b["arm"] for b in sorted(result["blocks"], key=lambda b: b["seq"])]
    assert order[:4] == ["demo-cpu-threads1", "demo-cpu-threads2"] * 2
    # every request asked for 8 tokens and the server says it produced 8
    assert {r["completion_tokens"] for b in result["blocks"] for r in b["requests"]} == {8}
    assert result["roofline_input"]["bytes_source"].endswith("(file size)")
    for suffix in (".arms.csv", ".blocks.csv", ".requests.csv"):
        assert (tmp_path / f"ab{suffix}").is_file()

    # Only tmp_path is written: screenshots/report.png is refreshed by scripts/make_screenshots.py.
    dom = render_in_chromium(html, tmp_path / "report.png", tmp_path)
    assert len(re.findall(r"<svg\b", dom)) >= 3
    assert "demo-cpu-threads2 / demo-cpu-threads1" in dom
    method = _method(html.read_text())
    for name in ("demo-cpu-threads1", "demo-cpu-threads2"):
        assert (f"<b>{name}</b>: 2 fresh engine starts through the safe switch (stop → VRAM, PIDs and port "
                "drained → start → /health and a real 1-token completion), cold start") in method
    assert "round i started instance i of every arm, side by side on distinct ports" in method
    assert "1 unrecorded warm-up request after each start (4 sent, 4 answered)" in method


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
        "--mode",
        "switch",
        "-o",
        str(out),
        "--report",
        str(tmp_path / "sweep.html"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["kind"] == "sweep" and result["sweep"]["option"] == "--threads"
    assert result["config"]["mode"] == "switch"
    starts = [(i["arm"], i["instance"]) for i in result["instances"] if i["ok"] and i["fresh"]]
    assert starts == [("threads=1", 0), ("threads=2", 0), ("threads=2", 1), ("threads=1", 1)]
    method = _method((tmp_path / "sweep.html").read_text())
    assert "<b>threads=1</b>: 2 fresh engine starts through the safe switch" in method
    assert "Schedule <b>switch</b>: one engine at a time" in method and "round i starts instance i" in method
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
        "--report",
        str(tmp_path / "att.html"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "att.json").read_text())
    assert result["config"]["mode"] == "coresident"
    assert all(a["attached"] for a in result["arms"])
    assert result["analysis"]["arms"]["one"]["instance_unit"] == "rounds"
    assert llama_server.launched.alive() and llama_server.launched.pid == pid
    assert "2 rounds x 1 blocks" in run.stderr and "instance" not in run.stderr
    method = _method((tmp_path / "att.html").read_text())
    assert "fresh engine start" not in method and "instance" not in method
    origin = f"attached by URL {url}, not started by enginetop"
    assert f"<b>one</b>: never restarted ({origin}); 2 rounds in time" in method
    assert "all engines kept running side by side" in method


def _method(html: str) -> str:
    start = html.index("<h2>Method</h2>")
    return html[start:html.index("</ol>", start)]


def test_bad_input_gets_a_clear_message() -> None:
    run = enginetop("ab", "demo-cpu-threads1", "no-such-profile", "--instances", "1")
    assert run.returncode == 2
    assert "no profile named 'no-such-profile'" in run.stderr
    run = enginetop("sweep-param", "demo-cpu-threads1", "--param", "threads")
    assert run.returncode == 2 and "expected OPTION=V1,V2" in run.stderr
    run = enginetop("ab", "demo-cpu-threads1", "demo-cpu-threads2", "--bandwidth", "fast")
    assert run.returncode == 2 and "not a bandwidth" in run.stderr


async def test_dashboard_ab_goes_on_after_escape_saves_and_keeps_probes_paused(llama_server, tmp_path,
                                                                                 monkeypatch):
    """Escape closes the A/B screen only: the run (owned by the app) finishes, saves JSON, CSV and HTML, and
    the dashboard says so; `a` meanwhile shows the same run; no dashboard probe is sent while it measures."""
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path / "cache"))
    app = make_app([EngineTarget("A", llama_server.url), EngineTarget("B", llama_server.url)], tmp_path)
    app.config.ab = ABConfig(instances=2, blocks=2, requests_per_block=2, max_tokens=12, warmup_requests=0,
                             mode="coresident", bootstrap_samples=200)
    for slot in app.slots:
        slot.probe_every_s = 0.5  # the timer would probe twice a second unless an A/B pauses it
    told: list[str] = []
    notify = app.notify
    monkeypatch.setattr(app, "notify", lambda message, **kw: (told.append(message), notify(message, **kw)))
    async with app.run_test(size=(200, 60)) as pilot:
        probes = {name: app.store.engines[name].probes for name in ("A", "B")}
        await wait_for(pilot, lambda: all(probes.values()), timeout=90, what="a timer probe on each engine")
        await pilot.press("a")
        await pilot.press("escape")  # at once
        run = await wait_for(pilot, lambda: not isinstance(app.screen, ABScreen) and app.ab_run,
                             what="the A/B running with its screen closed")
        assert not run.done, "the run ended before the test could look: give it more blocks"
        await pilot.press("a")  # while it runs: its progress again, not a second run
        await wait_for(pilot, lambda: isinstance(app.screen, ABScreen), what="the A/B screen again")
        assert app.screen.run is run and app.ab_run is run
        await pilot.press("escape")
        await wait_for(pilot, lambda: run.done, timeout=240, what="the A/B to finish in the background")
        assert run.error is None and run.result is not None
        await wait_for(pilot, lambda: run.summary() in told, timeout=5, what="the dashboard saying so")
        done_words = run.summary()
        # the timer probes again once the run is over
        counts = {name: len(p) for name, p in probes.items()}
        await wait_for(pilot, lambda: any(len(p) > counts[n] for n, p in probes.items()), timeout=60,
                       what="probes resuming after the A/B")
    names = sorted(p.name for p in run.saved)
    stem = run.stem.name
    suffixes = (".json", ".arms.csv", ".blocks.csv", ".requests.csv", ".html")
    assert names == sorted(f"{stem}{suffix}" for suffix in suffixes)
    assert all(p.is_file() and p.stat().st_size > 0 for p in run.saved)
    assert all(p.name in done_words for p in run.saved)
    assert json.loads(run.stem.with_suffix(".json").read_text())["blocks"] == run.result["blocks"]
    assert len(run.result["blocks"]) == 8
    first = min(b["wall_start"] for b in run.result["blocks"])
    last = max(b["wall_end"] for b in run.result["blocks"])
    sent = [r.wall_start for p in probes.values() for _, r in p if first <= r.wall_start <= last]
    assert not sent, f"{len(sent)} dashboard probe(s) sent while the A/B measured"
