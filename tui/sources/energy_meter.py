"""The machine's energy over a run (a bench engine's part, a capacity level): GPU reports taken in a thread
every `interval_s` (their energy counters' change, or power x time between the readings), and the CPU
packages' RAPL counter at both ends. What each generated token cost is tui.sources.energy.run_energy's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tui.model.samples import GpuReport
from tui.sources.energy import run_energy, span_of_reports
from tui.sources.rapl import RaplReader, RaplSpan


class EnergyMeter:
    """`with EnergyMeter(sampler.sample) as meter: ...` then `meter.result(tokens, local)`. `gpu` None: the
    CPU package only. The sampler is used only by this meter's thread while it runs."""

    def __init__(self, gpu: Callable[[], GpuReport] | None, interval_s: float = 1.0,
                 rapl: RaplReader | None = None) -> None:
        self._gpu = gpu
        self._interval = interval_s
        self._rapl = rapl
        self._reports: list[GpuReport] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: RaplSpan | None = None
        self._cpu_result: dict[str, Any] | None = None

    def _take(self) -> None:
        if self._gpu is not None:
            try:
                self._reports.append(self._gpu())
            except Exception:  # a sampler surprise costs this run its GPU energy, nothing else
                self._gpu = None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._take()

    def __enter__(self) -> EnergyMeter:
        self._cpu = RaplSpan(self._rapl)
        self._take()
        self._thread = threading.Thread(target=self._loop, name="energy-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()
        self._cpu_result = self._cpu.result() if self._cpu is not None else None

    def result(self, tokens: int | None, local: bool, shared_with: tuple[str, ...] = ()) -> dict[str, Any]:
        """Energy over the run and per generated token (run_energy); `shared_with`: engines that ran at the
        same time on this machine, whose energy is in the figure too (said in its scope)."""
        out = run_energy(span_of_reports(self._reports), self._cpu_result, tokens, local)
        if shared_with and out.get("energy_scope"):
            out["energy_scope"] = f"{out['energy_scope']}, shared with {', '.join(shared_with)} (ran at once)"
        return out
