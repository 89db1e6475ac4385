"""One comparison running in its own thread, owned by whoever started it (the dashboard's app).

A screen only shows it: closing the screen leaves the run going, and it still writes its JSON, CSV and
HTML when it ends. The thread is a daemon: quitting enginetop does not wait minutes for the last blocks
(attached engines are never stopped by a comparison, so nothing is left running behind).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.gpu_watch import GpuSource
from tui.compare.report import write_report
from tui.compare.result_files import write_result


class ABRun:
    """Messages so far, then the result and the files written (or the error). Read from any thread."""

    def __init__(self, arms: Sequence[Arm], config: ABConfig, stem: Path, *, gpu: GpuSource | None = None,
                 gpu_origin: str = "NVML, sampled in a thread while each block ran") -> None:
        self.arms = list(arms)
        self.config = config
        self.stem = stem  # RESULT files: stem.json (+ CSV beside it) and stem.html
        self.messages: list[str] = []
        self.result: dict[str, Any] | None = None
        self.saved: list[Path] = []
        self.error: str | None = None
        self._gpu = gpu
        self._gpu_origin = gpu_origin
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, name="A/B", daemon=True)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def start(self) -> ABRun:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _work(self) -> None:
        try:
            result = run_comparison(self.arms, self.config, gpu=self._gpu, progress=self.messages.append,
                                    gpu_origin=self._gpu_origin)
            result["source_file"] = str(self.stem.with_suffix(".json"))
            self.saved = write_result(result, self.stem.with_suffix(".json"))
            self.saved.append(write_report(result, self.stem.with_suffix(".html")))
            self.result = result
        except Exception as exc:  # a daemon thread has no one to raise to: the screen shows the error
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()

    def summary(self) -> str:
        """One line for a notification once done."""
        if self.error is not None:
            return f"A/B failed: {self.error}"
        names = ", ".join(p.name for p in self.saved)
        return f"A/B done: saved {names} in {self.stem.parent}"
