"""How one engine's part of a `--workers N` run is dealt to its workers (tui.workload.workers), and the peak
in flight their results add up to.

Each planned request goes to exactly one worker: a session's turns (linked by `after`) to one worker, in
order; the other requests are dealt in proportion to each worker's share of a closed loop's bound (evenly in
an open loop), so that no worker runs out early. A closed loop's bound holds across the workers:
--concurrency C is split into parts of at least one that sum to C, over at most C workers, and the requests
are dealt by those parts (2 + 1: two thirds and one third), so the run holds C in flight to its end, not only
at its peak. The peak in flight is measured: each result carries its send and end times on the shared clock
(time.monotonic(), one clock in every process of the machine), and the parent sweeps over them.
"""

from __future__ import annotations

from collections.abc import Iterable

from tui.probe.results import ProbeResult
from tui.workload.schedule import Planned


def split(planned: list[Planned], weights: list[int]) -> list[list[Planned]]:
    """Each planned request to exactly one worker, in proportion to the workers' weights (their shares of a
    closed loop's bound; equal in an open loop): a session's turns together, in plan order; sessions and lone
    requests dealt by their first request's place in the plan, each to the worker with the fewest requests
    per share once it is added (ties: the first). A closed loop's worker sends its part at the pace of its
    share, so parts dealt evenly over uneven shares end at different times: --concurrency 3 over 2 workers,
    split 2 + 1 with half the requests each, ran at three for half the run and at one for the rest."""
    by_index = {p.index: p for p in planned}
    root: dict[int, int] = {}
    for p in sorted(planned, key=lambda p: p.index):
        root[p.index] = root.get(p.after, p.after) if p.after is not None and p.after in by_index else p.index
    groups: dict[int, list[Planned]] = {}
    for p in sorted(planned, key=lambda p: p.index):
        groups.setdefault(root[p.index], []).append(p)
    parts: list[list[Planned]] = [[] for _ in weights]
    for key in sorted(groups):
        group = groups[key]
        # counted in requests, not groups: a session of ten turns is ten requests of its worker's share
        _, k = min(((len(part) + len(group)) / weight, k)
                   for k, (part, weight) in enumerate(zip(parts, weights, strict=True)))
        parts[k].extend(group)
    return parts


def shares(concurrency: int | None, n: int) -> list[int | None]:
    """A closed loop's bound over the workers that send it: one part each, every part at least one (a
    worker's 0 is no bound at all) and their sum the bound exactly, so the most in flight is what was asked.
    That takes at most `concurrency` workers: the rest of the pool sits the run out."""
    if concurrency is None:
        return [None] * n
    if concurrency < 1:
        raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
    used = min(n, concurrency)
    base, extra = divmod(concurrency, used)
    return [base + (k < extra) for k in range(used)]


def peak_in_flight(results: Iterable[ProbeResult]) -> int:
    """The most requests out at one moment, from each result's own send and end (time.monotonic(), one clock
    in every worker): a sweep over those moments, an end before a send at the same moment. Status reports
    from the workers are taken at different moments, so their sum is no such count."""
    events = sorted((t, step) for r in results if r.sent_at is not None and r.ended_at is not None
                    for t, step in ((r.sent_at, 1), (r.ended_at, -1)))
    peak = out = 0
    for _, step in events:
        out += step
        peak = max(peak, out)
    return peak
