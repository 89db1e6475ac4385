"""Safe start / stop / switch of engines, step by step, each step checked independently and timed.

    manager = EngineManager(gpu=lambda: sampler.sample())      # or gpu=None without a GPU
    result = manager.switch(profile, on_step=print, cancel=threading.Event())
    manager.poll_status()                                      # every second from the UI

A switch runs: resolve (variables, key file) -> stop (old engine: TERM, KILL, processes gone, port
closed) -> drain (NVML VRAM below the threshold and no old PID on the GPU; without a GPU, processes gone
and port closed) -> port (the new port is free, or refuse naming its holder) -> start -> ready (port,
/health 200, a real 1-token completion). Nothing is started unless every earlier step succeeded.

`switch()` blocks: run it in a Textual thread worker and forward `on_step` events with call_from_thread.
Cancel by setting the `cancel` Event; the running step stops at its next check (a half-started engine is
stopped again).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tui.lifecycle import state
from tui.lifecycle.engine import (
    Cancelled,
    EngineInstance,
    StepError,
    crash_message,
    exit_words,
    launch_instance,
    port_holder_words,
    stop_instance,
    timeout_message,
    wait_ready,
)
from tui.lifecycle.process import describe_process, port_listeners, port_open
from tui.lifecycle.profiles import GIB, Profile, ProfileError, ResolvedProfile, resolve
from tui.sources.samples import GpuReport

StepStatus = Literal["running", "ok", "failed", "skipped", "cancelled"]
STEPS = ("resolve", "stop", "drain", "port", "start", "ready")
DRAIN_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class StepEvent:
    name: str  # one of STEPS
    status: StepStatus  # "running" events repeat while a step waits, with what it waits for
    elapsed_s: float  # since this step began
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "elapsed_s": round(self.elapsed_s, 3),
            "message": self.message,
        }


@dataclass
class SwitchResult:
    ok: bool
    steps: list[StepEvent]  # the final event of every step, in order
    from_profile: str | None
    to_profile: str | None
    failed_step: str | None = None
    message: str = ""
    instance: EngineInstance | None = None

    def to_json(self) -> dict[str, Any]:
        inst = self.instance
        return {
            "ok": self.ok,
            "from": self.from_profile,
            "to": self.to_profile,
            "failed_step": self.failed_step,
            "message": self.message,
            "steps": [s.to_json() for s in self.steps],
            "total_s": round(sum(s.elapsed_s for s in self.steps), 3),
            "pid": inst.pid if inst else None,
            "port": inst.profile.port if inst else None,
            "url": inst.url if inst else None,
            "log_path": str(inst.log_path) if inst and inst.log_path else None,
            "cold_start_s": round(inst.cold_start_s, 3) if inst and inst.cold_start_s is not None else None,
        }


EngineState = Literal["idle", "switching", "ready", "crashed", "stopped"]


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """What the UI shows once a second. `log_tail` is filled for a crash (and on request)."""

    state: EngineState
    profile: str | None = None
    pid: int | None = None
    url: str | None = None
    attached: bool = False
    exit_code: int | None = None
    cold_start_s: float | None = None
    step: str | None = None  # the running step while switching
    log_path: Path | None = None
    log_tail: tuple[str, ...] = ()
    message: str = ""


@dataclass
class _Run:
    """Bookkeeping of one start/stop/switch: emits events and collects each step's final one."""

    on_step: Callable[[StepEvent], None] | None
    cancel: threading.Event
    steps: list[StepEvent] = field(default_factory=list)
    current: str | None = None
    began: float = 0.0

    def emit(self, name: str, status: StepStatus, message: str) -> StepEvent:
        if name != self.current:
            self.current, self.began = name, time.monotonic()
        event = StepEvent(name, status, time.monotonic() - self.began, message)
        if status != "running":
            self.steps.append(event)
        if self.on_step is not None:
            self.on_step(event)
        return event

    def check_cancel(self, step: str) -> None:
        if self.cancel.is_set():
            raise Cancelled(step)


