"""A client TTFT far over the engine's own for the same request (`TtftGap`): when it is flagged
(`flag_ttft_gap`), and the likely cause in words, chosen from what was measured (queueing, connecting, or the
frontend and detokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Below a few milliseconds a gap is HTTP framing and scheduling noise on any host, whatever the ratio.
MIN_TTFT_GAP_S = 0.005
# A measured cause explains a gap when it is at least this share of it.
CAUSE_SHARE = 0.5


def flag_ttft_gap(client: float | None, server: float | None, factor: float, queue: float | None,
                  connect: float | None) -> TtftGap | None:
    """The client's TTFT against the engine's, when the client's is over `factor` times larger; `queue` and
    `connect`, the request's measured queueing and connecting, choose the cause."""
    if client is None or server is None or client - server < MIN_TTFT_GAP_S:
        return None
    if client <= factor * server:
        return None
    return TtftGap(client_s=client, server_s=server, factor=factor,
                   cause=_gap_cause(client - server, server, queue, connect))


@dataclass(frozen=True, slots=True)
class TtftGap:
    """The client saw the first token much later than the engine says it made it, and the likely cause."""

    client_s: float
    server_s: float
    factor: float  # the threshold it exceeded
    cause: str

    @property
    def ratio(self) -> float:
        return self.client_s / self.server_s if self.server_s > 0 else math.inf

    def text(self) -> str:
        ratio = f"{self.ratio:.1f}x" if math.isfinite(self.ratio) else "engine reported 0"
        return (f"client TTFT {self.client_s * 1000:.0f} ms vs the engine's {self.server_s * 1000:.0f} ms "
                f"({ratio}, flagged above {self.factor:g}x): likely {self.cause}")

    def to_json(self) -> dict[str, Any]:
        return {"client_s": self.client_s, "server_s": self.server_s, "factor": self.factor,
                "ratio": self.ratio if math.isfinite(self.ratio) else None, "cause": self.cause,
                "text": self.text()}


def _gap_cause(gap: float, server: float, queue: float | None, connect: float | None) -> str:
    """Words for the most likely cause of a TTFT gap, chosen from what was measured."""
    if queue is not None and queue >= CAUSE_SHARE * gap:
        return f"queueing: the request waited {queue * 1000:.0f} ms before the engine scheduled it"
    if connect is not None and connect >= CAUSE_SHARE * gap:
        # TTFT starts after the connect, but whatever made connecting slow (a network round trip, or a host
        # too busy to answer promptly) delays the answer too.
        return (f"a slow connection path: connecting alone took {connect * 1000:.0f} ms (a network round "
                "trip, or a host too busy to answer), a delay the request pays again after it is sent")
    measured = f"connect {connect * 1000:.1f} ms" if connect is not None else "connect not measured"
    if queue is not None:
        measured += f", queue {queue * 1000:.1f} ms"
    else:
        # llama.cpp's prompt_ms starts when a slot takes the request: a wait for a free slot is not in it.
        measured += "; the engine reports no queue time: a wait for a free slot would look the same"
    return (f"frontend or detokenizer bound: the engine had the first token after {server * 1000:.0f} ms, "
            f"the stream delivered it {gap * 1000:.0f} ms later ({measured})")
