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

The drain waits only on the GPUs that matter (the old engine's, the new profile's CUDA_VISIBLE_DEVICES),
and counts only memory that no other live process holds: another engine on the machine never blocks it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tui.base import install
from tui.base.process import describe_process, pid_alive, port_listeners, port_open
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
from tui.lifecycle.profiles import GIB, Profile, ProfileError, ResolvedProfile, resolve
from tui.lifecycle.router import LlamaSwap, Router, open_router
from tui.model.samples import GpuReport, GpuSample
from tui.model.status import EngineStatus, RunState, StepEvent, StepStatus

STEPS = ("resolve", "stop", "drain", "port", "start", "ready")
DRAIN_POLL_S = 0.5


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


@dataclass
class _Run:
    """Bookkeeping of one start/stop/switch: emits events and collects each step's final one."""

    on_step: Callable[[StepEvent], None] | None
    cancel: threading.Event
    steps: list[StepEvent] = field(default_factory=list)
    current: str | None = None
    began: float = 0.0
    routers: dict[str, Router] = field(default_factory=dict)

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

    def router(self, resolved: ResolvedProfile) -> Router:
        """The router (llama-server router mode or llama-swap) of a profile's `router_model`, one per URL for
        the whole switch: a start llama-swap is still doing belongs to the one that asked for it."""
        if resolved.profile.url not in self.routers:
            self.routers[resolved.profile.url] = open_router(resolved.profile, resolved.api_key)
        return self.routers[resolved.profile.url]

    def forget_router(self, url: str) -> None:
        """Ask which kind of router it is again (one launched just now did not answer yet)."""
        router = self.routers.pop(url, None)
        if router is not None:
            router.close()

    def close(self) -> None:
        for url in list(self.routers):
            self.forget_router(url)


