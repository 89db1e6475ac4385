"""Service-level objectives, as `vllm bench serve --goodput` spells them: "ttft:500 tpot:50 e2el:4000", in
milliseconds, every term must hold for a request to be good. A failed request is never good. Refused before
anything is sent when a term has an unknown name or a value that is not a positive number."""

from __future__ import annotations

from dataclasses import dataclass

from tui.probe.results import ProbeResult

TERMS = {"ttft": "time to first token", "tpot": "time per output token after the first",
         "e2el": "end-to-end latency", "itl": "every inter-token gap"}


class SloError(ValueError):
    pass


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

    def met(self, result: ProbeResult) -> bool:
        if not result.ok:
            return False
        for name, limit in self.limits_ms.items():
            value = measure(result, name)
            if value is None or value * 1000.0 > limit:
                return False
        return True

    def __str__(self) -> str:
        return " ".join(f"{k}:{v:g}" for k, v in self.limits_ms.items())


def tpot_s(result: ProbeResult) -> float | None:
    """(end-to-end - TTFT) / (output tokens - 1), as vLLM's bench defines it."""
    n = result.completion_tokens
    if result.ttft_s is None or result.e2e_s is None or n is None or n < 2:
        return None
    return (result.e2e_s - result.ttft_s) / (n - 1)


def measure(result: ProbeResult, name: str) -> float | None:
    if name == "ttft":
        return result.ttft_s
    if name == "tpot":
        return tpot_s(result)
    if name == "e2el":
        return result.e2e_s
    if name == "itl":
        return max(result.gaps_s) if result.gaps_s else None
    raise KeyError(name)
