"""The probe panel's medians: of an engine's last few probes, those that succeeded, their decode rate and
TTFT as the client measured them and as the engine timed them (one definition of a median:
tui.base.stats.median)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tui.base.stats import median
from tui.model.probe_medians import ProbeMedians

MEDIAN_OF = 5  # the last this many probes, whether they succeeded or not


class ProbeFigures(Protocol):
    """What a probe result (tui.probe.results.ProbeResult, a floor above) gives the medians."""

    @property
    def ok(self) -> bool: ...
    @property
    def estimated(self) -> bool: ...
    @property
    def decode_tps(self) -> float | None: ...
    @property
    def server_decode_tps(self) -> float | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def server_ttft_s(self) -> float | None: ...


def probe_medians(results: Sequence[ProbeFigures], of: int = MEDIAN_OF) -> ProbeMedians:
    """The medians over the probes that succeeded among the last `of` of `results` (oldest first)."""
    ok = [r for r in list(results)[-of:] if r.ok]
    if not ok:
        return ProbeMedians(count=0)
    return ProbeMedians(count=len(ok), decode_tps=median(r.decode_tps for r in ok),
                        server_decode_tps=median(r.server_decode_tps for r in ok),
                        ttft_s=median(r.ttft_s for r in ok),
                        server_ttft_s=median(r.server_ttft_s for r in ok),
                        estimated=any(r.estimated for r in ok))
