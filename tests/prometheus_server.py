"""A real Prometheus (Debian's 2.42 package) for tests: a free loopback port, a generated config, a temporary
TSDB, ready when /-/ready answers 200, stopped (its whole process group) after. A missing install fails with
the command that installs it (`make prometheus`), never skips."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tui.base.process import Launched, free_port, launch, stop_group


class PrometheusMissing(RuntimeError):
    pass


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusMissing("prometheus is not installed: run `make prometheus` (Debian's package)")
    return path


@dataclass
class RunningPrometheus:
    url: str
    port: int
    config_path: Path
    launched: Launched

    def query(self, promql: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 60.0, min_series: int = 1) -> list[dict]:
        """Poll a query until it returns at least `min_series` series (scrapes need a few intervals)."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if len(result) >= min_series:
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql!r} had {len(result)} series after {timeout:g}s, wanted {min_series}")


def scrape_config(jobs: dict[str, Sequence[str]], interval_s: float = 1.0,
                  rule_files: Sequence[Path] = (), scrapes: Sequence[dict] = (),
                  extra: dict | None = None) -> str:
    """A prometheus.yml (JSON is YAML) scraping `jobs`: job name -> ["host:port", ...] or
    ["host:port/metrics/path", ...]; `scrapes` are whole scrape_configs added as they are (targets with
    their own labels, e.g. a synthetic fleet's); `extra` adds top-level sections (e.g. remote_read)."""
    extra_scrapes = scrapes
    scrapes = []
    for job, targets in jobs.items():
        by_path: dict[str, list[str]] = {}
        for target in targets:
            hostport, _, path = target.partition("/")
            by_path.setdefault("/" + path if path else "/metrics", []).append(hostport)
        for path, hosts in by_path.items():
            scrapes.append({"job_name": job if len(by_path) == 1 else f"{job}{path}", "metrics_path": path,
                            "scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s",
                            "static_configs": [{"targets": hosts}]})
    config = {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
              "scrape_configs": scrapes + list(extra_scrapes), "rule_files": [str(p) for p in rule_files],
              **(extra or {})}
    return json.dumps(config, indent=1)


@contextmanager
def running_prometheus(jobs: dict[str, Sequence[str]], interval_s: float = 1.0,
                       rule_files: Sequence[Path] = (), extra_args: Sequence[str] = (),
                       timeout: float = 60.0, scrapes: Sequence[dict] = (),
                       config: dict | None = None, history: str | None = None) -> Iterator[RunningPrometheus]:
    """`history`: OpenMetrics text (timestamps in seconds, `# EOF` last) written into the TSDB before it
    starts, with `promtool tsdb create-blocks-from openmetrics`, so it holds a past the scrapes continue."""
    binary = prometheus_binary()
    work = Path(tempfile.mkdtemp(prefix="enginetop-prom-"))
    if history is not None:
        (work / "history.om").write_text(history)
        made = subprocess.run([str(Path(binary).with_name("promtool")), "tsdb", "create-blocks-from",
                               "openmetrics", str(work / "history.om"), str(work / "tsdb")],
                              capture_output=True, text=True, timeout=120)
        if made.returncode != 0:
            raise RuntimeError(f"promtool could not write the history: {made.stdout}{made.stderr}")
    config_path = work / "prometheus.yml"
    config_path.write_text(scrape_config(jobs, interval_s, rule_files, scrapes, config))
    port = free_port()
    argv = [binary, f"--config.file={config_path}", f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=warn",
            *extra_args]
    launched = launch(argv, work / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if launched.proc.poll() is not None:
                log = (work / "prometheus.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"prometheus exited with {launched.proc.returncode}:\n{log}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready at {url} after {timeout:g}s")
            time.sleep(0.2)
        yield RunningPrometheus(url=url, port=port, config_path=config_path, launched=launched)
    finally:
        stop_group(launched)
        shutil.rmtree(work, ignore_errors=True)
