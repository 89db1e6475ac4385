"""Safe start / stop / switch of engines, step by step, each step checked independently and timed.

    manager = EngineManager(gpu=lambda: sampler.sample())      # or gpu=None without a GPU
    result = manager.switch(profile, on_step=print, cancel=threading.Event())
    manager.poll_status()                                      # every second from the UI

A switch runs: resolve (variables, key file) -> stop (old engine: TERM, KILL, processes gone, port
closed) -> drain (NVML VRAM below the threshold and no old PID on the GPU; without a GPU, processes gone
and port closed) -> port (the new port is free, or refuse naming its holder) -> start -> ready (port,
/health 200, a real 1-token completion). Nothing is started unless every earlier step succeeded.

`switch()` blocks: run it in a Textual thread worker and forward `on_step` events with call_from_thread.
Cancel by setting the `cancel` Event, or with `manager.cancel()` from any thread: the running step stops at
its next check and a half-started engine is stopped again (it gets SIGTERM at once, so no wait on it lasts).
`stop()` cancels a start in flight first; `shutdown()` is the dashboard's exit (see there).

This module holds the order of the steps and what the manager owns: the current engine, the one starting,
the crash to report, one start/stop/switch at a time. What each step does to the engines is
tui.lifecycle.engine_steps'; the drain, which waits only on the GPUs that matter and never on memory another
engine holds, is tui.lifecycle.drain's; a run's events and cancel are tui.lifecycle.switch_run's.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tui.base import install
from tui.lifecycle import state
from tui.lifecycle.drain import freed_pids, gpus_holding, wait_drained
from tui.lifecycle.engine import (
    Cancelled,
    EngineInstance,
    StepError,
    crashed_status,
    launch_instance,
    stop_instance,
)
from tui.lifecycle.engine_steps import (
    check_port,
    check_started,
    confirm_ready,
    load_model,
    resolve_target,
    stop_old,
)
from tui.lifecycle.profile_resolve import ResolvedProfile
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch_run import SwitchRun
from tui.model.samples import GpuReport
from tui.model.status import EngineStatus, RunState, StepEvent, StepStatus

STEPS = ("resolve", "stop", "drain", "port", "start", "ready")


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


class StateChanges:
    """Each engine's run state as last recorded: `changed` says when it moved (a start, a crash, a stop)."""

    def __init__(self) -> None:
        self._last: dict[object, RunState] = {}

    def changed(self, key: object, status: EngineStatus) -> bool:
        if self._last.get(key) == status.state:
            return False
        self._last[key] = status.state
        return True