def _unexpected(run: _Run, exc: Exception) -> StepError:
    step = run.current or "resolve"
    return StepError(step, f"step '{step}' failed unexpectedly: {type(exc).__name__}: {exc}")


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
        self._runs: set[threading.Event] = set()  # cancel events of the starts/switches in flight or queued
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
        run = _Run(on_step, cancel or threading.Event())
        with self._track(run), self._busy:
            if self.current is not None:
                return None
            result = SwitchResult(ok=False, steps=run.steps, from_profile=None, to_profile=profile.name)
            try:
                try:
                    run.check_cancel("resolve")
                    resolved = self._resolve(run, profile)
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
                        self._set_step(step)
                        run.emit(step, "skipped", f"adopting what `enginetop up` started: nothing to {step}")
                    self._set_step("start")
                    run.emit(
                        "start", "skipped",
                        f"PID {instance.pid} started by `enginetop up` (log {instance.log_path}): adopted, "
                        "not restarted",
                    )
                    self._ready(run, instance)
                except StepError:
                    raise
                except Exception as exc:  # a surprise still fails one named step
                    raise _unexpected(run, exc) from exc
            except StepError as exc:
                run.emit(exc.step, "cancelled" if isinstance(exc, Cancelled) else "failed", str(exc))
                result.failed_step, result.message = exc.step, str(exc)
                return result  # left running either way: `up` owns it
            finally:
                self._set_step(None)
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
        run = _Run(on_step, cancel or threading.Event())
        with self._track(run), self._busy:
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
                    resolved = self._resolve(run, to, ask_router=to.attach or same_router)
                    if old is not None and same_router:
                        # the router stays; on a failure it is stopped like any half-started engine
                        new = replace(old, resolved=resolved, cold_start_s=None)
                    old_pids = self._old_pids(run, old, keep_router=new is not None)
                    old_gpus = self._gpus_holding(old_pids)  # before the stop: then they leave NVML's list
                    unloaded = self._stop(run, old, keep_router=new is not None)
                    if old is not None and (unloaded or not old.attached):
                        with self._lock:
                            self._current = None
                    self._drain(run, old, resolved, old_pids, old_gpus, unloaded)
                    if new is not None:
                        self._set_step("port")
                        run.emit("port", "skipped", f"the router at {to.url} stays: only its model changes")
                    elif to.attach:
                        self._set_step("port")
                        run.emit("port", "skipped", f"{to.name} attaches to {to.url}: nothing to bind")
                        if not to.router_model:
                            self._set_step("start")
                            run.emit("start", "skipped",
                                     f"{to.name} attaches to a running server: nothing to launch")
                        new = launch_instance(resolved)
                    else:
                        self._check_port(run, to)
                        new = self._launch(run, resolved)
                        self._check_started(run, new, more=bool(to.router_model))
                    if to.router_model:
                        self._load(run, new)
                    self._ready(run, new)
                    with self._lock:  # cancel() sets events and reads _starting under this lock too
                        if not run.cancel.is_set():
                            self._starting = None
                            self._current, self._crash, self._cancelled = new, None, None
                    run.check_cancel("ready")
                except StepError:
                    raise
                except Exception as exc:  # a surprise still fails one named step and cleans up
                    raise _unexpected(run, exc) from exc
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
                                start_memory=new.start_memory(),
                            )
                return result
            finally:
                run.close()
                self._set_step(None)
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
            runs, starting = list(self._runs), self._starting
            for event in runs:
                event.set()
            if starting is not None:
                self._cancelled = starting
        if starting is not None and starting.launched is not None:
            starting.stopping = True  # its exit is ours, not a crash
            starting.group().signal(signal.SIGTERM)
        return bool(runs), starting

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
        run = _Run(on_step, cancel or threading.Event())
        with self._lock:  # also a start cancelled earlier (q, then shutdown) is reported here
            cancelled, self._cancelled = self._cancelled, None
        try:
            return self._stop_locked(run, leave_adopted, starting or cancelled)
        finally:
            run.close()
            self._busy.release()

    def _stop_locked(self, run: _Run, leave_adopted: bool, cancelled: EngineInstance | None) -> SwitchResult:
        old = self.current
        if old is None and cancelled is not None:  # a start was in flight: say what became of it
            self._set_step("stop")
            gone = not cancelled.survivors()
            run.emit(
                "stop", "ok" if gone else "failed",
                f"the start of {cancelled.name} was cancelled: PID {cancelled.pid} "
                + ("stopped and verified gone" if gone else f"still running: {cancelled.survivors()}"),
            )
            self._set_step(None)
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
                start_memory=inst.start_memory(),
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
            start_memory=inst.start_memory(),
        )
        with self._lock:
            if self._current is inst:
                self._crash = crash
        if self._record_state:
            state.remove_state(inst.name, inst.pid)
        return crash

    # ---- steps ---------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _track(self, run: _Run) -> Iterator[None]:
        """Register a run's cancel event while it waits for and holds `_busy`, so cancel() reaches it; after
        shutdown() it is cancelled before it begins."""
        with self._lock:
            self._runs.add(run.cancel)
            if self._closed:
                run.cancel.set()
        try:
            yield
        finally:
            with self._lock:
                self._runs.discard(run.cancel)

    def _set_step(self, name: str | None) -> None:
        with self._lock:
            self._step = name

    def _resolve(self, run: _Run, to: Profile, ask_router: bool = False) -> ResolvedProfile:
        self._set_step("resolve")
        run.emit("resolve", "running", f"substituting variables of {to.name}")
        try:
            resolved = resolve(to)
        except ProfileError as exc:
            raise StepError("resolve", f"profile {to.name} cannot start: {exc}") from exc
        what = "attach, nothing to launch" if resolved.argv is None else f"{len(resolved.argv)} arguments"
        if to.router_model and ask_router:  # an unknown model is refused before anything is stopped
            router = run.router(resolved)
            status = router.status(to.router_model, "resolve")
            what = f"{router.KIND} at {to.url} has {to.router_model} ({status.get('value')})"
            if to.swap_profile:
                self._swap(router, to).check_profile(to.swap_profile, "resolve")
                what += f" and profile {to.swap_profile}"
        run.emit(
            "resolve", "ok", f"{to.name}: {what}" + (", API key read from file" if resolved.api_key else "")
        )
        return resolved

    def _stop(self, run: _Run, old: EngineInstance | None, keep_router: bool = False) -> bool:
        """Stop the old engine, or have its router unload its model (an attached router, or one that serves
        the next profile too); True when a model was unloaded."""
        self._set_step("stop")
        run.check_cancel("stop")
        model = old.profile.router_model if old is not None else None
        if old is not None and model and (keep_router or old.attached):
            router = run.router(old.resolved)
            if old.attached and not router.answers():  # gone, and its models with it: nothing to unload
                run.emit("stop", "skipped", f"nothing answers at {old.url} any more: {model} is not loaded")
                return False
            run.emit("stop", "running", f"asking {router.KIND} at {old.url} to unload {model}")
            router.unload(model, lambda words: run.emit("stop", "running", words))
            if self._record_state and not old.attached:  # the router's record moves to the next profile
                state.remove_state(old.name, old.pid)
            run.emit("stop", "ok", f"{router.KIND} at {old.url} accepted the unload of {model}")
            return True
        if old is None or old.attached:
            run.emit(
                "stop",
                "skipped",
                "no engine running"
                if old is None
                else f"{old.name} is attached, not started by enginetop: left running",
            )
            return False
        if not old.alive() and not old.stopping:
            run.emit("stop", "running", f"{old.name} had already exited ({exit_words(old.exit_code())})")
        run.emit("stop", "running", f"SIGTERM to process group {old.pgid} of {old.name}")
        message = stop_instance(old)  # not cancellable: a half-stopped engine helps nobody
        if self._record_state:
            state.remove_state(old.name, old.pid)
        run.emit("stop", "ok", f"{old.name} {message}")
        return False

    @staticmethod
    def _old_pids(run: _Run, old: EngineInstance | None, keep_router: bool) -> set[int]:
        """The processes the switch frees: the old engine's tree, or the router's child of the old model."""
        if old is None:
            return set()
        if old.profile.router_model and (keep_router or old.attached):
            return run.router(old.resolved).processes(old.profile.router_model)
        return set() if old.attached else old.tree_pids() | set(old.pids_seen)

    def _gpus_holding(self, pids: set[int]) -> set[int]:
        """Indices of the GPUs where NVML lists one of these processes now."""
        if self._gpu is None or not pids:
            return set()
        report = self._gpu()
        return {gpu.index for gpu in report.gpus if any(p.pid in pids for p in gpu.processes)}

    def _drain(
        self, run: _Run, old: EngineInstance | None, resolved: ResolvedProfile, old_pids: set[int],
        old_gpus: set[int], unloaded: bool = False,
    ) -> None:
        """Wait until the old engine's resources are really free, as an independent check would see."""
        self._set_step("drain")
        to = resolved.profile
        threshold = to.vram_threshold_bytes
        deadline = time.monotonic() + to.drain_timeout_s
        ours = old if old is not None and not old.attached and not unloaded else None  # stopped: wait for it
        if ours:
            old_pids = set(ours.pids_seen)
        elif not unloaded:
            old_pids = set()
        what = "old processes gone, old port closed" if ours else "no engine was running"
        if old is not None and unloaded:
            model = str(old.profile.router_model)
            run.emit("drain", "running", f"waiting for {model} to be unloaded")
            what = run.router(old.resolved).wait_unloaded(
                model, old_pids, run.cancel, lambda words: run.emit("drain", "running", words),
                timeout=to.drain_timeout_s)
        # On the GPU a PID is only a number: a dead engine's PID listed there is still its context.
        last = ""
        while True:
            run.check_cancel("drain")
            blockers: list[str] = []
            if ours:
                alive = ours.survivors()
                if alive:
                    blockers.append(f"old PIDs still running: {', '.join(map(str, alive))}")
                if port_open(ours.profile.connect_host, ours.profile.port):
                    blockers.append(f"old port {ours.profile.port} still listening")
            report = self._gpu() if self._gpu is not None else None
            gpu_words = "no GPU"
            if report is not None and report.gpus:
                watched = drain_gpus(report.gpus, old_gpus, visible_devices(resolved.env))
                words = []
                for gpu in report.gpus:
                    blocked, word = _gpu_drained(gpu, gpu.index in watched, old_pids, threshold, to)
                    blockers += blocked
                    if word:
                        words.append(word)
                gpu_words = "; ".join(words)
            elif report is not None and report.unavailable:
                gpu_words = f"no GPU ({report.unavailable})"
            if not blockers:
                run.emit("drain", "ok", f"{what}; {gpu_words or 'GPU memory below threshold'}")
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
        with self._lock:
            self._starting = new  # from here cancel() signals it
        if self._record_state:
            with contextlib.suppress(OSError):  # `down` must find an engine that is still starting too
                state.write_state(new)
        return new

    @staticmethod
    def _swap(router: Router, to: Profile) -> LlamaSwap:
        if not isinstance(router, LlamaSwap):
            raise StepError("resolve", f"swap_profile {to.swap_profile!r} needs llama-swap, and {to.url} "
                                       "is a llama-server router")
        return router

    def _check_started(self, run: _Run, new: EngineInstance, more: bool = False) -> None:
        if not new.alive():
            raise StepError("start", crash_message(new, "immediately"))
        run.emit("start", "running" if more else "ok", f"PID {new.pid} running, log {new.log_path}")

    def _load(self, run: _Run, new: EngineInstance) -> None:
        """Have the router load the new profile's model (the router launched just now answers first)."""
        self._set_step("start")
        model = str(new.profile.router_model)
        def waiting(words: str) -> None:
            run.emit("start", "running", words)

        deadline = time.monotonic() + new.profile.start_timeout_s
        while True:  # a router launched just now: until it answers /models
            run.check_cancel("start")
            if new.launched is not None and not new.alive():
                raise StepError("start", crash_message(new, "while starting"))
            router = run.router(new.resolved)
            try:
                router.models("start")
                break
            except StepError as exc:
                if new.attached or time.monotonic() >= deadline:
                    raise
                run.forget_router(new.url)
                waiting(str(exc))
            time.sleep(0.25)
        if new.profile.swap_profile:
            self._swap(router, new.profile).activate(new.profile.swap_profile, waiting)
        new.started_mono = time.monotonic()  # its cold start: load request to first completion
        beside = router.load(model, waiting)
        run.emit("start", "ok", f"{router.KIND} at {new.url} is loading {model}{beside}" if beside is not None
                 else f"{model} was already loaded on {router.KIND} at {new.url}: nothing to load")

    def _ready(self, run: _Run, new: EngineInstance) -> None:
        self._set_step("ready")
        run.emit("ready", "running", f"waiting for {new.url}")
        recorded = new.cold_start_s
        def waiting(msg: str) -> None:
            run.emit("ready", "running", msg)

        model = new.profile.router_model
        if model:  # a completion naming a model that is not loaded would load it: wait for the router first
            run.router(new.resolved).wait_loaded(model, run.cancel, waiting, new.profile.start_timeout_s)
        cold = wait_ready(new, run.cancel, waiting)
        if model:
            detail = f"{model} loaded and answers a 1-token completion, {cold:.2f} s after the load request"
        elif new.adopted:
            new.cold_start_s = recorded  # its own cold start, as `up` measured it
            detail = "the adopted engine answers health and a 1-token completion"
        elif new.attached:
            detail = "attached server answers health and a 1-token completion"
        else:
            detail = f"cold start {cold:.2f} s (launch to first 1-token completion)"
        run.emit("ready", "ok", detail)

    def _discard(self, new: EngineInstance) -> None:
        """Stop an engine we started in a switch that then failed or was cancelled."""
        with contextlib.suppress(StepError):
            stop_instance(new)
        if self._record_state:
            state.remove_state(new.name, new.pid)


