"""Energy from counters: per GPU and for the CPU package over a window, and over a span between two readings
(a probe, an A/B block, a bench run). Pure arithmetic over samples; nothing here reads a device.

The one rule: a device's own energy counter (NVML's total energy, hwmon's energy1_input, dcgm's field 156,
RAPL's energy_uj with its wraps undone) over the span when it is there and moved; power x time (trapezoids
between the power readings) where it is missing or did not move, and the figure says which
(`source`). A figure never adds a counter's joules to power x time joules without saying so.

Whose energy it is: who holds each GPU (`holders`, below) here; an engine's share of the window's energy, per
generated token, in tui.sources.attribution.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tui.model.samples import EnergySource, EnergyWindow, GpuReport, GpuSample

COUNTER: EnergySource = "counter"
POWER_TIME: EnergySource = "power × time"
MIXED = "counter + power × time"
# NVML's counter moves every 20-100 ms; a span shorter than this, or with fewer than two readings inside it,
# is too short to read (what a probe says instead of a figure)
MIN_SPAN_S = 1.0
IDLE_KEPT = 30  # intervals of an idle stretch averaged into idle power
TOO_SHORT = "too short to read"


@dataclass(frozen=True, slots=True)
class Point:
    t: float
    energy_j: float | None  # the counter
    power_w: float | None


def merge_sources(sources: Iterable[str]) -> str | None:
    found = sorted(set(sources))
    if not found:
        return None
    return found[0] if len(found) == 1 else MIXED


def _trapezoid(points: Sequence[Point]) -> float | None:
    powered = [p for p in points if p.power_w is not None]
    if len(powered) < 2:
        return None
    return sum((b.t - a.t) * ((a.power_w or 0.0) + (b.power_w or 0.0)) / 2
               for a, b in itertools.pairwise(powered))


def energy_of_readings(points: Sequence[Point]) -> tuple[float, float, EnergySource, str | None] | None:
    """(joules, seconds, source, note) over `points` (time order): the counter's change, else power x time."""
    counted = [p for p in points if p.energy_j is not None]
    note = None
    if len(counted) >= 2:
        first, last = counted[0], counted[-1]
        seconds = last.t - first.t
        moved = last.energy_j - first.energy_j  # type: ignore[operator]
        if seconds > 0 and moved > 0:
            return _with_ends(points, first, last, moved, seconds)
        if moved < 0:
            note = "the energy counter went back (driver reloaded): power × time"
        elif seconds > 0:
            note = f"the energy counter did not move in {seconds:.0f} s: power × time"
    elif any(p.power_w is not None for p in points):
        note = "no energy counter: power × time"
    joules = _trapezoid(points)
    powered = [p for p in points if p.power_w is not None]
    if joules is None or powered[-1].t <= powered[0].t:
        return None
    return joules, powered[-1].t - powered[0].t, POWER_TIME, note


def _with_ends(points: Sequence[Point], first: Point, last: Point, moved: float,
               seconds: float) -> tuple[float, float, EnergySource, str | None]:
    """The counter's change from its first to its last reading, and the readings before and after those (a
    reading whose counter was not read: amd-smi is asked every few seconds) at power x time, or at the
    counter's mean power where they have none: the whole span, never the counter's part of it alone."""
    joules, source = moved, COUNTER
    for part in ([p for p in points if p.t <= first.t], [p for p in points if p.t >= last.t]):
        if len(part) >= 2 and part[-1].t > part[0].t:
            measured = _trapezoid(part)
            joules += measured if measured is not None else (part[-1].t - part[0].t) * moved / seconds
            source = POWER_TIME
    if source is COUNTER:
        return joules, seconds, COUNTER, None
    return (joules, points[-1].t - points[0].t, POWER_TIME,
            "the counter was not read at the span's ends: power x time there")