class EngineManager:
    """Owns the one engine enginetop drives. Thread-safe for poll_status() during a switch."""

    def __init__(
        self,
        gpu: Callable[[], GpuReport] | None = None,
        log_dir: Path | None = None,
        record_state: bool = True,
    ) -> None:
        self._read_gpus = gpu  # NVML's report now, for the drain
        self._log_dir = log_dir
        self._record_state = record_state
        self._lock = threading.Lock()
        self._current: EngineInstance | None = None
        self._step: str | None = None
        self._crash: EngineStatus | None = None
        self._busy = threading.Lock()  # one start/stop/switch at a time
        self._run_cancels: set[threading.Event] = set()  # of the starts/switches in flight or queued
        self._starting: EngineInstance | None = None  # launched by the switch in flight, not yet ready
        self._closed = False  # shutdown() was called: nothing new starts
        self._cancelled: EngineInstance | None = None  # the last start cancel() hit, for stop()'s words

    # ---- public --------------------------------------------------------------------------------------

    @property
    def current(self) -> EngineInstance | None:
        with self._lock:
            return self._current

    def adopt(self, instance: EngineInstance | None) -> None:
        """Take over an engine started earlier (state file) or attached to, as the current one."""
        with self._lock:
            self._current, self._crash = instance, None

    def adopt_recorded(
        self,
        profile: Profile,
        on_step: Callable[[StepEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> SwitchResult | None:
        """Take over the engine `enginetop up PROFILE` started (its state file) instead of starting a second
        one on the same port: check it answers (health and a 1-token completion), restart nothing. None
        when no live engine is recorded for the profile (start it with switch()) or another engine is
        current here. The adopted engine is stopped by stop() and by a switch away from it, but shutdown()
        leaves it running."""
        record = state.read_state(profile.name)
        if record is None:
            return None
        run = self._new_run(on_step, cancel)
        with self._reachable_by_cancel(run), self._busy:
            if self.current is not None:
                return None
            result = SwitchResult(ok=False, steps=run.steps, from_profile=None, to_profile=profile.name)
            try:
                try:
                    run.check_cancel("resolve")
                    resolved = resolve_target(run, profile)
                    instance = state.adopt(record, resolved)  # None when its process is gone (file removed)
                    if instance is None:
                        return None
                    where = (record.get("host"), record.get("port"))
                    if where != (profile.host, profile.port):
                        raise StepError(
                            "resolve",
                            f"the engine `up` started for {profile.name} (PID {instance.pid}) listens on "
                            f"{where[0]}:{where[1]}, but the profile now says {profile.host}:{profile.port}: "
                            f"stop it with `{install.command()} down {profile.name}` first",
                        )
                    for step in ("stop", "drain", "port"):
                        run.enter(step)
                        run.emit(step, "skipped", f"adopting what `enginetop up` started: nothing to {step}")
                    run.enter("start")
                    run.emit(
                        "start", "skipped",
                        f"PID {instance.pid} started by `enginetop up` (log {instance.log_path}): adopted, "
                        "not restarted",
                    )
                    confirm_ready(run, instance)
                except StepError:
                    raise
                except Exception as exc:  # a surprise still fails one named step
                    raise run.unexpected(exc) from exc
            except StepError as exc:
                run.emit(exc.step, "cancelled" if isinstance(exc, Cancelled) else "failed", str(exc))
                result.failed_step, result.message = exc.step, str(exc)
                return result  # left running either way: `up` owns it
            finally:
                run.enter(None)
            with self._lock:
                self._current, self._crash = instance, None
            result.ok, result.instance = True, instance
            result.message = (
                f"{profile.name} ready at {instance.url}: adopted the engine `enginetop up` started "
                f"(PID {instance.pid}); quitting leaves it running "
                f"(`{install.command()} down {profile.name}` stops it)"
            )
            return result

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
        run = self._new_run(on_step, cancel)
        with self._reachable_by_cancel(run), self._busy:
            old = self.current
            result = SwitchResult(
                ok=False, steps=run.steps, from_profile=old.name if old else None, to_profile=to.name
            )
            new: EngineInstance | None = None
            try:
                try:
                    if self._closed:
                        raise StepError("resolve", f"enginetop is shutting down: {to.name} is not started")
                    run.check_cancel("resolve")
                    same_router = old is not None and old.profile.same_router(to)
                    resolved = resolve_target(run, to, ask_router=to.attach or same_router)
                    if old is not None and same_router:
                        # the router stays; on a failure it is stopped like any half-started engine
                        new = replace(old, resolved=resolved, cold_start_s=None)
                    old_pids = freed_pids(run, old, keep_router=new is not None)
                    # the GPUs they hold, read before the stop: then they leave NVML's list
                    old_gpus = gpus_holding(self._read_gpus, old_pids)
                    unloaded = stop_old(run, old, self._record_state, keep_router=new is not None)
                    if old is not None and (unloaded or not old.attached):
                        with self._lock:
                            self._current = None
                    wait_drained(run, old, resolved, old_pids, old_gpus, self._read_gpus, unloaded)
                    if new is not None:
                        run.enter("port")
                        run.emit("port", "skipped", f"the router at {to.url} stays: only its model changes")
                    elif to.attach:
                        run.enter("port")
                        run.emit("port", "skipped", f"{to.name} attaches to {to.url}: nothing to bind")
                        if not to.router_model:
                            run.enter("start")
                            run.emit("start", "skipped",
                                     f"{to.name} attaches to a running server: nothing to launch")
                        new = launch_instance(resolved)
                    else:
                        check_port(run, to)
                        new = self._launch(run, resolved)
                        check_started(run, new, more=bool(to.router_model))
                    if to.router_model:
                        load_model(run, new)
                    confirm_ready(run, new)
                    with self._lock:  # cancel() sets events and reads _starting under this lock too
                        if not run.cancel.is_set():
                            self._starting = None
                            self._current, self._crash, self._cancelled = new, None, None
                    run.check_cancel("ready")
                except StepError:
                    raise
                except Exception as exc:  # a surprise still fails one named step and cleans up
                    raise run.unexpected(exc) from exc
            except StepError as exc:
                status: StepStatus = "cancelled" if isinstance(exc, Cancelled) else "failed"
                run.emit(exc.step, status, str(exc))
                result.failed_step, result.message = exc.step, str(exc)
                if new is not None and not new.attached:
                    crashed = not new.alive() and not new.stopping
                    self._discard(new)
                    if crashed:  # the UI's status line shows why, with the log tail
                        with self._lock:
                            self._crash = crashed_status(new, "while starting")
                return result
            finally:
                run.close()
                run.enter(None)
                with self._lock:
                    self._starting = None
            if self._record_state:
                state.write_state(new)
            result.ok, result.instance = True, new
            result.message = f"{to.name} ready at {new.url}" + (
                f" after a cold start of {new.cold_start_s:.2f} s" if not new.attached else ""
            )
            return result

    def cancel(self) -> bool:
        """Cancel every start/switch in flight or waiting, at its next check; an engine one of them already
        launched gets SIGTERM now, so no wait on it (an HTTP readiness check included) lasts. The switch
        itself then stops and verifies that engine and reports "cancelled". Returns at once, from any
        thread; True when something was cancelled."""
        return self._cancel()[0]

    def _cancel(self) -> tuple[bool, EngineInstance | None]:
        with self._lock:
            run_cancels, starting = list(self._run_cancels), self._starting
            for event in run_cancels:
                event.set()
            if starting is not None:
                self._cancelled = starting
        if starting is not None and starting.launched is not None:
            starting.stopping = True  # its exit is ours, not a crash
            starting.group().signal(signal.SIGTERM)
        return bool(run_cancels), starting

    def stop(
        self, on_step: Callable[[StepEvent], None] | None = None, cancel: threading.Event | None = None
    ) -> SwitchResult:
        """Stop the current engine and verify it is gone. A start in flight is cancelled first (its
        half-started engine stopped), so this never waits for a cold start to finish."""
        return self._stop_current(on_step, cancel, leave_adopted=False)

    def shutdown(self) -> SwitchResult:
        """The dashboard's exit (q, SIGTERM, SIGHUP): nothing new starts any more, a start in flight is
        cancelled and its half-started engine stopped, the engine this manager launched is stopped and
        verified gone; an engine adopted from `enginetop up` (adopt_recorded) is left running, since `up`
        meant it to outlive other commands; the result's message says which."""
        with self._lock:
            self._closed = True
        return self._stop_current(None, None, leave_adopted=True)

    def _stop_current(
        self,
        on_step: Callable[[StepEvent], None] | None,
        cancel: threading.Event | None,
        leave_adopted: bool,
    ) -> SwitchResult:
        _, starting = self._cancel()
        if starting is None:
            self._busy.acquire()
        elif not self._busy.acquire(timeout=starting.profile.stop_timeout_s):
            # It ignored SIGTERM and the start is stuck waiting on it (an HTTP check): kill it, which ends
            # that wait at once; the start then verifies it gone as for any cancel.
            starting.group().signal(signal.SIGKILL)
            self._busy.acquire()
        run = self._new_run(on_step, cancel)
        with self._lock:  # also a start cancelled earlier (q, then shutdown) is reported here
            cancelled, self._cancelled = self._cancelled, None
        try:
            return self._stop_locked(run, leave_adopted, starting or cancelled)
        finally:
            run.close()
            self._busy.release()

    def _stop_locked(
        self, run: SwitchRun, leave_adopted: bool, cancelled: EngineInstance | None
    ) -> SwitchResult:
        old = self.current
        if old is None and cancelled is not None:  # a start was in flight: say what became of it
            run.enter("stop")
            gone = not cancelled.survivors()
            run.emit(
                "stop", "ok" if gone else "failed",
                f"the start of {cancelled.name} was cancelled: PID {cancelled.pid} "
                + ("stopped and verified gone" if gone else f"still running: {cancelled.survivors()}"),
            )
            run.enter(None)
            return SwitchResult(ok=gone, steps=run.steps, from_profile=cancelled.name, to_profile=None,
                                failed_step=None if gone else "stop", message=run.steps[-1].message)
        result = SwitchResult(
            ok=False, steps=run.steps, from_profile=old.name if old else None, to_profile=None
        )
        if leave_adopted and old is not None and old.adopted:
            run.emit(
                "stop", "skipped",
                f"{old.name} (PID {old.pid}) was started by `enginetop up`: left running "
                f"(stop it with `{install.command()} down {old.name}`)",
            )
            result.ok, result.message = True, run.steps[-1].message
            return result
        try:
            stop_old(run, old, self._record_state)
        except StepError as exc:
            run.emit(exc.step, "failed", str(exc))
            result.failed_step, result.message = exc.step, str(exc)
            return result
        finally:
            run.enter(None)
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
                start_memory=inst.start_memory(),
            )
        if inst.stopping:
            return EngineStatus("stopped", profile=inst.name, message="stopped")
        crash = crashed_status(inst)
        with self._lock:
            if self._current is inst:
                self._crash = crash
        if self._record_state:
            state.remove_state(inst.name, inst.pid)
        return crash

    # ---- runs, and the engine one of them starts -----------------------------------------------------

    @contextlib.contextmanager
    def _reachable_by_cancel(self, run: SwitchRun) -> Iterator[None]:
        """Register a run's cancel event while it waits for and holds `_busy`, so cancel() reaches it; after
        shutdown() it is cancelled before it begins."""
        with self._lock:
            self._run_cancels.add(run.cancel)
            if self._closed:
                run.cancel.set()
        try:
            yield
        finally:
            with self._lock:
                self._run_cancels.discard(run.cancel)

    def _set_step(self, name: str | None) -> None:
        with self._lock:
            self._step = name

    def _new_run(
        self, on_step: Callable[[StepEvent], None] | None, cancel: threading.Event | None
    ) -> SwitchRun:
        """A run whose steps show in poll_status() while they run."""
        return SwitchRun(on_step, cancel or threading.Event(), self._set_step)

    def _launch(self, run: SwitchRun, resolved: ResolvedProfile) -> EngineInstance:
        """The start step's launch; here, not with the other steps' work, since the engine starting is the
        manager's: cancel() signals it and `down` finds it in its state file."""
        run.enter("start")
        run.check_cancel("start")
        run.emit("start", "running", f"launching {resolved.argv[0] if resolved.argv else ''}")
        new = launch_instance(resolved, self._log_dir)
        with self._lock:
            self._starting = new  # from here cancel() signals it
        if self._record_state:
            with contextlib.suppress(OSError):  # `down` must find an engine that is still starting too
                state.write_state(new)
        return new

    def _discard(self, new: EngineInstance) -> None:
        """Stop an engine we started in a switch that then failed or was cancelled."""
        with contextlib.suppress(StepError):
            stop_instance(new)
        if self._record_state:
            state.remove_state(new.name, new.pid)

