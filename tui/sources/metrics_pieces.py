"""/metrics parsed family by family, each family's parse kept while its lines keep their shape.

prometheus_client's parser is pure Python and reads a label set character by character (~25 µs a line
here): on a vLLM under traffic, its eight histograms' ~200 selected lines were a third of the dashboard's
CPU (bench/bench_cycle.py). Between two polls an engine's series stay the same and only their values move,
so each family's piece (its headers and samples, `by_family`) is parsed by the library once per shape: the
piece with every sample's value cut off. A piece of a known shape takes the new values into the samples the
library made (same names, same labels, same families and order). Every piece that is not plainly one
sample a line (tabs, quotes outside a label set, exemplars, more than a value and a timestamp, a value the
library would read otherwise) is parsed by the library each time, and a shape is kept only where the
library's own values for that piece were read the same here: what comes out is what the library gives for
the whole text (tests/test_metrics_pieces.py checks it on every captured body and on growing ones).
"""

from __future__ import annotations

import copy
import threading

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

HEADER_PREFIXES = ("# HELP ", "# TYPE ")  # a family's header lines (tui.sources.metrics selects by them too)
SERIES = "\x00"  # starts a sample's series in a shape: never taken for a comment
Value = tuple[int | float, float | None]  # a sample's value and timestamp, as the library reads them


def by_family(selected: str) -> list[tuple[str, str]]:
    """The selected text cut where the headers of another family begin: (family, piece), each piece one
    family's headers and samples (a family announced again stays in its piece; untyped samples stay with the
    family before them, as the parser reads them; samples before any header are a piece of their own)."""
    pieces: list[tuple[str, list[str]]] = [("", [])]
    family = None
    for line in selected.splitlines():
        if line.startswith(HEADER_PREFIXES):
            name = line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
            if name != family:
                if pieces[-1][1]:
                    pieces.append((name, []))
                else:
                    pieces[-1] = (name, [])
            family = name
        pieces[-1][1].append(line)
    return [(name, "\n".join(lines) + "\n") for name, lines in pieces if lines]


def _number(text: str) -> int | float:
    """As the library reads a value: an integer where it is one, else a float; ValueError otherwise."""
    if "_" in text:  # Python reads 1_000; the exposition format does not
        raise ValueError(text)
    try:
        return int(text)
    except ValueError:
        return float(text)


def _split(line: str) -> tuple[str, Value] | None:
    """A sample line as (its series: name and labels, its value and timestamp); None where the split is not
    plainly the library's (it is then parsed by the library)."""
    if "\t" in line or " # " in line:
        return None
    if "{" in line:
        end = line.rfind("}") + 1  # values and timestamps hold no `}`: the label set ends at the last one
        if end == 0:
            return None
        head, tail = line[:end], line[end:]
    else:
        if '"' in line:
            return None
        head, _, tail = line.partition(" ")
    if '"' in tail:
        return None
    values = [v.strip() for v in tail.lstrip().split(" ") if v.strip()]  # as the library splits them
    try:
        if len(values) == 1:
            return head, (_number(values[0]), None)
        if len(values) == 2:
            return head, (_number(values[0]), _number(values[1]) / 1000)
    except (ValueError, OverflowError):  # not a number, or a timestamp past a float
        return None
    return None


def _shape(piece: str) -> tuple[str, list[Value]] | None:
    """The piece with its values cut off (comments and blank lines kept whole), and the values in line
    order; None where a line is not plainly one sample."""
    heads: list[str] = []
    values: list[Value] = []
    for line in piece.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            heads.append(line)
            continue
        split = _split(line)
        if split is None:
            return None
        heads.append(SERIES + split[0])
        values.append(split[1])
    return "\n".join(heads), values


# Values and timestamps no series holds, given to a new shape's samples to see where the library reads them
PROBE_VALUE, PROBE_TIMESTAMP = 9876543.0625, 4321098765432


def _splits_as_the_library(shape: str, parsed: tuple[Metric, ...]) -> bool:
    """Whether the library reads every sample's value and timestamp of this shape where `_split` cut them
    (a series whose label set ends before its last `}`, or whose `{` is quoted, is read otherwise): the
    shape is parsed once more with a probe value and timestamp on each sample, which must come out as
    given, on the same series."""
    lines, n = [], 0
    for head in shape.split("\n"):
        if head.startswith(SERIES):
            head = f"{head[1:]} {PROBE_VALUE + n!r} {PROBE_TIMESTAMP + n}"
            n += 1
        lines.append(head)
    try:
        probed = tuple(text_string_to_metric_families("\n".join(lines) + "\n"))
    except (ValueError, OverflowError):
        return False
    got = [s for f in probed for s in f.samples]
    want = [s for f in parsed for s in f.samples]
    return len(got) == len(want) == n and all(
        (g.name, g.labels, g.value, g.timestamp)
        == (w.name, w.labels, PROBE_VALUE + i, (PROBE_TIMESTAMP + i) / 1000)
        for i, (g, w) in enumerate(zip(got, want, strict=True)))


