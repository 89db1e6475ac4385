"""Samples and probe results to JSON-able dicts and back, for any of the frozen dataclasses they are made of.

Fields left at their default (None, (), False) are omitted, so a row holds what was measured and nothing
else; a reader built for an older schema that meets a field it does not know ignores it. Every string
passes through `scrub`, so URL credentials never reach a file even when an error text quotes a URL.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from tui.model.config import EngineConfig
from tui.model.containers import CgroupReading, Container
from tui.model.findings import TrafficFacts
from tui.model.samples import (
    EnergyWindow,
    EngineReading,
    EngineSample,
    EngineStats,
    GpuProcess,
    GpuReport,
    GpuSample,
    HostSample,
    ProcessTreeMemory,
    RequestStats,
    RoutedModel,
)
from tui.model.slots import SlotsReading, SlotState
from tui.model.traffic import TrafficSample, TrafficStats
from tui.probe.results import ProbeResult
from tui.probe.timings import ServerTimings

# Kinds of row, as written in the `kind` column; the dataclass each one decodes to.
SAMPLE_TYPES: dict[str, type] = {"engine": EngineSample, "gpu": GpuReport, "host": HostSample,
                                 "probe": ProbeResult, "traffic": TrafficSample}
KIND_OF = {cls: kind for kind, cls in SAMPLE_TYPES.items()}
_KNOWN = (EngineSample, EngineReading, EngineStats, GpuReport, GpuSample, GpuProcess, HostSample,
          ProcessTreeMemory, ProbeResult, ServerTimings, TrafficSample, TrafficStats, SlotsReading, SlotState,
          RoutedModel, EngineConfig, TrafficFacts, EnergyWindow, RequestStats, Container, CgroupReading)
# Not recorded: a probe's reply text (large, and it is what the user asked, not what was measured), and its
# inter-token gaps (a bench's percentiles come from them; a recording keeps the probe's own figures).
_DROPPED: dict[type, set[str]] = {ProbeResult: {"text", "gaps_s"}}

# JSON has no infinities (Python's json writes a non-standard `Infinity`, which orjson refuses): they are
# written as Prometheus writes them, and a float field reads them back with float().
_NOT_FINITE = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")


def scrub(text: str, secrets: tuple[str, ...] = ()) -> str:
    text = _URL_USERINFO.sub(r"\1", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


@cache
def _fields(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    hints = typing.get_type_hints(cls)
    dropped = _DROPPED.get(cls, set())
    out = []
    for f in dataclasses.fields(cls):
        if f.name in dropped:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        out.append((f.name, hints[f.name], default))
    return tuple(out)


def encode(obj: Any, secrets: tuple[str, ...] = ()) -> Any:
    kind = type(obj)
    # Numbers first: a vLLM reading is mostly histogram buckets, and this runs for every value of every
    # sample (the recorder's CPU budget, bench/bench_app.py).
    if kind is float:
        return obj if obj - obj == 0.0 else _NOT_FINITE[str(obj)]  # inf - inf and nan - nan are nan
    if kind is int or obj is None or kind is bool:
        return obj
    if kind is tuple or kind is list:
        return [encode(v, secrets) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for name, _, default in _fields(type(obj)):
            value = getattr(obj, name)
            if value is default or (default is not dataclasses.MISSING and value == default
                                    and type(value) is type(default)):
                continue
            out[name] = encode(value, secrets)
        return out
    if isinstance(obj, tuple | list):
        return [encode(v, secrets) for v in obj]
    if isinstance(obj, dict):  # an event's data
        return {str(k): encode(v, secrets) for k, v in obj.items()}
    if isinstance(obj, str):
        return scrub(obj, secrets)
    return obj


def decode(cls: type, data: dict[str, Any]) -> Any:
    """The dataclass `cls` from its encoded fields. A field from a later version is ignored; a field left
    out takes its default."""
    return _decoder(cls)(data)


@cache
def _decoder(cls: type) -> Callable[[dict[str, Any]], Any]:
    """A function written for this class, once: one line per field, as dataclasses writes __init__.

    A replay seek decodes thousands of rows (bench/bench_record.py). A loop over each row's fields cost more
    than parsing the row, and so did a frozen dataclass's __init__ (an object.__setattr__ call per field):
    the function sets each slot through its descriptor, as unpickling does, which takes half the time. The
    samples have no __post_init__ to skip (checked here)."""
    assert "__slots__" in cls.__dict__ and not hasattr(cls, "__post_init__"), cls
    known = {name: (hint, default) for name, hint, default in _fields(cls)}
    env: dict[str, Any] = {"_cls": cls, "_new": object.__new__}
    lines = ["def _decode(d):", "    o = _new(_cls)"]
    for i, f in enumerate(dataclasses.fields(cls)):
        env[f"_s{i}"] = cls.__dict__[f.name].__set__
        key = repr(f.name)
        if f.default_factory is not dataclasses.MISSING:
            env[f"_d{i}"] = f.default_factory
            absent = f"_d{i}()"
        else:
            env[f"_d{i}"] = f.default
            absent = f"_d{i}"
        if f.name not in known:  # not recorded (_DROPPED): its default
            value = absent
        else:
            fn = _converter(known[f.name][0])
            env[f"_c{i}"] = fn
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if not has_default:
                value = f"d[{key}]" if fn is _same else f"_c{i}(d[{key}])"
            elif fn is _same and f.default_factory is dataclasses.MISSING:
                value = f"d.get({key}, _d{i})"
            elif fn is _float and f.default_factory is dataclasses.MISSING:  # inline: most of a reading
                value = f"v if (v := d.get({key}, _d{i})) is None or v.__class__ is float else float(v)"
            else:
                value = f"_c{i}(d[{key}]) if {key} in d else {absent}"
        lines.append(f"    _s{i}(o, {value})")
    lines.append("    return o")
    exec(compile("\n".join(lines) + "\n", f"<decoder of {cls.__name__}>", "exec"), env)  # our own names
    return env["_decode"]


def _same(v: Any) -> Any:
    return v


def _buckets(v: list[list[Any]] | None) -> tuple[tuple[float, float], ...] | None:
    """Histogram buckets, ((bound, count), ...): the numbers as they were written (the parser's floats come
    back floats), so a pair costs no call; only the +Inf bound, last, is read back from its text."""
    if v is None:
        return None
    out = tuple(map(tuple, v))
    if out and out[-1][0].__class__ is str:
        bound, count = out[-1]
        out = (*out[:-1], (float(bound), count))
    return out


def _float(v: Any) -> float | None:
    return v if v is None or v.__class__ is float else float(v)


@cache
def _converter(hint: Any) -> Callable[[Any], Any]:
    """A function from a JSON value to the field's value, built once per type."""
    args = _args(hint)
    for arg in args:
        if isinstance(arg, type) and arg in _KNOWN:
            known: type = arg
            return lambda v: None if v is None else _decoder(known)(v)
    for arg in args:
        if typing.get_origin(arg) is tuple:
            inner = typing.get_args(arg)
            if len(inner) == 2 and inner[1] is Ellipsis:
                if typing.get_args(inner[0]) == (float, float):
                    return _buckets
                item = _converter(inner[0])
                return lambda v: None if v is None else tuple(map(item, v))
            if all(i is float for i in inner):
                return lambda v: None if v is None else tuple(map(float, v))
            items = tuple(_converter(i) for i in inner)
            return lambda v: None if v is None else tuple(c(x) for c, x in zip(items, v, strict=True))
    if float in args and all(a is float or a is type(None) for a in args):
        return _float
    if float in args and int not in args:
        return lambda v: None if v is None else float(v)  # JSON writes 3.0 as 3: a float field gets a float
    return _same


def _args(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)
