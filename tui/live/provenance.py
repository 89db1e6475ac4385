"""Where an engine's generation rate comes from, and what it missed, in the words a column shows: made here,
once, for the glance and the detail alike (widgets only cut them to width)."""

from __future__ import annotations

from tui.model.samples import EngineReading, EngineSample

COUNTER_ONLY = ("gen tok/s from llama.cpp's counter, which moves only when a request ends (/slots is off: "
                "a running request's tokens are seen when it ends)")


def missed_note(reading: EngineReading) -> str | None:
    """Counted from /slots: the requests whose last tokens ended unseen, if any."""
    missed = int(reading.slots_uncounted_total or 0)
    if not missed:
        return None
    return (f"{missed} request{'' if missed == 1 else 's'} ended between two readings of /slots: "
            "their last tokens are not counted")


def counter_only(sample: EngineSample) -> bool:
    """llama.cpp with --metrics whose /slots were asked and not given (--no-slots, an error): its rate moves
    only as requests end."""
    reading = sample.reading
    return reading is not None and reading.dialect == "llamacpp" and reading.origin is None \
        and sample.router is None and sample.slots is not None and sample.slots.error is not None


# Ollama and LM Studio publish no counters: their figures are their models' (their own API), the requests
# enginetop's proxy relays to them, and probes
NATIVE_NOTE = ("no request counters published: its requests are read through enginetop's proxy "
               "(--proxy-listen), its speed by probes (f)")


def generation_note(sample: EngineSample) -> str | None:
    """The glance's line under the header; None where the engine's own counters say it all."""
    reading = sample.reading
    if reading is None:
        if sample.router in ("ollama", "lm-studio"):
            return NATIVE_NOTE
        return None
    if reading.origin == "/slots":
        missed = missed_note(reading)
        return "figures from /slots: --metrics adds waiting, decode time and totals" + (
            f" · {missed}" if missed else "")
    return COUNTER_ONLY if counter_only(sample) else None
