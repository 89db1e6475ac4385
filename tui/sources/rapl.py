"""CPU package energy from RAPL through the kernel's powercap sysfs: what a CPU engine costs.

Layout (Documentation/power/powercap/powercap.rst): `/sys/class/powercap/<zone>/` with `name`
("package-0", "core", "uncore", "dram", "psys"), `energy_uj` (a counter in microjoules) and
`max_energy_range_uj` (its largest value before it wraps to 0: below). Top-level zones are `intel-rapl:N`;
their sub-zones `intel-rapl:N:M` are parts of the package and are not added again. AMD's Zen CPUs register
their RAPL domains under the same `intel-rapl` control type (the kernel's rapl driver drives both, as far as
I know: not seen on an AMD machine here); any other control type whose zone is named `package-N` is read the
same way. An `intel-rapl-mmio:N` zone repeats an `intel-rapl:N` package on some Intel laptops: one of the two
is read.

Since Linux 5.10 `energy_uj` is readable by root only (CVE-2020-8694); the reader then says the one line that
makes it readable. The sum over packages is kept as a counter that only rises: each zone's wraps are undone
between two reads, so it must be read at least once a wrap period (RaplSpan reads every READ_EVERY_S).

The wrap, exactly (drivers/powercap/intel_rapl_common.c, which drives Intel's and AMD's RAPL alike): the
hardware counter is the 32-bit ENERGY_STATUS register, in energy units of U nJ (10^9 / 2^ESU, from the unit
register); `energy_uj` is raw x U / 1000 and `max_energy_range_uj` is 0xffffffff x U / 1000: the largest
value shown, not the modulus. The register goes from 0xffffffff to 0 one unit on, so the counter's period is
2^32 units = max_energy_range_uj x 2^32 / (2^32 - 1): one energy unit (61 or 15.3 µJ on most CPUs) more than
max_energy_range_uj, not 0 or 1 µJ more. (Each reading is truncated to whole µJ: under 1 µJ of error stays.)
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

log = logging.getLogger(__name__)

POWERCAP = Path("class") / "powercap"
RESCAN_S = 30.0  # no package found: look again this often (a module loaded later)
STATUS_STATES = 1 << 32  # the ENERGY_STATUS register's 32 bits (intel_rapl_common.c ENERGY_STATUS_MASK)
# A span's reads: the smallest range the rapl driver shows (ESU 16: 65.5 kJ) lasts 131 s at 500 W, more than
# any one package draws; a read every 5 s stays well under a wrap period
READ_EVERY_S = 5.0


def wrap_period_uj(max_energy_range_uj: int) -> float:
    """The µJ after which energy_uj is back where it was: 2^32 energy units, where max_energy_range_uj is
    2^32 - 1 of them (see the module's docstring)."""
    return max_energy_range_uj * STATUS_STATES / (STATUS_STATES - 1)


def read_text(path: Path) -> str:
    with open(path) as f:
        return f.read()


@dataclass(frozen=True, slots=True)
class RaplReading:
    """The packages' energy now: joules (wraps undone, summed over packages) or why not."""

    joules: float | None
    domains: tuple[str, ...] = ()
    error: str | None = None


@dataclass
class _Zone:
    path: Path
    label: str  # "intel-rapl:0 package-0"
    max_uj: int | None
    last_uj: int | None = None
    total_j: float = 0.0  # since the first read, wraps undone, plus the counter's value at that read


def root_only_line(paths: list[Path]) -> str:
    """The one line a user needs when RAPL's counters are root-only (Linux >= 5.10)."""
    shown = " ".join(str(p) for p in paths)
    return (f"CPU energy (RAPL) is readable by root only here: `sudo chmod o+r {shown}` makes it readable "
            "(until the next boot)")


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
            zone = _Zone(entry, f"{entry.name} {name}", max_uj)
            # the same package under intel-rapl and intel-rapl-mmio: keep the MSR one (intel-rapl)
            key = f"{name}:{entry.name.split(':')[1]}"
            if key not in found or "mmio" in found[key].path.name:
                found[key] = zone
        return list(found.values())

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
        for zone, raw in raws:
            if zone.last_uj is None:
                zone.total_j = raw / 1e6
            else:
                delta: float = raw - zone.last_uj
                if delta < 0:  # the register wrapped (no range known: a reset, and 0 is the best guess)
                    delta = delta + wrap_period_uj(zone.max_uj) if zone.max_uj is not None else 0.0
                    if delta < 0:
                        delta = 0.0
                zone.total_j += delta / 1e6
            zone.last_uj = raw
            total += zone.total_j
        return RaplReading(total, domains)

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
        self._start = self._reader.read()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        """Read the counters now: the change since the last read is kept, a wrap in it undone."""
        self._reader.read()

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
        """{"cpu_energy_j", "cpu_energy_s", "cpu_energy_error"}: joules since the start, or why not."""
        end = self._reader.read()
        seconds = self._clock() - self._t0
        if self._start.joules is None or end.joules is None:
            return {"cpu_energy_j": None, "cpu_energy_s": seconds,
                    "cpu_energy_error": end.error or self._start.error}
        return {"cpu_energy_j": end.joules - self._start.joules, "cpu_energy_s": seconds,
                "cpu_energy_error": None}
