"""The dashboard imports only what it runs (issue 51's memory): the proxy (aiohttp), the fleet's Prometheus
clients, the A/B comparison and its report, and the bench's workers come in only with the option or key that
uses them. Each is ~1-10 MB of a process that runs for days; the dashboard's RSS is measured by
bench/bench_cycle.py, never here."""

from __future__ import annotations

import json
import subprocess
import sys

NOT_FOR_A_PLAIN_DASHBOARD = ("aiohttp", "tui.proxy.server", "tui.fleet.prometheus", "tui.fleet.dcgm",
                             "tui.compare.ab", "tui.compare.report", "tui.html.page", "tui.workload.workers",
                             "tui.workload.bench")


def _imported(code: str) -> set[str]:
    code += "\nimport sys, json\nprint(json.dumps(list(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_dashboard_app_and_its_sources_import_no_proxy_fleet_ab_or_bench() -> None:
    imported = _imported(
        "from tui.ui.app import EnginetopApp\nfrom tui.ui.config import AppConfig\n"
        "from tui.run.sources import RunOptions, build_sources\n"
        "from tui.model.targets import EngineTarget\nt = EngineTarget('e', 'http://127.0.0.1:9')\n"
        "build_sources(RunOptions(watched=[t], bench_runs=True))\nEnginetopApp(AppConfig(targets=[t]))")
    assert not {m for m in imported if m.split(".")[0] == "aiohttp" or m in NOT_FOR_A_PLAIN_DASHBOARD}
    # nor httpx's command-line client (click, pygments' lexers): enginetop only uses httpx's client
    assert "httpx" in imported and not {m for m in imported if m.split(".")[0] == "click"}
    # nor importlib.metadata (~0.7 MB with zipfile): asked only when a hint names the installed command
    assert "tui.base.install" in imported and "importlib.metadata" not in imported


def test_the_dashboards_command_line_without_recording_imports_no_sqlite() -> None:
    """`enginetop --no-record` parses its options (the recordings' retention among them, the fleet's)
    without the recorder's sqlite3 (~1 MB of library), imported when a recording is opened, nor the fleet's
    clients."""
    imported = _imported("import argparse\nfrom tui.cli.dashboard import add_dashboard_args\n"
                         "parser = argparse.ArgumentParser()\nadd_dashboard_args(parser)\n"
                         "args = parser.parse_args(['--no-record', '--no-discover'])\n"
                         "from tui.cli.options import fleet_options\nassert fleet_options(args) is None")
    assert "tui.cli.dashboard" in imported
    assert "sqlite3" not in imported and "tui.record.schema" not in imported
    # nor the fleet's clients without --prometheus or --dcgm
    assert not {m for m in imported if m in NOT_FOR_A_PLAIN_DASHBOARD or m == "tui.fleet.options"}


def test_a_proxy_brings_its_server_when_asked() -> None:
    """The other side: the lazy imports are really reached where the option is given."""
    imported = _imported(
        "from tui.run.sources import RunOptions, build_sources\nfrom tui.proxy.options import ProxyOptions\n"
        "from tui.model.targets import EngineTarget\nfrom tui.net.listen import parse_listen\n"
        "t = EngineTarget('e', 'http://127.0.0.1:9')\n"
        "listen = parse_listen('127.0.0.1:9', allow_remote=False)\n"
        "build_sources(RunOptions(watched=[t], proxy=ProxyOptions(listens={'e': listen})))")
    assert {"aiohttp", "tui.proxy.server"} <= imported
