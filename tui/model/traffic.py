"""The user's own requests, as the traffic proxy (tui.proxy) measured them: one record per request, and the
windowed figures per engine that the store keeps and the dashboard shows under "traffic".

Everything here was measured at the proxy, between the client and the engine, so it is what the client saw
(TTFT includes the engine's queue). Token counts come from the engine's own usage or timings, never from
counting chunks; a figure the engine did not give is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tui.model.findings import TrafficFacts
from tui.model.samples import RequestStats

Outcome = Literal["ok", "error", "abandoned"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request relayed through the proxy, once it has ended."""

    engine: str
    path: str
    stream: bool
    started_wall: float  # time.time() when the proxy got the request
    outcome: Outcome
    status: int | None = None  # the engine's HTTP status (None: the engine never answered)
    error: str | None = None  # why it failed or was abandoned, in words
    model: str | None = None
    ttft_s: float | None = None  # request received -> first token relayed (streams only)
    e2e_s: float | None = None  # request received -> last byte relayed (or the abandon)
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_max_s: float | None = None
    token_events: int = 0  # events that carried generated text, received from the engine
    prompt_tokens: int | None = None  # the whole prompt, cache hits included
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the engine's prompt/prefix cache
    # The engine's own timings where it sends them (llama.cpp `timings`, vLLM per-request metrics), ms
    engine_prompt_ms: float | None = None
    engine_decode_ms: float | None = None
    engine_ttft_ms: float | None = None
    session_id: str | None = None
    refused_for_length: str | None = None  # the engine's own words when it refused the prompt as too long
    refused_prompt_tokens: int | None = None  # how long that prompt was, as the engine said
    finish_reason: str | None = None  # the engine's own (stop, length, tool_calls...), None: it gave none
    max_tokens: int | None = None  # what the client asked for at most (max_tokens, its aliases); None: no cap

    @property
    def decode_tps(self) -> float | None:
        """Generated tokens per second after the first, as the client received them."""
        if self.completion_tokens is None or self.completion_tokens < 2 or self.ttft_s is None \
                or self.e2e_s is None or self.e2e_s <= self.ttft_s:
            return None
        return (self.completion_tokens - 1) / (self.e2e_s - self.ttft_s)


@dataclass(frozen=True, slots=True)
class TrafficStats:
    """One engine's real traffic over the proxy's window (requests that ended in it), None = n/a."""

    window_s: float
    requests: int = 0  # ended in the window
    requests_per_s: float | None = None
    in_flight: int = 0
    errors: int = 0
    abandoned: int = 0
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    decode_tps_p50: float | None = None  # per request, median
    prompt_tokens_mean: float | None = None
    cached_share: float | None = None  # cached prompt tokens / prompt tokens, where the engine said both
    total_requests: int = 0  # since the proxy started
    total_errors: int = 0
    total_abandoned: int = 0
    # Headroom, where `enginetop capacity` measured this engine: its capacity, the SLO it held, and the share
    # of the real streamed requests of the last `slo_window_s` that met that SLO.
    capacity_rps: float | None = None
    slo: str | None = None
    slo_met: float | None = None
    slo_requests: int = 0
    slo_window_s: float | None = None
    # The evidence of the findings (tui.findings) over the last requests: prompts shared, cached, refused...
    facts: TrafficFacts | None = None
    # Each request's life over the window, in the same shape as an engine's own per-request series
    per_request: RequestStats | None = None


@dataclass(frozen=True, slots=True)
class TrafficSample:
    """What the proxy in front of one engine saw: the engine's name (the same store entry as its polling),
    the proxy's address, and the figures."""

    name: str
    proxy_url: str
    t: float  # time.monotonic() when read
    wall: float
    stats: TrafficStats
    error: str | None = None  # the proxy could not be read (a separate `enginetop proxy` process)
