"""What an engine's start costs this machine: its process tree's peak RSS and swap, sampled while it starts,
against the RAM; and, when the start ends in a kill, whether the out-of-memory killer did it.

The seed's vLLM peaked at ~52 GB + 20 GB of swap during profiling, after its weights had loaded, and was
killed four times before anyone looked at the host. A process the OOM killer ends exits by SIGKILL; the kernel
says so in its log ("Killed process PID") and a memory cgroup counts it (`oom_kill` in memory.events, v2, or
memory.oom_control, v1). In a container either may be unreadable: then the words say the kill could not be
attributed, never that it was not the OOM killer.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tui.model.findings import StartMemory

# Where this process's memory cgroup counts OOM kills (the namespace's own view of it)
OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))


def oom_kills(paths: tuple[Path, ...] = OOM_COUNTERS) -> tuple[int | None, str]:
    """The cgroup's count of OOM kills and where it was read, or None and why it could not be."""
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value), str(path)
    return None, "no cgroup memory.events or memory.oom_control is readable here"


def kernel_killed(pid: int) -> bool | None:
    """The kernel log names `pid` as killed by the OOM killer (None: the log cannot be read here)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2.0, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return f"Killed process {pid} " in out.stdout or f"Killed process {pid}," in out.stdout


def _tree_memory(pids: set[int]) -> tuple[int, int | None, int]:
    """RSS, PSS and swap summed over the processes (VmSwap: the pages of theirs the kernel put in swap). PSS
    comes with the same read of smaps as the swap (memory_full_info), and counts a page the processes share
    once where their RSS counts it in each (a CUDA or torch library, a forked worker's pages); None where one
    process's could not be read."""
    rss = swap = 0
    pss: int | None = 0
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.AccessDenied:
            with contextlib.suppress(psutil.Error):
                rss += psutil.Process(pid).memory_info().rss
                pss = None
            continue
        except psutil.Error:
            continue
        rss += info.rss
        swap += getattr(info, "swap", 0)
        own = getattr(info, "pss", None)
        pss = None if pss is None or own is None else pss + own
    return rss, pss, swap


class StartWatch:
    """Sampled by the ready-wait (tui.lifecycle.engine.wait_ready) while an engine starts."""

    def __init__(self) -> None:
        self.launched = time.monotonic()
        self.oom_before, self.oom_where = oom_kills()
        self.peak_rss = self.peak_swap = 0
        self.peak_pss: int | None = None
        self.peak_after_s = 0.0
        self.ram_used = self.swap_used = 0
        self.ram_total = psutil.virtual_memory().total

    def sample(self, pids: set[int]) -> None:
        rss, pss, swap = _tree_memory(pids)
        if rss + swap > self.peak_rss + self.peak_swap:
            vm, sw = psutil.virtual_memory(), psutil.swap_memory()
            self.peak_rss, self.peak_pss, self.peak_swap = rss, pss, swap
            self.peak_after_s = time.monotonic() - self.launched
            self.ram_used, self.swap_used = vm.total - vm.available, sw.used

    def result(self, exit_code: int | None = None, pid: int | None = None, ready: bool = False,
               when: str = "while starting") -> StartMemory:
        """How the start ended: ready, or the process's exit (a kill named, and by whom where it can be told),
        `when` it ended."""
        ended, oom, evidence = "ready", None, None
        used_end = swap_end = None
        if not ready:
            ended = "exited" if exit_code is None else f"exited with code {exit_code}"
            if exit_code is not None and exit_code < 0:
                try:
                    ended = f"killed by {signal.Signals(-exit_code).name}"
                except ValueError:
                    ended = f"killed by signal {-exit_code}"
            ended += f" {when}"
            vm, sw = psutil.virtual_memory(), psutil.swap_memory()
            used_end, swap_end = vm.total - vm.available, sw.used
            if exit_code == -signal.SIGKILL:
                oom, evidence = self._attribute(pid)
        return StartMemory(self.peak_rss, self.peak_swap, self.peak_after_s, self.ram_total, self.ram_used,
                           self.swap_used, ended, oom, evidence, used_end, swap_end, self.peak_pss)

    def _attribute(self, pid: int | None) -> tuple[bool | None, str]:
        """Was a SIGKILL the OOM killer's? The cgroup's counter, else the kernel log."""
        after, where = oom_kills()
        if self.oom_before is not None and after is not None and after > self.oom_before:
            return True, f"{where}: oom_kill {self.oom_before} -> {after} while it started"
        said = kernel_killed(pid) if pid is not None else None
        if said:
            return True, f"the kernel log says: Killed process {pid}"
        if self.oom_before is not None and after is not None and said is False:
            return False, (f"not the OOM killer: {where} counted no kill (oom_kill {after}) and the kernel "
                           "log names no kill of it")
        if self.oom_before is not None and after is not None:
            return False, f"not the OOM killer of its cgroup: {where} counted no kill (oom_kill {after})"
        return None, f"whether the OOM killer did it cannot be told here: {where}, and the kernel log is " \
                     "not readable"
