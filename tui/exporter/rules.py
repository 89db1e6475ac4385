"""Prometheus alerting rules on the exporter's probe series (one group; `enginetop rules` writes it).

Every rule is per engine (and workload where it matters), so one alert names the engine that misbehaves.
"""

from __future__ import annotations

from typing import Any

GROUP = "enginetop-probes"


def rule_group(ttft_p90_s: float = 2.0, probe_every_s: float = 30.0,
               failure_share: float = 0.2) -> dict[str, Any]:
    """The group as a dict ready for YAML/JSON. `probe_every_s` should match the exporter's --probe-every:
    the windows are sized so each holds several probes (a rate over one probe is no quantile)."""
    if not ttft_p90_s > 0 or not probe_every_s > 0 or not 0 < failure_share <= 1:
        raise ValueError("thresholds must be positive (the failure share in (0, 1])")
    # At least 5 min, and at least 10 probes of each workload in the window.
    window = f"{max(300, int(10 * probe_every_s))}s"
    stale = f"{int(5 * probe_every_s) + 60}s"
    failed = f"sum by (engine, workload) (increase(enginetop_probe_failed_total[{window}]))"
    sent = f"sum by (engine, workload) (increase(enginetop_probe_requests_total[{window}]))"
    return {
        "name": GROUP,
        "rules": [
            {
                "alert": "EnginetopProbeTTFTHigh",
                "expr": (f"histogram_quantile(0.9, sum by (engine, workload, le) "
                         f"(rate(enginetop_probe_ttft_seconds_bucket[{window}]))) > {ttft_p90_s:g}"),
                "for": "5m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "{{ $labels.engine }}: client TTFT p90 over LIMIT s ({{ $labels.workload }})"
                               .replace("LIMIT", f"{ttft_p90_s:g}"),
                    "description": "p90 of the time to first token a client measured, from the send, "
                                   "is {{ $value | humanizeDuration }}.",
                },
            },
            {
                "alert": "EnginetopProbeFailures",
                # `> 0` on the denominator: no probes sent is no data, not a division by zero
                "expr": f"{failed} / ({sent} > 0) > {failure_share:g}",
                "for": "5m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "{{ $labels.engine }}: {{ $value | humanizePercentage }} of "
                               "{{ $labels.workload }} probes failed",
                    "description": "see enginetop_probe_failed_total's reason label (refused, timeout, "
                                   "http_STATUS, dropped, ...)",
                },
            },
            {
                "alert": "EnginetopEngineDownByProbe",
                "expr": "enginetop_probe_up == 0",
                "for": "2m",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "{{ $labels.engine }}: its last probes failed",
                    "description": "The engine did not answer a probe request to its end; /health may "
                                   "still say 200.",
                },
            },
            {
                "alert": "EnginetopProbesStale",
                "expr": f"time() - max by (engine, workload) (enginetop_probe_last_timestamp_seconds) > "
                        f"{5 * probe_every_s:g}",
                "for": stale,
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "{{ $labels.engine }}: no {{ $labels.workload }} probe for "
                               "{{ $value | humanizeDuration }}",
                    "description": "The exporter stopped probing (stuck, or --rounds reached).",
                },
            },
        ],
    }