class Track:
    """One device's readings over the last `keep_s` seconds, and its idle power."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.points: deque[Point] = deque()
        self._idle: deque[float] = deque(maxlen=IDLE_KEPT)
        self._last_idle: bool | None = None

    def add(self, point: Point, idle: bool | None) -> None:
        """`idle`: every engine on the device served nothing at this reading (None: unknown). An interval
        between two idle readings adds to the idle power; a new idle stretch starts it again."""
        previous = self.points[-1] if self.points else None
        if previous is not None and point.t <= previous.t:
            return  # a replayed or repeated report
        if idle and not self._last_idle:
            self._idle.clear()
        elif idle and previous is not None:
            interval = energy_of_readings([previous, point])
            if interval is not None:
                self._idle.append(interval[0] / interval[1])
        self._last_idle = idle
        self.points.append(point)
        while len(self.points) > 2 and point.t - self.points[1].t >= self.keep_s:
            self.points.popleft()

    @property
    def idle_w(self) -> float | None:
        return sum(self._idle) / len(self._idle) if self._idle else None

    def window(self, window_s: float) -> EnergyWindow | None:
        """Energy over the last `window_s` seconds: from the oldest reading at or after its start (never the
        newest alone: two readings at least, however far apart)."""
        if len(self.points) < 2:
            return None
        end = self.points[-1].t
        inside = [p for p in self.points if p.t >= end - window_s]
        if len(inside) < 2:
            inside = list(self.points)[-2:]
        got = energy_of_readings(inside)
        if got is None:
            return None
        joules, seconds, source, note = got
        return EnergyWindow(seconds=seconds, joules=joules, watts=joules / seconds, source=source,
                            idle_w=self.idle_w, note=note)

    def between(self, t0: float, t1: float) -> tuple[float, EnergySource] | str:
        """Energy from t0 to t1 by linear interpolation of the counter (or of power x time) between readings,
        and what it came from: "counter" only when every part did, else "power × time"; a reason in words
        when the span cannot be read: shorter than MIN_SPAN_S, or fewer than two readings inside it."""
        if t1 - t0 < MIN_SPAN_S:
            return f"{TOO_SHORT} ({t1 - t0:.2f} s; the counter moves every 20-100 ms)"
        pts = list(self.points)
        inside = [p for p in pts if t0 <= p.t <= t1]
        if len(inside) < 2:
            gap = pts[-1].t - pts[-2].t if len(pts) >= 2 else None
            every = f"read every {gap:.1f} s" if gap else "read too rarely"
            return f"{TOO_SHORT} ({t1 - t0:.1f} s: under two energy readings in it, {every})"
        before = [p for p in pts if p.t < t0][-1:]
        after = [p for p in pts if p.t > t1][:1]
        got = energy_of_readings(inside)
        if got is None:
            return "no energy reading"
        joules, seconds, source, _ = got
        inner_w = joules / seconds
        used = {source}

        def rate(pair: list[Point]) -> float:
            edge = energy_of_readings(pair)
            if edge is None:
                return inner_w
            used.add(edge[2])
            return edge[0] / edge[1]

        # the edges outside the readings, at the power of the interval around each (linear interpolation)
        if inside[0].t > t0:
            joules += (inside[0].t - t0) * (rate([before[0], inside[0]]) if before else inner_w)
        if t1 > inside[-1].t:
            joules += (t1 - inside[-1].t) * (rate([inside[-1], after[0]]) if after else inner_w)
        # labelled by what was used: an edge at power x time beside the counter's inside makes the whole
        # figure power x time's (never "counter" over joules partly from power readings)
        return joules, COUNTER if used == {COUNTER} else POWER_TIME


# ---- who holds what -----------------------------------------------------------------------------------


def gpu_key(g: GpuSample) -> tuple[str, int, str]:
    return g.host or "", g.index, g.uuid or ""


# Read from sysfs (tui.sources.sysfs_gpu): their processes are listed only for the PIDs enginetop was given,
# so another program using the GPU is never seen. NVML lists every process on an NVIDIA GPU.
PARTIAL_PROCESS_LISTS = frozenset(("AMD", "Intel"))


def lists_every_process(g: GpuSample) -> bool:
    """Does the GPU's process list show every process on it (NVML), so "alone on it" can be said?"""
    return g.vendor not in PARTIAL_PROCESS_LISTS


# VRAM in use beyond what the listed processes hold, above which someone unlisted is on the GPU: NVML inside
# a container's PID namespace lists no process (or none of the host's), and a driver's own reservation and a
# desktop stay under it
UNSEEN_VRAM_BYTES = 1 << 30


def unseen_vram(g: GpuSample) -> int | None:
    """The GPU's used VRAM that no listed process holds (None where a process's share is not reported)."""
    if g.vram_used_bytes is None or any(p.used_bytes is None for p in g.processes):
        return None
    return g.vram_used_bytes - sum(p.used_bytes or 0 for p in g.processes)


def used_unseen(g: GpuSample) -> bool:
    unseen = unseen_vram(g)
    return unseen is not None and unseen > UNSEEN_VRAM_BYTES


def may_hold_an_engine(g: GpuSample) -> bool:
    """Could an engine whose processes enginetop did not find on any GPU be on this one after all? A compute
    process it cannot name, VRAM its complete list (NVML) does not account for, or no reading at all. A
    desktop's graphics processes (Xorg) and AMD's or Intel's partial lists are no such sign: a CPU engine on a
    workstation keeps its figure."""
    if g.error:
        return True
    if any(p.engine is None and not p.graphics for p in g.processes):
        return True
    return lists_every_process(g) and used_unseen(g)


