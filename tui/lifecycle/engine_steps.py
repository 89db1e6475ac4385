"""What each step of a switch does to the engines and their routers, step by step: resolve the profile, stop
the old engine (or have its router unload its model), check the port, check the launched engine lives,
have a router load the new model, and wait until the new engine answers.

tui.lifecycle.switch runs these in order and keeps the engine it owns; the drain between stop and port is
tui.lifecycle.drain's. Each step says so first (`run.enter`), so the engine's status shows which one runs,
and fails as a StepError that names it, in words a user can act on.
"""

from __future__ import annotations

import time

from tui.base.process import describe_process, port_listeners, port_open
from tui.lifecycle import state
from tui.lifecycle.engine import (
    EngineInstance,
    StepError,
    crash_message,
    exit_words,
    port_holder_words,
    stop_instance,
    wait_ready,
)
from tui.lifecycle.profile_resolve import ResolvedProfile, resolve
from tui.lifecycle.profiles import Profile, ProfileError
from tui.lifecycle.router import LlamaSwap, Router
from tui.lifecycle.switch_run import SwitchRun


def resolve_target(run: SwitchRun, to: Profile, ask_router: bool = False) -> ResolvedProfile:
    """The profile to start, resolved (variables, key file); for a router's model, the router is asked
    whether it has that model first when `ask_router`."""
    run.enter("resolve")
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
            _llama_swap(router, to).check_profile(to.swap_profile, "resolve")
            what += f" and profile {to.swap_profile}"
    run.emit(
        "resolve", "ok", f"{to.name}: {what}" + (", API key read from file" if resolved.api_key else "")
    )
    return resolved


def stop_old(
    run: SwitchRun, old: EngineInstance | None, record_state: bool, keep_router: bool = False
) -> bool:
    """Stop the old engine, or have its router unload its model (an attached router, or one that serves
    the next profile too); True when a model was unloaded."""
    run.enter("stop")
    run.check_cancel("stop")
    model = old.profile.router_model if old is not None else None
    if old is not None and model and (keep_router or old.attached):
        router = run.router(old.resolved)
        if old.attached and not router.answers():  # gone, and its models with it: nothing to unload
            run.emit("stop", "skipped", f"nothing answers at {old.url} any more: {model} is not loaded")
            return False
        run.emit("stop", "running", f"asking {router.KIND} at {old.url} to unload {model}")
        router.unload(model, lambda words: run.emit("stop", "running", words))
        if record_state and not old.attached:  # the router's record moves to the next profile
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
    if record_state:
        state.remove_state(old.name, old.pid)
    run.emit("stop", "ok", f"{old.name} {message}")
    return False


def check_port(run: SwitchRun, to: Profile) -> None:
    """Refuse to start when someone else listens on the port (the new engine would fail confusingly)."""
    run.enter("port")
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


def check_started(run: SwitchRun, new: EngineInstance, more: bool = False) -> None:
    """The engine launched just now still runs (`more`: the start step goes on, a router loads a model)."""
    if not new.alive():
        raise StepError("start", crash_message(new, "immediately"))
    run.emit("start", "running" if more else "ok", f"PID {new.pid} running, log {new.log_path}")


def load_model(run: SwitchRun, new: EngineInstance) -> None:
    """Have the router load the new profile's model (the router launched just now answers first)."""
    run.enter("start")
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
        _llama_swap(router, new.profile).activate(new.profile.swap_profile, waiting)
    new.started_mono = time.monotonic()  # its cold start: load request to first completion
    beside = router.load(model, waiting)
    run.emit("start", "ok", f"{router.KIND} at {new.url} is loading {model}{beside}" if beside is not None
             else f"{model} was already loaded on {router.KIND} at {new.url}: nothing to load")


def confirm_ready(run: SwitchRun, new: EngineInstance) -> None:
    """Wait until the new engine answers health and a real 1-token completion (a router's model loaded
    first); its cold start is measured here."""
    run.enter("ready")
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


def _llama_swap(router: Router, to: Profile) -> LlamaSwap:
    if not isinstance(router, LlamaSwap):
        raise StepError("resolve", f"swap_profile {to.swap_profile!r} needs llama-swap, and {to.url} "
                                   "is a llama-server router")
    return router