class EngineManager:
    """Owns the one engine enginetop drives. Thread-safe for poll_status() during a switch."""

    def __init__(
        self,
        gpu: Callable[[], GpuReport] | None = None,
        log_dir: Path | None = None,
        record_state: bool = True,
    ) -> None:
        self._gpu = gpu
        self._log_dir = log_dir
        self._record_state = record_state
        self._lock = threading.Lock()
        self._current: EngineInstance | None = None
        self._step: str | None = None
        self._crash: EngineStatus | None = None
        self._busy = threading.Lock()  # one start/stop/switch at a time

    # ---- public --------------------------------------------------------------------------------------

    @property
    def current(self) -> EngineInstance | None:
        with self._lock:
            return self._current

    def adopt(self, instance: EngineInstance | None) -> None:
        """Take over an engine started earlier (state file) or attached to, as the current one."""
        with self._lock:
            self._current, self._crash = instance, None

    def start(
        self,
        profile: Profile,
        on_step: Callable[[StepEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> SwitchResult:
        """Start `profile` (stopping the current engine first if there is one)."""
        return self.switch(profile, on_step, cancel)

    def switch(
        self,
        to: Profile,
        on_step: Callable[[StepEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> SwitchResult:
        run = _Run(on_step, cancel or threading.Event())
        with self._busy:
            old = self.current
            result = SwitchResult(
                ok=False, steps=run.steps, from_profile=old.name if old else None, to_profile=to.name
            )
            new: EngineInstance | None = None
            try:
                try:
                    resolved = self._resolve(run, to)
                    self._stop(run, old)
                    if old is not None and not old.attached:
                        with self._lock:
                            self._current = None
                    self._drain(run, old, to)
                    if to.attach:
                        self._set_step("port")
                        run.emit("port", "skipped", f"{to.name} attaches to {to.url}: nothing to bind")
                        self._set_step("start")
                        run.emit(
                            "start", "skipped", f"{to.name} attaches to a running server: nothing to launch"
                        )
                        new = launch_instance(resolved)
                    else:
                        self._check_port(run, to)
                        new = self._launch(run, resolved)
                    self._ready(run, new)
                except StepError:
                    raise
                except Exception as exc:  # a surprise still fails one named step and cleans up
                    step = run.current or "resolve"
                    raise StepError(
                        step, f"step '{step}' failed unexpectedly: {type(exc).__name__}: {exc}"
                    ) from exc
            except StepError as exc:
                status: StepStatus = "cancelled" if isinstance(exc, Cancelled) else "failed"
                run.emit(exc.step, status, str(exc))
                result.failed_step, result.message = exc.step, str(exc)
                if new is not None and not new.attached:
                    crashed = not new.alive() and not new.stopping
                    self._discard(new)
                    if crashed:  # the UI's status line shows why, with the log tail
                        with self._lock:
                            self._crash = EngineStatus(
                                "crashed",
                                profile=new.name,
                                pid=new.pid,
                                url=new.url,
                                exit_code=new.exit_code(),
                                log_path=new.log_path,
                                log_tail=tuple(new.log_tail()),
                                message=crash_message(new, "while starting"),
                            )
                return result
            finally:
                self._set_step(None)
            with self._lock:
                self._current, self._crash = new, None
            if self._record_state:
                state.write_state(new)
            result.ok, result.instance = True, new
            result.message = f"{to.name} ready at {new.url}" + (
                f" after a cold start of {new.cold_start_s:.2f} s" if not new.attached else ""
            )
            return result

    def stop(
        self, on_step: Callable[[StepEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> SwitchResult:
        """Stop the current engine and verify it is gone."""
        run = _Run(on_step, cancel or threading.Event())
        with self._busy:
            old = self.current
            result = SwitchResult(
                ok=False, steps=run.steps, from_profile=old.name if old else None, to_profile=None
            )
            try:
                self._stop(run, old)
            except StepError as exc:
                run.emit(exc.step, "failed", str(exc))
                result.failed_step, result.message = exc.step, str(exc)
                return result
            finally:
                self._set_step(None)
            with self._lock:
                self._current = None
            result.ok, result.message = True, run.steps[-1].message
            return result

    def poll_status(self) -> EngineStatus:
        """Cheap (no HTTP): is the current engine still running? An engine that exited on its own is
        reported as crashed, with its exit code and last log lines, until the next start."""
        with self._lock:
            inst, step, crash = self._current, self._step, self._crash
        if step is not None:
            return EngineStatus(
                "switching", profile=inst.name if inst else None, step=step, message=f"switching: {step}"
            )
        if crash is not None:
            return crash
        if inst is None:
            return EngineStatus("idle", message="no engine")
        if inst.attached:
            return EngineStatus(
                "ready", profile=inst.name, url=inst.url, attached=True, message=f"attached to {inst.url}"
            )
        if inst.alive():
            return EngineStatus(
                "ready",
                profile=inst.name,
                pid=inst.pid,
                url=inst.url,
                cold_start_s=inst.cold_start_s,
                log_path=inst.log_path,
                message=f"running, PID {inst.pid}",
            )
        if inst.stopping:
            return EngineStatus("stopped", profile=inst.name, message="stopped")
        crash = EngineStatus(
            "crashed",
            profile=inst.name,
            pid=inst.pid,
            url=inst.url,
            exit_code=inst.exit_code(),
            log_path=inst.log_path,
            log_tail=tuple(inst.log_tail()),
            message=crash_message(inst),
        )
        with self._lock:
            if self._current is inst:
                self._crash = crash
        if self._record_state:
            state.remove_state(inst.name, inst.pid)
        return crash

    # ---- steps ---------------------------------------------------------------------------------------

    def _set_step(self, name: str | None) -> None:
        with self._lock:
            self._step = name

    def _resolve(self, run: _Run, to: Profile) -> ResolvedProfile:
        self._set_step("resolve")
        run.emit("resolve", "running", f"substituting variables of {to.name}")
        try:
            resolved = resolve(to)
        except ProfileError as exc:
            raise StepError("resolve", f"profile {to.name} cannot start: {exc}") from exc
        what = "attach, nothing to launch" if resolved.argv is None else f"{len(resolved.argv)} arguments"
        run.emit(
            "resolve", "ok", f"{to.name}: {what}" + (", API key read from file" if resolved.api_key else "")
        )
        return resolved

    def _stop(self, run: _Run, old: EngineInstance | None) -> None:
        self._set_step("stop")
        run.check_cancel("stop")
        if old is None or old.attached:
            run.emit(
                "stop",
                "skipped",
                "no engine running"
                if old is None
                else f"{old.name} is attached, not started by enginetop: left running",
            )
            return
        if not old.alive() and not old.stopping:
            run.emit("stop", "running", f"{old.name} had already exited ({exit_words(old.exit_code())})")
        run.emit("stop", "running", f"SIGTERM to process group {old.pgid} of {old.name}")
        message = stop_instance(old)  # not cancellable: a half-stopped engine helps nobody
        if self._record_state:
            state.remove_state(old.name, old.pid)
        run.emit("stop", "ok", f"{old.name} {message}")

    def _drain(self, run: _Run, old: EngineInstance | None, to: Profile) -> None:
        """Wait until the old engine's resources are really free, as an independent check would see."""
        self._set_step("drain")
        threshold = to.vram_threshold_bytes
        deadline = time.monotonic() + to.drain_timeout_s
        old_pids = set(old.pids_seen) if old is not None and not old.attached else set()
        # On the GPU a PID is only a number: a dead engine's PID listed there is still its context.
        last = ""
        while True:
            run.check_cancel("drain")
            blockers: list[str] = []
            if old is not None and not old.attached:
                alive = old.survivors()
                if alive:
                    blockers.append(f"old PIDs still running: {', '.join(map(str, alive))}")
                if port_open(old.profile.connect_host, old.profile.port):
                    blockers.append(f"old port {old.profile.port} still listening")
            report = self._gpu() if self._gpu is not None else None
            gpu_words = "no GPU"
            if report is not None and report.gpus:
                gpu_words = ""
                for gpu in report.gpus:
                    label = f"GPU {gpu.index}"
                    if gpu.error:
                        blockers.append(f"{label}: {gpu.error}")
                        continue
                    holders = sorted(p.pid for p in gpu.processes if p.pid in old_pids)
                    if holders:
                        blockers.append(
                            f"{label}: old engine PIDs {', '.join(map(str, holders))} still hold GPU memory"
                        )
                    if gpu.vram_used_bytes is None:
                        gpu_words += f"{label} VRAM used unknown; "
                    elif gpu.vram_used_bytes >= threshold:
                        blockers.append(
                            f"{label}: VRAM used {gpu.vram_used_bytes / GIB:.1f} GiB "
                            f"(threshold {to.vram_threshold_gib:g} GiB)"
                        )
                    else:
                        gpu_words += f"{label} VRAM used {gpu.vram_used_bytes / GIB:.1f} GiB; "
            elif report is not None and report.unavailable:
                gpu_words = f"no GPU ({report.unavailable})"
            if not blockers:
                what = (
                    "old processes gone, old port closed"
                    if old is not None and not old.attached
                    else "no engine was running"
                )
                run.emit("drain", "ok", f"{what}; {gpu_words.rstrip('; ') or 'GPU memory below threshold'}")
                return
            message = "; ".join(blockers)
            if message != last:
                run.emit("drain", "running", message)
                last = message
            if time.monotonic() >= deadline:
                raise StepError(
                    "drain", timeout_message("drain", to.drain_timeout_s, message), timed_out=True
                )
            time.sleep(DRAIN_POLL_S)

    def _check_port(self, run: _Run, to: Profile) -> None:
        """Refuse to start when someone else listens on the port (the new engine would fail confusingly)."""
        self._set_step("port")
        run.check_cancel("port")
        holders = port_listeners(to.port)
        if not holders and not port_open(to.connect_host, to.port):
            run.emit("port", "ok", f"port {to.port} is free")
            return
        if not holders:
            raise StepError(
                "port",
                f"port {to.port} on {to.connect_host} is already in use "
                f"({port_holder_words(to.port)}); refusing to start {to.name}",
            )
        words = []
        for proc in holders:
            owner = state.enginetop_owner(proc.pid) if proc is not None else None
            by = f"started by enginetop for profile {owner}" if owner else "not started by enginetop"
            words.append(f"{describe_process(proc)}, {by}")
        raise StepError("port", f"port {to.port} is held by {'; '.join(words)}: refusing to start {to.name}")

    def _launch(self, run: _Run, resolved: ResolvedProfile) -> EngineInstance:
        self._set_step("start")
        run.check_cancel("start")
        run.emit("start", "running", f"launching {resolved.argv[0] if resolved.argv else ''}")
        new = launch_instance(resolved, self._log_dir)
        if self._record_state:
            with contextlib.suppress(OSError):  # `down` must find an engine that is still starting too
                state.write_state(new)
        if not new.alive():
            raise StepError("start", crash_message(new, "immediately"))
        run.emit("start", "ok", f"PID {new.pid} running, log {new.log_path}")
        return new

    def _ready(self, run: _Run, new: EngineInstance) -> None:
        self._set_step("ready")
        run.emit("ready", "running", f"waiting for {new.url}")
        cold = wait_ready(new, run.cancel, lambda msg: run.emit("ready", "running", msg))
        detail = (
            "attached server answers health and a 1-token completion"
            if new.attached
            else f"cold start {cold:.2f} s (launch to first 1-token completion)"
        )
        run.emit("ready", "ok", detail)

    def _discard(self, new: EngineInstance) -> None:
        """Stop an engine we started in a switch that then failed or was cancelled."""
        with contextlib.suppress(StepError):
            stop_instance(new)
        if self._record_state:
            state.remove_state(new.name, new.pid)
