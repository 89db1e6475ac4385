"""Names and defaults that `enginetop --help` shows, each defined once here and imported by the module that
uses it. They live in this module, which imports nothing, so that the help (tui.cli) reads them without
importing that module's machinery (httpx, aiohttp, prometheus_client, orjson): issue 51's start-up."""

from __future__ import annotations

# tui.probe.workloads: the probe's workloads; tui.probe.sweep: those a sweep runs, and its stream counts
WORKLOADS: tuple[str, ...] = ("short", "long-prefill", "agent", "thinking-off")
SWEEP_WORKLOADS: tuple[str, ...] = ("short", "thinking-off", "long-prefill")
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

# tui.proxy.metrics: where the proxy serves its own series and its windowed figures (paths no engine uses)
METRICS_PATH = "/enginetop/metrics"
TRAFFIC_PATH = "/enginetop/traffic"  # the windowed figures as JSON, for a dashboard watching this proxy
# tui.proxy.server: the largest request body it relays, and how long it waits to connect to the engine
MAX_BODY_BYTES = 32 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
# tui.proxy.trace: tokens per hash_ids block of a trace
BLOCK_SIZE = 512

# tui.sources.discover: the loopback ports discovery asks, and the variable that replaces them
DEFAULT_PORTS = (8080, 8000, 30000, 1234, 11434)
PORTS_ENV = "ENGINETOP_DISCOVER_PORTS"

# tui.record.retention: recordings older than this, and the oldest past this total size, are deleted
KEEP_DAYS = 7.0
KEEP_BYTES = 2 * 2**30

# tui.compare.stats: the run-to-run spread (CV, %) past which a comparison says its arm is not reproducible.
# The seeds' steady arms scattered 0.3-0.6% across 4-5 instances; the arm they could not trust spanned
# 46.7-73.4 (CV ~15%). 5% sits well clear of both, and above the ~1-3% that a shared 2-core CPU adds to a
# steady llama-server. (Here, not in tui.compare.stats: `--help` shows it without importing statistics.)
DEFAULT_CV_THRESHOLD_PCT = 5.0