def _same(library: tuple[float, object], here: Value) -> bool:
    """The library read this value and timestamp as `_split` did (the same type too: 3 is not 3.0)."""
    return library[0] == here[0] and type(library[0]) is type(here[0]) and library[1] == here[1]


def _keeps_shape(shape: tuple[str, list[Value]], parsed: tuple[Metric, ...]) -> bool:
    """The library read this piece's values as `_split` cut them, and reads any values of its shape so."""
    samples = [(s.value, s.timestamp) for f in parsed for s in f.samples]
    return len(samples) == len(shape[1]) and all(map(_same, samples, shape[1])) \
        and _splits_as_the_library(shape[0], parsed)


def _with_values(families: tuple[Metric, ...], values: list[Value]) -> tuple[Metric, ...]:
    out = []
    at = 0
    for family in families:
        made = copy.copy(family)
        made.samples = [s._replace(value=v[0], timestamp=v[1])
                        for s, v in zip(family.samples, values[at:at + len(family.samples)], strict=True)]
        at += len(family.samples)
        out.append(made)
    return tuple(out)


class PieceCache:
    """Each family's last few pieces, parsed, and the last few shapes of its pieces. An unchanged piece is
    returned as it was parsed; a piece of a known shape gets its new values; any other is parsed by the
    library, and its shape kept if the library read its values as `_split` does. A family whose lines move
    every poll keeps only PER_FAMILY dead pieces instead of crowding out the families that did not move, as
    one shared LRU would: one for each of a few engines of the same dialect, the least recently used dropped
    first."""

    PER_FAMILY = 3
    MAX_FAMILIES = 512  # past that (a server whose family names change), forget them all

    def __init__(self, shapes: bool = True) -> None:
        self.shapes = shapes  # False: every new piece parsed by the library (bench/bench_parse.py compares)
        self._pieces: dict[str, dict[str, tuple[Metric, ...]]] = {}
        self._shapes: dict[str, dict[str, tuple[Metric, ...]]] = {}
        self._lock = threading.Lock()  # parsed from the event loop and from threads (an A/B run's polls)
        self.hits = self.reshaped = self.misses = 0

    def __call__(self, family: str, piece: str) -> tuple[Metric, ...]:
        with self._lock:
            if (parsed := _take(self._pieces.get(family), piece)) is not None:
                self.hits += 1
                return parsed
        shape = _shape(piece) if self.shapes else None
        if shape is not None:
            with self._lock:
                template = _take(self._shapes.get(family), shape[0])
            if template is not None:
                parsed = _with_values(template, shape[1])
                with self._lock:
                    self.reshaped += 1
                    self._keep(self._pieces, family, piece, parsed)
                return parsed
        parsed = tuple(text_string_to_metric_families(piece))  # ValueError, OverflowError: nothing kept
        with self._lock:
            self.misses += 1
            self._keep(self._pieces, family, piece, parsed)
        if shape is not None and _keeps_shape(shape, parsed):
            with self._lock:
                self._keep(self._shapes, family, shape[0], parsed)
        return parsed

    def _keep(self, store: dict[str, dict[str, tuple[Metric, ...]]], family: str, key: str,
              parsed: tuple[Metric, ...]) -> None:
        kept = store.get(family)
        if kept is None:
            if len(store) >= self.MAX_FAMILIES:
                store.clear()
            kept = store[family] = {}
        elif key not in kept and len(kept) >= self.PER_FAMILY:
            del kept[next(iter(kept))]  # the least recently used
        kept[key] = parsed

    def cache_info(self) -> PieceCache:
        return self  # hits and misses, as functools' caches give them

    def cache_clear(self) -> None:
        with self._lock:
            self._pieces.clear()
            self._shapes.clear()
            self.hits = self.reshaped = self.misses = 0


def _take(kept: dict[str, tuple[Metric, ...]] | None, key: str) -> tuple[Metric, ...] | None:
    """The parse kept under `key`, made the most recently used."""
    if kept is None or (parsed := kept.pop(key, None)) is None:
        return None
    kept[key] = parsed
    return parsed
