"""What a process tree costs while it runs: CPU seconds and peak resident memory (for the benches)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tui.base.process import group_alive, stop_pgid


class TreeMeter:
    """A live process tree's CPU seconds and peak RSS (the tree's sum, sampled every 50 ms in a thread)."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _procs(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def cpu(self) -> float:
        total = 0.0
        for proc in self._procs():
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            rss = 0
            for proc in self._procs():
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
            self.peak = max(self.peak, rss)

    def __enter__(self) -> TreeMeter:
        self.cpu0 = self.cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = self.cpu() - self.cpu0


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass(frozen=True)
class ChildRun:
    rc: int
    cpu_s: float  # the child's and its waited-for descendants' (rusage): processes that exited count too
    wall_s: float
    peak_rss: int  # bytes, the whole tree's at its largest (sampled)


def run_child(argv: list[str], env: dict[str, str] | None, out_path: Path) -> ChildRun:
    """Run argv to its end in its own session, stdout and stderr to out_path."""
    cpu0, t0 = child_cpu(), time.perf_counter()
    with out_path.open("wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        leader_started = psutil.Process(proc.pid).create_time()
        with TreeMeter(proc.pid) as meter:
            # Wait for the exit without reaping: while the leader is an unreaped zombie its PID (the group's
            # id) cannot be reused, so what is left in the group is provably this run's and safe to signal.
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        # multiprocessing's resource tracker sees its parent gone and exits just after it: a grace period.
        deadline = time.monotonic() + 2.0
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_alive(proc.pid):  # a service process left behind would also escape the rusage count
            stop_pgid(proc.pid, create_time=leader_started)
            print(f"  warning: {Path(argv[0]).name} left processes behind; stopped them", flush=True)
        rc = proc.wait()
    return ChildRun(rc, child_cpu() - cpu0, time.perf_counter() - t0, meter.peak)
