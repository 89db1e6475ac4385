"""The machine's energy over a run (a bench engine's part, a capacity level): GPU reports taken in a thread
every `interval_s` (their energy counters' change, or power x time between the readings), and the CPU
packages' RAPL counter read at each of them too (so a run longer than its wrap period loses no wrap). What
each generated token cost is tui.sources.energy.run_energy's.

The GPU reports name the engine's processes (EnginePids): NVML lists every process anyway, but AMD and Intel
GPUs (sysfs) list only the PIDs they are given, so without them an AMD or Intel GPU holding the engine would
look idle and the CPU package would be taken for its energy."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol
from urllib.parse import urlsplit

from tui.model.samples import GpuReport
from tui.sources.containers import shared_catalog
from tui.sources.energy import run_energy, span_of_reports
from tui.sources.engine_source import is_local
from tui.sources.port_holder import whose_port
from tui.sources.processes import tree_pids
from tui.sources.rapl import RaplReader, RaplSpan

PIDS_RESCAN_S = 5.0  # an engine's process tree is looked up again this often (vLLM starts workers late)


class GpuSource(Protocol):
    """GpuSampler.sample: every GPU now, each process named by the engine whose PIDs are given."""

    def __call__(self, engine_pids: dict[str, set[int]] | None = None, /) -> GpuReport: ...


class EnginePids:
    """One engine's process tree, as a sampler's `engine_pids` ({name: PIDs}): from its root PID when
    enginetop started it, else the engine's own process behind its URL's port (tui.sources.port_holder: into
    its container, never a tunnel's or forwarder's); the root's descendants
    with it (vLLM's workers hold the GPU, not its API server). Looked up every `every_s`; {} for an engine on
    another machine, or one whose process is not found. `found`: it was found at least once."""

    def __init__(self, name: str, url: str, pid: int | None = None, every_s: float = PIDS_RESCAN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.found = False
        self._pid = pid
        self._port = urlsplit(url).port if is_local(url) else None
        self._every = every_s
        self._clock = clock
        self._next = float("-inf")
        self._pids: set[int] = set()

    def __call__(self) -> dict[str, set[int]]:
        now = self._clock()
        if now >= self._next:
            self._next = now + self._every
            root = self._pid
            if root is None and self._port is not None:  # the engine's own process, never a forwarder's
                root = whose_port(None, self._port, shared_catalog()).engine_pid
            self._pids = tree_pids(root) if root is not None else set()
            self.found = self.found or bool(self._pids)
        return {self.name: set(self._pids)} if self._pids else {}


class EnergyMeter:
    """`with EnergyMeter(sampler.sample, pids=EnginePids(name, url)) as meter: ...` then
    `meter.result(tokens, local)`. `gpu` None: the CPU package only. The sampler is used only by this meter's
    thread while it runs."""

    def __init__(self, gpu: GpuSource | None, interval_s: float = 1.0, rapl: RaplReader | None = None,
                 pids: EnginePids | None = None) -> None:
        self._gpu = gpu
        self._interval = interval_s
        self._rapl = rapl
        self._pids = pids
        self._reports: list[GpuReport] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: RaplSpan | None = None
        self._cpu_result: dict[str, Any] | None = None
        self._failed: str | None = None
        self._closed = False

    def _take(self) -> None:
        pids = self._pids() if self._pids is not None else None  # looked up without a GPU too: was it found?
        if self._gpu is not None:
            try:
                self._reports.append(self._gpu(pids))
            except Exception as e:  # a sampler surprise costs this run its energy figure, nothing else
                self._gpu = None
                self._failed = (f"GPU sampling failed during the run ({type(e).__name__}: {e}): "
                                "no energy figure")

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._take()
            if self._cpu is not None:
                self._cpu.tick()  # every wrap of the RAPL counter seen, however long the run

    def __enter__(self) -> EnergyMeter:
        self._cpu = RaplSpan(self._rapl)
        self._take()
        self._thread = threading.Thread(target=self._loop, name="energy-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop sampling and take the last readings; again: nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()
        self._cpu_result = self._cpu.result() if self._cpu is not None else None

    def result(self, tokens: int | None, local: bool, shared_with: tuple[str, ...] = ()) -> dict[str, Any]:
        """Energy over the run and per generated token (run_energy); `shared_with`: engines that ran at the
        same time on this machine, whose energy is in the figure too (said in its scope) unless the GPUs
        summed held this engine alone."""
        engine = self._pids.name if self._pids is not None and self._pids.found else None
        if self._failed is not None:
            # the GPU readings stop short of the run: neither their joules over all its tokens, nor the CPU
            # package's for an engine whose GPU could no longer be seen
            failed = {"sampling_failed": True, "energy_note": self._failed}
            return run_energy(failed, None, None, local, engine)
        out = run_energy(span_of_reports(self._reports), self._cpu_result, tokens, local, engine)
        alone = str(out.get("energy_scope")).endswith("(the engine's alone)")
        if shared_with and out.get("energy_scope") and not alone:
            # the joules are every engine's that ran at once: over this engine's tokens alone they would
            # count the others' work as its own, so the joules stand, per token does not
            out["energy_scope"] = f"{out['energy_scope']}, shared with {', '.join(shared_with)} (ran at once)"
            out.update(joules_per_token=None, tokens_per_joule=None,
                       energy_note=f"per token not attributed: {', '.join(shared_with)} ran at once on the "
                                   "same devices")
        return out