def holders(g: GpuSample) -> tuple[set[str], bool]:
    """The watched engines holding the GPU, and whether a process enginetop cannot name holds it too: one
    listed without an engine, or, on a GPU whose list should be complete (NVML), VRAM in use that no listed
    process holds. (AMD's and Intel's lists are partial anyway: their figures say the whole GPU's.)"""
    named = {p.engine for p in g.processes if p.engine is not None}
    return named, any(p.engine is None for p in g.processes) or (lists_every_process(g) and used_unseen(g))


def gpu_label(gpus: Sequence[GpuSample]) -> str:
    where = gpus[0].host + " " if gpus and gpus[0].host else ""
    return f"{where}gpu " + "+".join(str(g.index) for g in gpus)


def whole_gpu_words(gpus: Sequence[GpuSample]) -> str | None:
    """For GPUs whose process lists are partial: the scope's words saying the figure is the whole GPUs'."""
    return _whole_words({g.vendor or "" for g in gpus if not lists_every_process(g)})


def _whole_words(vendors: set[str]) -> str | None:
    if not vendors:
        return None
    return f"the whole GPU: {'/'.join(sorted(vendors))} sysfs cannot show other processes on it"


# ---- a span between readings (A/B blocks, bench runs) ---------------------------------------------------


def span_of_reports(reports: Sequence[GpuReport]) -> dict[str, Any]:
    """Every GPU's energy over the reports (the first to the last): summed over all of them (joules, seconds,
    source: what the GPU panel's block summary shows), and each GPU's apart with who held it meanwhile
    ("energy_gpus": index, joules, seconds, source, note, the watched engines on it, whether an unnamed
    process was, whether its process list is complete), which run_energy attributes from. A GPU that reads
    neither power nor energy is listed with no joules; one that could not be read at all in "energy_gpus_
    unreadable"; a GPU lost after its first reading (an error, or gone from the reports) makes the span
    "sampling_failed": its readings stop short of the run."""
    tracks: dict[tuple[str, int, str], list[Point]] = {}
    held: dict[tuple[str, int, str], dict[str, Any]] = {}
    busy: set[int] = set()
    unreadable: dict[tuple[str, int, str], int] = {}
    lost: dict[int, str] = {}
    for report in reports:
        present = set()
        for g in report.gpus:
            key = gpu_key(g)
            present.add(key)
            if g.error:
                if key in tracks:
                    lost.setdefault(g.index, g.error)
                else:
                    unreadable[key] = g.index
                continue
            tracks.setdefault(key, []).append(Point(g.t, g.energy_j, g.power_w))
            info = held.setdefault(key, {"index": g.index, "engines": set(), "unnamed": False,
                                         "unseen": False, "vendor": g.vendor,
                                         "complete": lists_every_process(g)})
            named, other = holders(g)
            info["engines"] |= named
            info["unnamed"] = info["unnamed"] or other
            info["unseen"] = info["unseen"] or may_hold_an_engine(g)
            if g.processes:
                busy.add(g.index)
        for key in set(tracks) - present:
            lost.setdefault(held[key]["index"], report.unavailable or "gone from the GPU readings")
    joules = 0.0
    seconds = 0.0
    sources = []
    notes = []
    per_gpu = []
    for key, points in tracks.items():
        info = held[key]
        got = energy_of_readings(points)
        if got is None:
            dark = f"gpu {info['index']} reports neither power nor an energy counter"
            per_gpu.append({**info, "engines": sorted(info["engines"]), "energy_j": None, "energy_s": None,
                            "energy_source": None, "energy_note": dark})
            continue
        joules += got[0]
        seconds = max(seconds, got[1])
        sources.append(got[2])
        if got[3]:
            notes.append(got[3])
        per_gpu.append({**info, "engines": sorted(info["engines"]), "energy_j": got[0], "energy_s": got[1],
                        "energy_source": got[2], "energy_note": got[3]})
    out: dict[str, Any] = {"energy_j": joules if sources else None, "energy_s": seconds if sources else None,
                           "energy_source": merge_sources(sources),
                           "energy_note": "; ".join(dict.fromkeys(notes)) or None,
                           "energy_gpus_busy": sorted(busy),
                           "energy_gpus": sorted(per_gpu, key=lambda x: x["index"]),
                           "energy_gpus_unreadable": sorted(set(unreadable.values()) - set(lost))}
    if lost:
        said = "; ".join(f"gpu {i}: {why}" for i, why in sorted(lost.items()))
        out.update(energy_j=None, energy_s=None, energy_source=None, sampling_failed=True,
                   energy_note=f"a GPU was lost during the run ({said}): no energy figure")
    return out


