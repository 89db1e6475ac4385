"""What the probe panel's first line says: the medians of an engine's last few probes that succeeded
(tui.live.probe_summary)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProbeMedians:
    """The medians over the probes that succeeded among the last few; `count` 0: none did (every figure
    None). A median is None where none of them has the figure (an engine that gives no timings of its own)."""

    count: int
    decode_tps: float | None = None  # the client's decode rate
    server_decode_tps: float | None = None  # the engine's own, from its timings
    ttft_s: float | None = None  # the client's TTFT
    server_ttft_s: float | None = None  # the engine's own TTFT
    estimated: bool = False  # one of them counted its tokens from the stream's chunks, not the server's count
