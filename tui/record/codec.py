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

from tui.probe.results import ProbeResult, ServerTimings
from tui.sources.samples import (
    EngineReading,
    EngineSample,
    EngineStats,
    GpuProcess,
    GpuReport,
    GpuSample,
    HostSample,
    ProcessTreeMemory,
)

# Kinds of row, as written in the `kind` column; the dataclass each one decodes to.
SAMPLE_TYPES: dict[str, type] = {"engine": EngineSample, "gpu": GpuReport, "host": HostSample,
                                 "probe": ProbeResult}
KIND_OF = {cls: kind for kind, cls in SAMPLE_TYPES.items()}
_KNOWN = (EngineSample, EngineReading, EngineStats, GpuReport, GpuSample, GpuProcess, HostSample,
          ProcessTreeMemory, ProbeResult, ServerTimings)
# Not recorded: a probe's reply text (large, and it is what the user asked, not what was measured).
_DROPPED = {ProbeResult: {"text"}}

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
    if kind is float or kind is int or obj is None or kind is bool:
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
    if isinstance(obj, str):
        return scrub(obj, secrets)
    return obj


def decode(cls: type, data: dict[str, Any]) -> Any:
    # A replay seek decodes thousands of rows (bench/bench_record.py): most fields are taken as they are,
    # and only the rest pay for a function call.
    plain, floats, convert = _plan(cls)
    kwargs = {}
    for name, value in data.items():
        if name in plain:
            kwargs[name] = value
        elif name in floats:  # an int written to JSON (NVML gives ints) comes back a float, as before
            kwargs[name] = value if value is None or type(value) is float else float(value)
        elif name in convert:  # else a field from a later version: ignored
            kwargs[name] = convert[name](value)
    return cls(**kwargs)


@cache
def _plan(cls: type) -> tuple[frozenset[str], frozenset[str], dict[str, Callable[[Any], Any]]]:
    """The class's fields split three ways, once per class: JSON values kept as they are (str, int,
    bool), float fields, and the rest with their converter (nested samples, tuples)."""
    plain, floats, convert = set(), set(), {}
    for name, hint, _ in _fields(cls):
        args = _args(hint)
        if float in args and int not in args and all(a is float or a is type(None) for a in args):
            floats.add(name)
        else:
            fn = _converter(hint)
            if fn is _same:
                plain.add(name)
            else:
                convert[name] = fn
    return frozenset(plain), frozenset(floats), convert


def _same(v: Any) -> Any:
    return v


@cache
def _converter(hint: Any) -> Callable[[Any], Any]:
    """A function from a JSON value to the field's value, built once per type."""
    args = _args(hint)
    for arg in args:
        if isinstance(arg, type) and arg in _KNOWN:
            return lambda v, arg=arg: None if v is None else decode(arg, v)
    for arg in args:
        if typing.get_origin(arg) is tuple:
            inner = typing.get_args(arg)
            if len(inner) == 2 and inner[1] is Ellipsis:
                if typing.get_args(inner[0]) == (float, float):
                    # Histogram buckets, ((bound, count), ...): the numbers as they were written (the
                    # parser's floats come back floats; JSON keeps Infinity), so a pair costs no call.
                    return lambda v: None if v is None else tuple(map(tuple, v))
                item = _converter(inner[0])
                return lambda v: None if v is None else tuple(map(item, v))
            if all(i is float for i in inner):
                return lambda v: None if v is None else tuple(map(float, v))
            items = tuple(_converter(i) for i in inner)
            return lambda v: None if v is None else tuple(c(x) for c, x in zip(items, v, strict=True))
    if float in args and int not in args:
        return lambda v: None if v is None else float(v)  # JSON writes 3.0 as 3: a float field gets a float
    return _same


def _args(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)
