"""The real Prometheus the fleet, export and exporter tests use: it starts, scrapes a loopback target and
answers queries; a target that is down reads as up == 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_server import running_prometheus

from tui.base.process import free_port


def test_a_real_prometheus_scrapes_a_loopback_target() -> None:
    registry = CollectorRegistry()
    Counter("enginetop_harness_ticks", "ticks", registry=registry).inc(3)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    dead = free_port()
    try:
        with running_prometheus({"live": [f"127.0.0.1:{port}"], "dead": [f"127.0.0.1:{dead}"]}) as prom:
            [series] = prom.wait_for("enginetop_harness_ticks_total")
            assert series["metric"]["job"] == "live" and float(series["value"][1]) == 3.0
            [down] = prom.wait_for('up{job="dead"}')
            assert down["value"][1] == "0"
    finally:
        server.shutdown()
        thread.join(5)