def _run_scope(gpus: list[dict[str, Any]], engine: str | None, matched: bool) -> str:
    """Whose the summed GPUs' energy is, in words: exactly the GPUs summed, and who else was on them."""
    label = "gpu " + "+".join(str(g["index"]) for g in gpus)
    if not matched:
        return f"{label} (held a compute process over the run, not matched to the engine's processes)"
    others = sorted({e for g in gpus for e in g["engines"]} - {engine or ""})
    if any(g["unnamed"] for g in gpus):
        others.append("a process enginetop does not watch")
    whole = _whole_words({g.get("vendor") or "" for g in gpus if not g.get("complete", True)})
    if whole:
        return f"{label} ({whole}" + (f"; shared with {', '.join(others)})" if others else ")")
    return f"{label} (shared with {', '.join(others)})" if others else f"{label} (the engine's alone)"


def run_energy(gpu: dict[str, Any] | None, cpu: dict[str, Any] | None, tokens: int | None,
               local: bool, engine: str | None = None) -> dict[str, Any]:
    """What a run (an A/B block, a bench run) cost per generated token, for an engine on this machine only:
    the energy of the GPUs that held the engine's processes over it (span_of_reports' "energy_gpus"; `engine`
    names it, given when its processes were known to the sampler); its processes unknown, of the GPUs that
    held any compute process; on no GPU, the CPU package's (RaplSpan.result). The scope names exactly the
    GPUs summed. `gpu` with "sampling_failed": its readings stopped short of the run, so no figure
    (not the CPU package's either). JSON-ready: energy_j, energy_s, energy_source, energy_scope, energy_note,
    joules_per_token, tokens_per_joule."""
    out: dict[str, Any] = {"energy_j": None, "energy_s": None, "energy_source": None, "energy_scope": None,
                              "energy_note": None, "joules_per_token": None, "tokens_per_joule": None}
    if not local:
        out["energy_note"] = "the engine is not on this machine: its energy is not read here"
        return out
    gpu = gpu or {}
    cpu = cpu or {}
    if gpu.get("sampling_failed"):  # the GPU readings stop short: the CPU package is no stand-in for them
        out["energy_note"] = gpu.get("energy_note")
        return out
    per_gpu: list[dict[str, Any]] = gpu.get("energy_gpus") or []
    mine = [g for g in per_gpu if engine is not None and engine in g["engines"]]
    busy = [g for g in per_gpu if g["engines"] or g["unnamed"]]
    summed = mine or (busy if engine is None else [])
    unnamed = [g for g in per_gpu if g.get("unseen")]  # may hold the engine (may_hold_an_engine)
    unreadable = gpu.get("energy_gpus_unreadable") or []
    dark = [g for g in summed if g["energy_j"] is None]
    if dark:
        out["energy_note"] = "; ".join(g["energy_note"] for g in dark) + ": no energy figure"
        return out
    if not summed and (unnamed or unreadable):  # as the column says it (attribute)
        where = "gpu " + "+".join(str(i) for i in sorted({g["index"] for g in unnamed} | set(unreadable)))
        out["energy_note"] = (f"not attributed: its processes held no GPU, but {where} had processes "
                              "enginetop cannot name (a container?) or could not be read")
        return out
    if not summed and engine is None and cpu.get("cpu_energy_j") is not None:
        # the CPU package's joules only for an engine seen on no GPU: here it was not seen at all
        out["energy_note"] = ("not attributed: the engine's processes were not found on this machine, so "
                              "whether it ran on a GPU or the CPU is not known")
        return out
    if summed:
        notes = [g["energy_note"] for g in summed if g.get("energy_note")]
        out.update(energy_j=sum(g["energy_j"] for g in summed),
                   energy_s=max(g["energy_s"] for g in summed),
                   energy_source=merge_sources(g["energy_source"] for g in summed),
                   energy_scope=_run_scope(summed, engine, bool(mine)),
                   energy_note="; ".join(dict.fromkeys(notes)) or None)
    elif cpu.get("cpu_energy_j") is not None:
        # the note: a reset of the counter in the run (RaplSpan), whose step counted nothing
        out.update(energy_j=cpu["cpu_energy_j"], energy_s=cpu.get("cpu_energy_s"), energy_source=COUNTER,
                   energy_scope="cpu package", energy_note=cpu.get("cpu_energy_note"))
    else:
        out["energy_note"] = cpu.get("cpu_energy_error") or gpu.get("energy_note") or "no energy reading"
        return out
    if out["energy_s"] is not None and out["energy_s"] < MIN_SPAN_S:  # the counter moves every 20-100 ms
        return {**out, "energy_j": None, "energy_s": None, "energy_source": None, "energy_scope": None,
                "energy_note": f"{TOO_SHORT} ({out['energy_s']:.2f} s; the counter moves every 20-100 ms)"}
    joules = float(out["energy_j"])
    if tokens:
        out["joules_per_token"] = joules / tokens
        out["tokens_per_joule"] = tokens / joules if joules > 0 else None
    return out
