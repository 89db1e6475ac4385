"""`enginetop exporter`: probes run on a schedule, their results served as Prometheus series on /metrics.

An engine's own /metrics say what the server saw; these say what a client felt (TTFT by the client's
clock, one stream's decode rate, the cached share of an agent's prompt, whether it answers at all).
The probes are the ones `enginetop probe` sends (tui.probe.workloads through tui.probe.runner), so the
two agree by construction. Data code: never imports Textual.
"""
