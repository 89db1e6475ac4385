"""Host CPU / RAM / swap and per-engine process-tree memory, via psutil; the container an engine runs in and
what its cgroup imposes (tui.sources.port_holder, tui.sources.cgroup); the CPU packages' energy via RAPL
(tui.sources.rapl). Never raises."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

import psutil

from tui.model.samples import HostSample, ProcessTreeMemory
from tui.sources.cgroup import read_cgroup
from tui.sources.containers import shared_catalog
from tui.sources.port_holder import in_container
from tui.sources.processes import age_s, children_map, descendants, tree_memory
from tui.sources.rapl import RaplReader

log = logging.getLogger(__name__)

TREE_REFRESH_S = 10.0  # between two process-table walks while an engine's tree changes (workers start)
TREE_STEADY_S = 60.0  # once a walk found every engine's tree as the walk before it had
TREE_YOUNG_S = 300.0  # an engine this young may still start workers (vLLM: after its imports)


def _busy_and_total() -> tuple[float, float] | None:
    """CPU seconds of all cores since boot: (busy, total). Idle and I/O wait are not busy."""
    try:
        t = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    total = sum(t)
    return total - t.idle - getattr(t, "iowait", 0.0), total


class CpuMeter:
    """Whole-host CPU busy % since this meter's previous reading.

    Every reader owns its meter: psutil.cpu_percent(interval=None) keeps one baseline per process, so two
    readers of it (the host panel and an A/B block, say) would each measure the other's interval.
    """

    def __init__(self) -> None:
        self._last = _busy_and_total()

    def percent(self) -> float | None:
        """Busy % of all cores since the last call (or since the meter was made); None if unknown."""
        now = _busy_and_total()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return max(0.0, min(100.0, 100.0 * (now[0] - last[0]) / (now[1] - last[1])))


class HostSampler:
    """CPU % since the previous sample (its own CpuMeter), memory, swap, engine trees and the CPU packages'
    energy counter (RAPL; `rapl` injectable, by default read under ENGINETOP_SYSFS_ROOT or /sys)."""

    def __init__(self, rapl: RaplReader | None = None, containers: bool = True) -> None:
        self._rapl = rapl if rapl is not None else RaplReader()
        self._containers = containers  # read each engine's container and cgroup
        self._children_map: dict[int, list[int]] = {}
        self._children_at: float | None = None
        self._trees: dict[int, frozenset[int]] = {}  # each engine root's processes at the last walk
        self._steady = False  # the last walk found the trees the walk before it had
        self._known: dict[int, psutil.Process] = {}  # the engines' processes, until the next walk
        self._cpu = CpuMeter()

    def _children(self, now: float, roots: set[int]) -> dict[int, list[int]]:
        """The process-table walk is the costly part of a sample (a /proc/PID/stat read per process: ~6 ms
        for 70 processes here, tens of ms on a busy server), and RSS is read from every known process each
        sample anyway. So the table is walked again at once for a new engine or when a process of an
        engine's tree has gone (a worker restarting, a router swapping models), every TREE_REFRESH_S while
        the trees change or an engine is young (workers appear during start-up, after a quiet while), and
        every TREE_STEADY_S once neither holds."""
        gone = any(p not in self._known for tree in self._trees.values() for p in tree)
        wait = TREE_STEADY_S if self._steady else TREE_REFRESH_S
        if (self._children_at is None or gone or not roots <= self._trees.keys()
                or now - self._children_at >= wait):
            walked = children_map()
            alive = {pid for kids in walked.values() for pid in kids}  # every process is someone's child
            trees = {root: frozenset(descendants(root, walked) | ({root} & alive)) for root in roots}
            self._steady = trees == self._trees and all(age_s(root) > TREE_YOUNG_S for root in roots)
            self._children_map, self._children_at, self._trees = walked, now, trees
            self._known.clear()  # a PID that went may come back as another process
        return self._children_map

    def sample(self, engine_pids: Mapping[str, int | str] | None = None) -> HostSample:
        """`engine_pids` maps an engine name to its root PID (engines whose process has gone are left out),
        or to why no process of this machine is the engine's although one holds its port (`unowned`)."""
        unowned = tuple(sorted((n, p) for n, p in (engine_pids or {}).items() if isinstance(p, str)))
        roots = {n: p for n, p in (engine_pids or {}).items() if isinstance(p, int)}
        t = time.monotonic()
        cpu_pct = cpu_count = ram_used = ram_total = swap_used = swap_total = None
        try:
            cpu_pct = self._cpu.percent()
            cpu_count = psutil.cpu_count(logical=True)
        except Exception as exc:
            log.debug("CPU figures unavailable: %s", exc)
        try:
            vm = psutil.virtual_memory()
            # total - available counts what programs hold, not reclaimable page cache
            ram_used, ram_total = vm.total - vm.available, vm.total
        except Exception as exc:
            log.debug("RAM figures unavailable: %s", exc)
        try:
            sw = psutil.swap_memory()
            swap_used, swap_total = sw.used, sw.total
        except Exception as exc:
            log.debug("swap figures unavailable: %s", exc)
        engines = []
        children = self._children(t, set(roots.values())) if roots else {}
        for name, pid in roots.items():
            try:
                tree = tree_memory(name, pid, children, self._known)
            except Exception as exc:
                log.debug("memory of engine %s (pid %s) unavailable: %s", name, pid, exc)
                continue
            if tree is not None:
                engines.append(self._placed(tree) if self._containers else tree)
        try:
            # the sample's time is the counter's: a process walk before it takes milliseconds, and the
            # package's watts are joules over the time between two reads (seen: 9.4 W of a 10 W counter else)
            t = time.monotonic()
            energy = self._rapl.read()
            cpu_j, domains, energy_error = energy.joules, energy.domains, energy.error
        except Exception as exc:  # never let a reader surprise take the host panel down
            log.debug("CPU energy unavailable: %s", exc)
            cpu_j, domains, energy_error = None, (), f"CPU energy (RAPL) failed: {exc}"
        return HostSample(
            t=t,
            cpu_pct=cpu_pct,
            cpu_count=cpu_count,
            ram_used_bytes=ram_used,
            ram_total_bytes=ram_total,
            swap_used_bytes=swap_used,
            swap_total_bytes=swap_total,
            engines=tuple(engines),
            cpu_energy_j=cpu_j,
            cpu_energy_domains=domains,
            cpu_energy_error=energy_error,
            unowned=unowned,
        )

    @staticmethod
    def _placed(tree: ProcessTreeMemory) -> ProcessTreeMemory:
        """The tree with the container its root runs in and that container's cgroup (none for a process on
        the host: the host's own cgroup is no limit the engine was given)."""
        try:
            container = in_container(tree.pid, shared_catalog())
            cgroup = read_cgroup(tree.pid) if container is not None else None
        except Exception as exc:  # never let a container surprise take the host panel down
            log.debug("container of engine %s unavailable: %s", tree.engine, exc)
            return tree
        return dataclasses.replace(tree, container=container, cgroup=cgroup)

