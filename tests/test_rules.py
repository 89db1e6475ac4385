"""`enginetop rules`: the rule file passes the real `promtool check rules`, and `promtool test rules` fires
each alert on series shaped like the exporter's (and keeps it quiet on healthy ones)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tui.cli import rules
from tui.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed: run `make prometheus` (Debian's package)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def test_written_file_passes_promtool_check(tmp_path: Path) -> None:
    out = tmp_path / "enginetop-rules.yml"
    proc = subprocess.run([sys.executable, "-m", "tui", "rules", "-o", str(out), "--ttft-p90", "1.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    checked = promtool("check", "rules", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout
    groups = json.loads(out.read_text())["groups"]
    assert [g["name"] for g in groups] == ["enginetop-probes", "enginetop-fleet"]
    assert [r["alert"] for r in groups[1]["rules"]] == ["EngineStalled", "EngineKVCacheFull",
                                                        "EngineQueueGrowing", "EngineThrottledGpuSlow"]
    assert "> 1.5" in groups[0]["rules"][0]["expr"]


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def test_alerts_fire_on_exporter_shaped_series(tmp_path: Path) -> None:
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(rules.render(rules.rule_groups(ttft_p90_s=2.0, probe_every_s=30.0)))
    bad = {"engine": "a", "workload": "short"}
    good = {"engine": "b", "workload": "short"}
    inputs = [
        # Engine a: every probe's TTFT lands between 2.5 and 5 s, every probe fails after 10 min, up goes 0.
        series("enginetop_probe_ttft_seconds_bucket", "0x60", le="2.5", **bad),
        series("enginetop_probe_ttft_seconds_bucket", "0+1x60", le="5", **bad),
        series("enginetop_probe_ttft_seconds_bucket", "0+1x60", le="+Inf", **bad),
        series("enginetop_probe_requests_total", "0+1x60", **bad),
        series("enginetop_probe_failed_total", "0+1x60", reason="refused", **bad),
        series("enginetop_probe_up", "0x60", engine="a"),
        # Engine b: fast, no failures, up.
        series("enginetop_probe_ttft_seconds_bucket", "0+1x60", le="0.1", **good),
        series("enginetop_probe_ttft_seconds_bucket", "0+1x60", le="+Inf", **good),
        series("enginetop_probe_requests_total", "0+1x60", **good),
        series("enginetop_probe_up", "1x60", engine="b"),
    ]
    ttft = {"exp_labels": {"severity": "warning", **bad},
            "exp_annotations": {"summary": "a: client TTFT p90 over 2 s (short)",
                                # 2.5 + (5 - 2.5) * 0.9: histogram_quantile's interpolation in the bucket
                                "description": "p90 of the time to first token a client measured, from the "
                                               "send, is 4.75s."}}
    failures = {"exp_labels": {"severity": "warning", **bad},
                "exp_annotations": {"summary": "a: 100% of short probes failed",
                                    "description": "see enginetop_probe_failed_total's reason label "
                                                   "(refused, timeout, http_STATUS, dropped, ...)"}}
    down = {"exp_labels": {"severity": "critical", "engine": "a"},
            "exp_annotations": {"summary": "a: its last probes failed",
                                "description": "The engine did not answer a probe request to its end; "
                                               "/health may still say 200."}}
    tests = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "30s",
            "input_series": inputs,
            "alert_rule_test": [
                # pending, not firing, before its 2 minutes
                {"eval_time": "1m", "alertname": "EnginetopEngineDownByProbe", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "EnginetopEngineDownByProbe", "exp_alerts": [down]},
                {"eval_time": "4m", "alertname": "EnginetopProbeTTFTHigh", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "EnginetopProbeTTFTHigh", "exp_alerts": [ttft]},
                {"eval_time": "12m", "alertname": "EnginetopProbeFailures", "exp_alerts": [failures]},
                {"eval_time": "12m", "alertname": "EnginetopProbesStale", "exp_alerts": []},
            ],
        }],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(json.dumps(tests))
    proc = promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_options_go_to_the_providers_that_take_them(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "enginetop_extra_rules.py").write_text(
        "def rule_group(probe_every_s=1.0):\n"
        "    return {'name': 'extra', 'rules': [{'alert': 'X', 'expr': 'vector(%g)' % probe_every_s}]}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(rules, "PROVIDERS",
                        ("tui.exporter.rules", "tui.fleet.alerts", "enginetop_extra_rules"))
    groups = rules.rule_groups(ttft_p90_s=3.0, probe_every_s=15.0, match='{job="vllm"}')
    assert [g["name"] for g in groups] == ["enginetop-probes", "enginetop-fleet", "extra"]
    assert groups[2]["rules"][0]["expr"] == "vector(15)"
    assert 'job="vllm"' in groups[1]["rules"][0]["expr"]


def test_bad_threshold_and_unwritable_output(tmp_path: Path, capsys) -> None:
    assert main(["rules", "--ttft-p90", "0"]) == 2
    assert "thresholds must be positive" in capsys.readouterr().err
    assert main(["rules", "-o", str(tmp_path / "no" / "such" / "dir.yml")]) == 2
    assert "cannot write" in capsys.readouterr().err
