"""CPU package energy from RAPL through the kernel's powercap sysfs: what a CPU engine costs.

Layout (Documentation/power/powercap/powercap.rst): `/sys/class/powercap/<zone>/` with `name`
("package-0", "core", "uncore", "dram", "psys"), `energy_uj` (a counter in microjoules) and
`max_energy_range_uj` (its largest value before it wraps to 0: below). Top-level zones are `intel-rapl:N`;
their sub-zones `intel-rapl:N:M` are parts of the package and are not added again. AMD's Zen CPUs register
their RAPL domains under the same `intel-rapl` control type (the kernel's rapl driver drives both, as far as
I know: not seen on an AMD machine here); any other control type whose zone is named `package-N` is read the
same way. An `intel-rapl-mmio:N` zone repeats an `intel-rapl:N` package on some Intel laptops: one of the two
is read.

Since Linux 5.10 `energy_uj` is readable by root only (CVE-2020-8694, the PLATYPUS power side channel); the
reader then says why, the safer ways to read it (as root, or a group's udev rule) and what `chmod o+r` costs.
The sum over packages is kept as a counter that only rises: each zone's wraps are undone between two reads, so
it must be read at least once a wrap period (RaplSpan reads every READ_EVERY_S).

The wrap, exactly (drivers/powercap/intel_rapl_common.c, which drives Intel's and AMD's RAPL alike): the
hardware counter is the 32-bit ENERGY_STATUS register, in energy units of U nJ (10^9 / 2^ESU, from the unit
register); `energy_uj` is raw x U / 1000 and `max_energy_range_uj` is 0xffffffff x U / 1000: the largest
value shown, not the modulus. The register goes from 0xffffffff to 0 one unit on, so the counter's period is
2^32 units = max_energy_range_uj x 2^32 / (2^32 - 1): one energy unit (61 or 15.3 µJ on most CPUs) more than
max_energy_range_uj, not 0 or 1 µJ more. (Each reading is truncated to whole µJ: under 1 µJ of error stays.)

A step back is not always a wrap: the register also starts again from 0 (a suspend and resume, a CPU reset,
the zone registered again), and taking that for a wrap would add a whole range, 65-262 kJ, that was never
drawn. A wrap needs the counter near its range before and near 0 after, so what a wrap would mean (the period
less the value before, plus the value after) must be energy the package could have drawn in the seconds
between the two reads: at most the zone's `max_w` (twice the largest constraint_N_max_power_uw it reports,
else DEFAULT_MAX_W) for them. A step back that would mean more is a reset: nothing is counted for that step
(when in it the reset came, and what was drawn before it, is not known), and the reading says so (`note`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.base.paths import sysfs_root
from tui.sources.sysfs_files import read_text

log = logging.getLogger(__name__)

POWERCAP = Path("class") / "powercap"
RESCAN_S = 30.0  # no package found: look again this often (a module loaded later)
STATUS_STATES = 1 << 32  # the ENERGY_STATUS register's 32 bits (intel_rapl_common.c ENERGY_STATUS_MASK)
# A span's reads: the smallest range the rapl driver shows (ESU 16: 65.5 kJ) lasts 131 s at 500 W, more than
# any one package draws; a read every 5 s stays well under a wrap period
READ_EVERY_S = 5.0
# A wrap's plausibility. The package's own bound is its largest constraint_N_max_power_uw (the maximum power
# the CPU reports for its power limits, where it reports one), twice that as headroom for bursts above it;
# where none is readable (no power limits on AMD's RAPL; 0 on many clients), DEFAULT_MAX_W: twice the 500 W
# the largest server packages are rated for today. Generous on purpose: a wrap taken for a reset loses a whole
# range too, so only a step back that no package could have drawn is called a reset.
HEADROOM = 2.0
DEFAULT_MAX_W = 1000.0
# The clock is read once a read, not at each counter's own read: a slow sysfs read or a preempted thread
# between them is allowed for at the bound's power
READ_SLACK_S = 0.05


def wrap_period_uj(max_energy_range_uj: int) -> float:
    """The µJ after which energy_uj is back where it was: 2^32 energy units, where max_energy_range_uj is
    2^32 - 1 of them (see the module's docstring)."""
    return max_energy_range_uj * STATUS_STATES / (STATUS_STATES - 1)


def step_uj(before_uj: int, now_uj: int, max_energy_range_uj: int | None, seconds: float,
            max_w: float) -> tuple[float, bool]:
    """The energy between two readings of one zone's energy_uj `seconds` apart, and whether the step back was
    a reset: a rise is itself; a step back is a wrap (the period - before + now) only when that is at most
    what `max_w` draws in the time between (plus READ_SLACK_S), else a reset and 0 (module docstring). With
    no range known, a step back is a reset too."""
    if now_uj >= before_uj:
        return float(now_uj - before_uj), False
    if max_energy_range_uj is None:
        return 0.0, True
    wrapped = wrap_period_uj(max_energy_range_uj) - before_uj + now_uj
    if 0 <= wrapped <= max_w * 1e6 * (max(seconds, 0.0) + READ_SLACK_S):
        return wrapped, False
    return 0.0, True


@dataclass(frozen=True, slots=True)
class RaplReading:
    """The packages' energy now: joules (wraps undone, summed over packages) or why not."""

    joules: float | None
    domains: tuple[str, ...] = ()
    error: str | None = None
    note: str | None = None  # a step back taken for a reset at this read: nothing counted for it, and why


@dataclass
class _Zone:
    path: Path
    label: str  # "intel-rapl:0 package-0"
    max_uj: int | None
    max_w: float = DEFAULT_MAX_W  # the most this package could draw: what a wrap may mean (module docstring)
    last_uj: int | None = None
    last_t: float | None = None
    total_j: float = 0.0  # since the first read, wraps undone, plus the counter's value at that read


# Lets one group read every powercap zone's counter from each boot on (/etc/udev/rules.d/, then
# `udevadm trigger -s powercap`): the zone's device path is %p, TEST skips the control types (no counter)
UDEV_RULE = ('ACTION=="add", SUBSYSTEM=="powercap", TEST=="energy_uj", '
             'RUN+="/bin/chgrp power /sys%p/energy_uj", RUN+="/bin/chmod g+r /sys%p/energy_uj"')


def root_only_line(paths: list[Path]) -> str:
    """What a user needs when RAPL's counters are root-only (Linux >= 5.10, CVE-2020-8694): why they are, the
    safer ways to read them (enginetop run as root, or one group given read access by a udev rule), and what
    the quick chmod costs: energy_uj readable by every local user is the PLATYPUS power side channel, which
    can leak secrets (AES keys, KASLR) from other processes through the CPU's power draw."""
    shown = " ".join(str(p) for p in paths)
    return (f"CPU energy (RAPL) is readable by root only here (since Linux 5.10: the PLATYPUS power side "
            f"channel, CVE-2020-8694): run enginetop as root, or let one group (here `power`) read it with a "
            f"udev rule in /etc/udev/rules.d/: `{UDEV_RULE}`. `sudo chmod o+r {shown}` works until the next "
            "boot but re-opens that side channel to every local user")


class RaplReader:
    """Reads every CPU package's RAPL energy counter. `read_file` is injectable: a test raises the
    PermissionError a non-root user gets (tests run as root here, where chmod cannot produce one)."""

    def __init__(self, root: Path | None = None, read_file: Callable[[Path], str] = read_text,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._root = root
        self._read = read_file
        self._zones: list[_Zone] | None = None
        self._next_scan = float("-inf")
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else sysfs_root()

    def _scan(self) -> list[_Zone]:
        base = self.root / POWERCAP
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return []
        found: dict[str, _Zone] = {}
        for entry in entries:
            if entry.name.count(":") != 1:  # the control type itself, or a sub-zone of a package
                continue
            try:
                name = self._read(entry / "name").strip()
            except OSError:
                continue
            if not name.startswith("package"):
                continue
            max_uj = None
            with contextlib.suppress(OSError, ValueError):
                max_uj = int(self._read(entry / "max_energy_range_uj").strip())
            zone = _Zone(entry, f"{entry.name} {name}", max_uj, self._max_w(entry))
            # the same package under intel-rapl and intel-rapl-mmio: keep the MSR one (intel-rapl)
            key = f"{name}:{entry.name.split(':')[1]}"
            if key not in found or "mmio" in found[key].path.name:
                found[key] = zone
        return list(found.values())

    def _max_w(self, zone: Path) -> float:
        """The most the package could draw (module docstring): HEADROOM x its largest readable
        constraint_N_max_power_uw, else DEFAULT_MAX_W."""
        found = []
        for path in sorted(zone.glob("constraint_*_max_power_uw")):
            with contextlib.suppress(OSError, ValueError):
                found.append(int(self._read(path).strip()))
        largest = max((uw for uw in found if uw > 0), default=None)
        return HEADROOM * largest / 1e6 if largest is not None else DEFAULT_MAX_W

    def read(self) -> RaplReading:
        with self._lock:
            return self._read_locked()

    def _read_locked(self) -> RaplReading:
        if not self._zones:
            now = self._clock()
            if now < self._next_scan:
                return RaplReading(None, error=self._none_line())
            self._next_scan = now + RESCAN_S
            self._zones = self._scan()
            if not self._zones:
                return RaplReading(None, error=self._none_line())
        denied: list[Path] = []
        other: list[str] = []
        raws: list[tuple[_Zone, int]] = []
        now = self._clock()
        for zone in self._zones:
            path = zone.path / "energy_uj"
            try:
                raws.append((zone, int(self._read(path).strip())))
            except PermissionError:
                denied.append(path)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    denied.append(path)
                else:
                    other.append(f"{path}: {exc.strerror or exc}")
            except ValueError as exc:
                other.append(f"{path}: not a number ({exc})")
        domains = tuple(z.label for z in self._zones)
        if denied:
            return RaplReading(None, domains, root_only_line(denied))
        if other:
            return RaplReading(None, domains, "CPU energy (RAPL) unreadable: " + "; ".join(other))
        total = 0.0
        resets = []
        for zone, raw in raws:
            if zone.last_uj is None or zone.last_t is None:
                zone.total_j = raw / 1e6
            else:
                seconds = now - zone.last_t
                delta, reset = step_uj(zone.last_uj, raw, zone.max_uj, seconds, zone.max_w)
                if reset:
                    resets.append(self._reset_words(zone, raw, seconds))
                zone.total_j += delta / 1e6
            zone.last_uj, zone.last_t = raw, now
            total += zone.total_j
        note = "; ".join(resets) or None
        if note:
            log.warning("%s", note)
        return RaplReading(total, domains, note=note)

    @staticmethod
    def _reset_words(zone: _Zone, raw: int, seconds: float) -> str:
        before = zone.last_uj or 0
        went = (f"{zone.label}: energy_uj went back from {before / 1e6:,.1f} J to {raw / 1e6:,.1f} J in "
                f"{seconds:.1f} s")
        if zone.max_uj is None:
            return f"{went} (no max_energy_range_uj: no wrap can be told): a reset, nothing counted for it"
        wrapped = (wrap_period_uj(zone.max_uj) - before + raw) / 1e6
        return (f"{went}: as a wrap that is {wrapped:,.0f} J, more than the package draws at "
                f"{zone.max_w:.0f} W: a reset (a resume from suspend, a CPU reset), nothing counted for it")

    def _none_line(self) -> str:
        return (f"no CPU package energy: no RAPL package zone under {self.root / POWERCAP} (a VM, a CPU or "
                "kernel without the powercap rapl driver)")


class RaplSpan:
    """The CPU packages' energy from when it is made to `result()`: its own reader, so its baseline and wraps
    are its own (an A/B block, a bench run). A run longer than a wrap period needs reads in between: `tick()`
    from the caller's own loop, or `with RaplSpan() as span:`, which reads every `every_s` from a thread until
    the block ends; `result()` sums the changes between all of them, each wrap undone."""

    def __init__(self, reader: RaplReader | None = None, clock: Callable[[], float] = time.monotonic,
                 every_s: float = READ_EVERY_S) -> None:
        self._reader = reader or RaplReader()
        self._clock = clock
        self._every = every_s
        self._t0 = clock()
        self._notes: list[str] = []  # each reset seen in the span (RaplReading.note), said in its result
        self._start = self._read()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> RaplReading:
        reading = self._reader.read()
        if reading.note:
            self._notes.append(reading.note)
        return reading

    def tick(self) -> None:
        """Read the counters now: the change since the last read is kept, a wrap in it undone."""
        self._read()

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            self.tick()

    def __enter__(self) -> RaplSpan:
        self._thread = threading.Thread(target=self._loop, name="rapl-span", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def result(self) -> dict[str, Any]:
        """{"cpu_energy_j", "cpu_energy_s", "cpu_energy_error", "cpu_energy_note"}: joules since the start,
        or why not; the note says each reset in the span (its step counted nothing: the joules fall short)."""
        end = self._read()
        seconds = self._clock() - self._t0
        note = "; ".join(dict.fromkeys(self._notes)) or None
        if self._start.joules is None or end.joules is None:
            return {"cpu_energy_j": None, "cpu_energy_s": seconds,
                    "cpu_energy_error": end.error or self._start.error, "cpu_energy_note": note}
        return {"cpu_energy_j": end.joules - self._start.joules, "cpu_energy_s": seconds,
                "cpu_energy_error": None, "cpu_energy_note": note}
