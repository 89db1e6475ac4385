"""The offline HTML report, the JSON/CSV files, and `enginetop report`; rendered in headless Chromium."""

from __future__ import annotations

import csv
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.sse_server import Scenario, SSEServer
from tui.cli.main import main
from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.engines import Started, Target
from tui.compare.report import render_html, write_report
from tui.compare.result_files import load_result, write_result

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class SSEEngine:
    attached = False

    def __init__(self, name: str, delay: float) -> None:
        self.name, self.delay, self.server = name, delay, None

    def start(self) -> Started:
        self.server = SSEServer(
            default=Scenario(per_token_delay_s=self.delay, first_token_delay_s=0.01)
        ).start()
        return Started(
            Target(self.name, self.server.url),
            0.0,
            None,
            None,
            argv=("fake-server", "--per-token-delay", str(self.delay)),
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def result() -> dict:
    cfg = ABConfig(
        instances=2,
        blocks=2,
        requests_per_block=2,
        max_tokens=12,
        warmup_requests=0,
        mode="coresident",
        bootstrap_samples=300,
        concurrency=(1, 2),
    )
    res = run_comparison([Arm("fast", SSEEngine("fast", 0.004)), Arm("slow", SSEEngine("slow", 0.008))], cfg)
    res["roofline_input"] = {
        "bytes_per_token": 2.5e8,
        "bytes_source": "given",
        "bandwidth_bps": 2e10,
        "bandwidth_source": "given",
    }
    return res


def test_report_is_self_contained_and_has_every_section(result: dict) -> None:
    html = render_html(result)
    for forbidden in ("<script", " src=", "<link", "@import", "url("):
        assert forbidden not in html, forbidden
    assert len(re.findall(r"<svg\b", html)) >= 3  # decode bars, concurrency lines (+ none for sweep)
    for heading in (
        "Platform",
        "Exact configurations",
        "Method",
        "Single-stream decode",
        "Concurrency",
        "A/B verdicts",
        "Roofline",
        "Throttling",
        "Raw probe numbers",
    ):
        assert f"<h2>{heading}</h2>" in html, heading
    assert "--per-token-delay" in html  # the exact argv
    assert "slow / fast" in html
    for name, arm in result["analysis"]["arms"].items():  # each arm's own verdict, as computed
        cls = {"reproducible": "ok", "not reproducible": "bad"}.get(arm["verdict"], "warn")
        assert f'<span class="{cls}">{arm["verdict"]}</span><br><span class="muted">CV' in html, name
    # roofline: 20 GB/s over 0.25 GB per token = 80 tok/s ceiling
    assert "80.0" in html
    # every request is in the raw table
    n_requests = sum(len(b["requests"]) for b in result["blocks"])
    assert f"All {n_requests} requests" in html


def test_method_is_written_from_what_the_run_recorded(result: dict) -> None:
    html = render_html(result)
    method = html[html.index("<h2>Method</h2>"):html.index("</ol>", html.index("<h2>Method</h2>"))]
    # fresh SSE servers, started directly: fresh starts, but no safe switch that never ran
    assert "<b>fast</b>: 2 fresh engine starts, cold start 0.0–0.0 s" in method
    assert "safe switch" not in method
    assert "round i started instance i of every arm, side by side on distinct ports" in method
    assert "No warm-up requests were sent" in method
    assert "The GPU was not sampled" in method
    requests = [r for b in result["blocks"] for r in b["requests"]]
    assert f"{len(requests)} of {len(requests)} successful requests said how many prompt tokens" in method
    # a result written before the facts were recorded says so instead of guessing
    old = {k: v for k, v in result.items() if k != "method"}
    old_method = render_html(old).split("<h2>Method</h2>")[1].split("</ol>")[0]
    assert "did not record how the run was done" in old_method
    assert "fresh" not in old_method


def test_result_files_round_trip(result: dict, tmp_path: Path) -> None:
    paths = write_result(result, tmp_path / "run.json")
    names = sorted(p.name for p in paths)
    assert names == ["run.arms.csv", "run.blocks.csv", "run.concurrency.csv", "run.json", "run.requests.csv"]
    with (tmp_path / "run.requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == sum(len(b["requests"]) for b in result["blocks"])
    assert {r["arm"] for r in rows} == {"fast", "slow"}
    assert all(float(r["decode_tps"]) > 0 for r in rows)
    with (tmp_path / "run.arms.csv").open() as fh:
        arms = {r["arm"]: r for r in csv.DictReader(fh)}
    assert float(arms["fast"]["decode_tps_median"]) > float(arms["slow"]["decode_tps_median"])
    again = load_result(tmp_path / "run.json")
    assert render_html(again) == render_html(json.loads(json.dumps(result)))


def test_report_command(result: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_result(result, tmp_path / "r.json")
    assert main(["report", str(tmp_path / "r.json"), "-o", str(tmp_path / "out" / "r.html")]) == 0
    assert (tmp_path / "out" / "r.html").read_text().startswith("<!DOCTYPE html>")
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "x.html")]) == 2
    assert "is not JSON" in capsys.readouterr().err
    (tmp_path / "other.json").write_text('{"a": 1}')
    assert main(["report", str(tmp_path / "other.json"), "-o", str(tmp_path / "x.html")]) == 2
    assert "not an enginetop ab/sweep-param result" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html")]) == 2
    assert "cannot read" in capsys.readouterr().err


# ---- headless Chromium, network off ------------------------------------------------------------------------


def _network_off_prefix() -> list[str]:
    """`unshare --net` gives Chromium a network namespace with nothing in it; without the privilege for
    that, every host name resolves to nothing and every connection goes to a closed proxy instead."""
    if (
        shutil.which("unshare")
        and subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0
    ):
        return ["unshare", "--net"]
    return []


def chromium(html: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: run `make chromium` (Debian's chromium package)"
    argv = [
        *_network_off_prefix(),
        binary,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=127.0.0.1:9",
        *extra,
        html.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def png_is_blank(path: Path) -> bool:
    """True when the decoded image data is (nearly) one value: a blank page. Reads the PNG with zlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    # Filtered scanlines: a blank page is all 0 (filter "Up"/"Sub") or all 255 (filter "None" on white).
    busy = sum(1 for b in raw[::7] if b not in (0, 255))
    return busy < len(raw[::7]) * 0.002


def render_in_chromium(html: Path, screenshot: Path, tmp: Path) -> str:
    dom = chromium(html, tmp, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = chromium(html, tmp, f"--screenshot={screenshot}", "--window-size=1280,2600", "--hide-scrollbars")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert screenshot.is_file() and screenshot.stat().st_size > 20_000
    assert not png_is_blank(screenshot)
    return dom.stdout


def test_png_blank_check_tells_blank_from_drawn(tmp_path: Path) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body style='background:#fff'></body></html>")
    chromium(blank, tmp_path, f"--screenshot={tmp_path / 'blank.png'}", "--window-size=400,300")
    assert png_is_blank(tmp_path / "blank.png")


def test_report_renders_in_headless_chromium_offline(result: dict, tmp_path: Path) -> None:
    html = write_report(result, tmp_path / "report.html")
    dom = render_in_chromium(html, tmp_path / "report.png", tmp_path)
    assert len(re.findall(r"<svg\b", dom)) >= 3
    assert "<polyline" in dom and "<rect" in dom
    assert "Single-stream decode" in dom
