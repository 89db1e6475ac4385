"""Service-level objectives, as `vllm bench serve --goodput` spells them: "ttft:500 tpot:50 e2el:4000", in
milliseconds, every term must hold for a request to be good. A failed request is never good. Refused before
anything is sent when a term has an unknown name or a value that is not a positive number.

A request is judged on its `RequestFigures`, whoever measured it: a bench's probe client or the proxy."""

from __future__ import annotations

from dataclasses import dataclass

TERMS = {"ttft": "time to first token", "tpot": "time per output token after the first",
         "e2el": "end-to-end latency", "itl": "every inter-token gap"}


class SloError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RequestFigures:
    """What an SLO is checked against, in seconds; None: not measured (a term on it does not hold)."""

    ok: bool
    ttft_s: float | None
    tpot_s: float | None
    e2el_s: float | None
    itl_max_s: float | None

    def term(self, name: str) -> float | None:
        return {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2el": self.e2el_s, "itl": self.itl_max_s}[name]


def tpot(ttft_s: float | None, e2el_s: float | None, output_tokens: int | None) -> float | None:
    """(end-to-end - TTFT) / (output tokens - 1), as vLLM's bench defines it."""
    if ttft_s is None or e2el_s is None or output_tokens is None or output_tokens < 2:
        return None
    return (e2el_s - ttft_s) / (output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    limits_ms: dict[str, float]

    @classmethod
    def parse(cls, text: str) -> Slo:
        limits: dict[str, float] = {}
        for term in text.replace(",", " ").split():
            name, sep, value = term.partition(":")
            if not sep:
                raise SloError(f"--slo term {term!r}: expected NAME:MILLISECONDS, e.g. ttft:500")
            if name not in TERMS:
                raise SloError(f"--slo term {term!r}: unknown name {name!r}; known: "
                               + ", ".join(f"{k} ({v})" for k, v in TERMS.items()))
            try:
                ms = float(value.removesuffix("ms"))
            except ValueError:
                raise SloError(f"--slo term {term!r}: {value!r} is not a number of milliseconds") from None
            if not ms > 0:
                raise SloError(f"--slo term {term!r}: the limit must be a positive number of milliseconds")
            limits[name] = ms
        if not limits:
            raise SloError("--slo is empty: give terms like \"ttft:500 tpot:50 e2el:4000\"")
        return cls(limits)

    def met(self, figures: RequestFigures) -> bool:
        if not figures.ok:
            return False
        for name, limit in self.limits_ms.items():
            value = figures.term(name)
            if value is None or value * 1000.0 > limit:
                return False
        return True

    def __str__(self) -> str:
        return " ".join(f"{k}:{v:g}" for k, v in self.limits_ms.items())