# ---------------------------------------------------------------- which GPUs the drain waits on


def visible_devices(env: dict[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES as the new engine will see it (its profile's env over ours), None when unset."""
    return env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))


def cuda_visible_indices(value: str, gpus: tuple[GpuSample, ...]) -> set[int] | None:
    """NVML indices of the GPUs a CUDA_VISIBLE_DEVICES value names; None when that cannot be told for sure.

    Entries are indices or (prefixes of) GPU UUIDs; CUDA stops at the first invalid one. CUDA numbers GPUs
    fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML in PCI order: the two agree when the GPUs are
    all the same model, so an index is trusted only then. A MIG UUID names no whole GPU here: unknown."""
    pci_order = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    same_model = len({gpu.name for gpu in gpus}) <= 1
    picked: set[int] = set()
    for item in (part.strip() for part in value.split(",")):
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0 or index >= len(gpus):
                break
            if not (pci_order or same_model):
                return None
            picked.add(index)
            continue
        if not item or item.startswith("MIG-"):
            return None if item else picked
        uuid = item if item.startswith("GPU-") else f"GPU-{item}"
        matches = [gpu.index for gpu in gpus if gpu.uuid and gpu.uuid.startswith(uuid)]
        if len(matches) != 1:
            break  # unknown or ambiguous: CUDA stops here too
        picked.add(matches[0])
    return picked


def drain_gpus(gpus: tuple[GpuSample, ...], old_gpus: set[int], visible: str | None) -> set[int]:
    """The GPUs whose memory must drain before the new engine starts: where the old engine's processes
    were seen, plus those the new one will use; every GPU when neither is known."""
    targets = cuda_visible_indices(visible, gpus) if visible is not None else None
    if not old_gpus and targets is None:
        return {gpu.index for gpu in gpus}
    return old_gpus | (targets or set())


def _gpu_drained(
    gpu: GpuSample, watched: bool, old_pids: set[int], threshold: int, to: Profile
) -> tuple[list[str], str | None]:
    """(what still blocks on this GPU, words for the final message)."""
    label = f"GPU {gpu.index}"
    if gpu.error:
        return ([f"{label}: {gpu.error}"] if watched else []), None
    blockers = []
    holders = sorted(p.pid for p in gpu.processes if p.pid in old_pids)
    if holders:  # on any GPU: a dead engine's PID listed there is still its context
        blockers.append(f"{label}: old engine PIDs {', '.join(map(str, holders))} still hold GPU memory")
    if not watched:
        return blockers, f"{label} not waited on (neither the old engine's nor the new one's)"
    if gpu.vram_used_bytes is None:
        return blockers, f"{label} VRAM used unknown"
    # Memory of other live processes (another engine on this machine) is theirs, not the old engine's.
    others = [p for p in gpu.processes if p.pid not in old_pids and p.used_bytes and pid_alive(p.pid)]
    other_bytes = sum(p.used_bytes or 0 for p in others)
    besides = (
        f", {other_bytes / GIB:.1f} GiB of it held by other processes "
        f"(PIDs {', '.join(str(p.pid) for p in others)}), not counted"
        if others
        else ""
    )
    used = f"VRAM used {gpu.vram_used_bytes / GIB:.1f} GiB{besides}"
    if gpu.vram_used_bytes - other_bytes >= threshold:
        blockers.append(f"{label}: {used} (threshold {to.vram_threshold_gib:g} GiB)")
    return blockers, f"{label} {used}"
