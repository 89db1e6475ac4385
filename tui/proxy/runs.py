"""When an engine behind the proxy begins a new run: what the proxy kept as evidence for the findings (the
last requests' facts, the prefixes their prompts shared, the most requests in flight at once) is of the run
before, and goes (TrafficBook.new_run), as the store forgets its own when the counters go back.

Two signs of it: a request the engine did not accept a connection for (it is down: a restart begins), and its
/metrics counters gone back (tui.model.counters.went_back, Prometheus' rule), read every CHECK_S while the
proxy runs, so a restart between two requests is seen too. An engine whose /metrics cannot be read
(llama-server without --metrics, a key the proxy does not hold, a gateway) is asked no more after
GIVE_UP_AFTER answers that are not its metrics; then only a refused connection says it restarted. A
connection refused is not such an answer: it is the engine down.
"""

from __future__ import annotations

from tui.model.counters import went_back
from tui.model.samples import EngineReading

CHECK_S = 5.0
GIVE_UP_AFTER = 3


class RunWatch:
    """One engine's runs, as the proxy learns of them."""

    def __init__(self) -> None:
        self.last: EngineReading | None = None  # its /metrics, last read in the current run
        self.down = False  # it did not accept a connection, and has not answered since
        self.unreadable = 0  # answers in a row that were not its metrics

    @property
    def gave_up(self) -> bool:
        return self.unreadable >= GIVE_UP_AFTER

    def unreachable(self) -> bool:
        """The engine did not accept a connection. True the first time: its run is over."""
        was, self.down, self.last = self.down, True, None
        return not was

    def reading(self, reading: EngineReading) -> bool:
        """Its /metrics, read. True when a new run began that the proxy did not see it down for: a counter
        went back since the last reading."""
        self.unreadable = 0
        before, self.last, self.down = self.last, reading, False
        return before is not None and went_back(before, reading)

    def not_metrics(self) -> None:
        """It answered, but not with metrics it can be told by (an error status, another format)."""
        self.unreadable += 1
