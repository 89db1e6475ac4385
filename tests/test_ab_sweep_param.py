"""sweep-param: argv substitution, derived profiles, and the seeds' table, on SSE servers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_ab import implied_verdict
from tests.test_report import SSEEngine
from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.analysis import analyze
from tui.compare.report import render_html
from tui.compare.sweep_param import best_value, parse_param_spec, set_option, sweep_profiles, sweep_table
from tui.lifecycle.profiles import Profile


def test_parse_param_spec() -> None:
    spec = parse_param_spec("spec-draft-n-max=1,2,3,4,5,6")
    assert spec.option == "--spec-draft-n-max" and spec.values == ("1", "2", "3", "4", "5", "6")
    assert parse_param_spec("--threads=1, 2").values == ("1", "2")
    assert parse_param_spec("t=4").option == "-t"
    for bad in ("threads", "threads=", "=1,2"):
        with pytest.raises(ValueError, match="expected OPTION=V1,V2"):
            parse_param_spec(bad)
    with pytest.raises(ValueError, match="listed twice"):
        parse_param_spec("threads=1,1")


def test_set_option_replaces_appends_and_removes() -> None:
    argv = ["llama-server", "--model", "m.gguf", "--spec-draft-n-max", "6", "--flash-attn", "on"]
    assert set_option(argv, "--spec-draft-n-max", "2") == [
        "llama-server", "--model", "m.gguf", "--spec-draft-n-max", "2", "--flash-attn", "on"]
    assert set_option(argv, "--threads", "4")[-2:] == ["--threads", "4"]
    assert set_option(["x", "--n-gpu-layers=10"], "--n-gpu-layers", "-1") == ["x", "--n-gpu-layers=-1"]
    assert set_option(argv, "--spec-draft-n-max", "off") == [
        "llama-server", "--model", "m.gguf", "--flash-attn", "on"]
    assert set_option(["x", "--metrics", "--port", "1"], "--metrics", "off") == ["x", "--port", "1"]


def test_sweep_profiles_derive_one_profile_per_value(tmp_path: Path) -> None:
    base = Profile(name="p", engine="llama.cpp", port=8090, path=tmp_path / "p.toml",
                   argv=("srv", "--port", "${PORT}", "--threads", "2"))
    derived = sweep_profiles(base, parse_param_spec("threads=1,2"))
    assert [(arm, p.name, p.argv[-1]) for arm, p in derived] == [("threads=1", "p:threads=1", "1"),
                                                                  ("threads=2", "p:threads=2", "2")]
    attached = Profile(name="a", engine="vllm", port=8000, path=tmp_path / "a.toml")
    with pytest.raises(ValueError, match="no argv to sweep"):
        sweep_profiles(attached, parse_param_spec("threads=1"))


def test_sweep_table_and_report_on_sse_servers() -> None:
    delays = {"1": 0.010, "2": 0.005, "3": 0.015}  # long enough that a busy host barely adds scatter
    arms = []
    for value, delay in delays.items():
        arm = Arm(f"draft={value}", SSEEngine(value, delay))
        arm.param = {"option": "--draft", "value": value}
        arms.append(arm)
    cfg = ABConfig(instances=2, blocks=1, requests_per_block=3, max_tokens=12, warmup_requests=0,
                   mode="coresident", bootstrap_samples=200)
    result = run_comparison(arms, cfg, kind="sweep",
                            extra={"sweep": {"profile": "sse", "option": "--draft", "values": list(delays)}})
    rows = sweep_table(result)
    assert [r["value"] for r in rows] == ["1", "2", "3"]
    speeds = {r["value"]: r["decode_tps"] for r in rows}
    assert speeds["2"] > speeds["1"] > speeds["3"]  # 5 ms/token is fastest, 15 ms slowest
    html = render_html(result)
    assert "<h2>Parameter sweep</h2>" in html
    assert len(re.findall(r"<svg\b", html)) >= 4
    # Each verdict is what the measured CV across instances implies at the run's threshold.
    for row in rows:
        cv, implied = implied_verdict(result, row["arm"])
        assert row["instances"] == 2 and row["instance_cv_pct"] == pytest.approx(cv)
        assert row["verdict"] == implied, row
    # Thresholds that make the verdicts known whatever the host's noise: above every CV all values are
    # reproducible and the fastest (5 ms/token) is advised; below every CV none is and nothing is advised.
    cvs = [row["instance_cv_pct"] for row in rows]
    result["config"]["cv_threshold_pct"] = max(cvs) + 1.0
    result["analysis"] = analyze(result)
    assert "Best reproducible value: <b>2</b>" in render_html(result)
    assert min(cvs) > 0  # two instances never measure exactly the same median
    result["config"]["cv_threshold_pct"] = min(cvs) / 2
    result["analysis"] = analyze(result)
    html = render_html(result)
    assert "No value was reproducible" in html and "Best reproducible value" not in html
    # best_value picks the fastest reproducible value; verdicts set here, the live ones depend on host load
    for row in rows:
        row["verdict"] = "reproducible"
    assert best_value(rows)["value"] == "2"
    rows[1]["verdict"] = "not reproducible"
    assert best_value(rows)["value"] == "1"
    for row in rows:
        row["verdict"] = "single instance"
    assert best_value(rows) is None
