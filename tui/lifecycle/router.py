"""Changing the model of a llama-server router or of llama-swap, each step checked independently and timed.

A llama-server router answers `POST /models/load` and `/models/unload` at once and does the work in the
background, so every verdict here comes from looking again: GET /models (which loads nothing) for the
model's status, the OS for its child process, and for readiness a real 1-token completion sent only once
/models says `loaded` (a request naming an unloaded model would load it). llama-swap: see LlamaSwap.
Blocking (httpx.Client): the switch runs in a thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import psutil

from tui.base.process import pid_alive, port_listeners
from tui.lifecycle.engine import Cancelled, StepError, timeout_message
from tui.lifecycle.profiles import Profile
from tui.net.policy import auth_headers, client_kwargs, error_text, is_loopback_host
from tui.sources import swap as swap_source
from tui.sources.router import MODELS_PATH, parse_models

POLL_S = 0.2


class Router:
    """A llama-server in router mode, as a switch talks to it (LlamaSwap below: llama-swap)."""

    KIND = "the router"
    UNLOADED: tuple[str, ...] = ("unloaded", "downloaded")
    LOADED = "loaded"

    def __init__(self, profile: Profile, api_key: str | None) -> None:
        self.profile = profile
        self.url = profile.url
        self._client = httpx.Client(
            timeout=httpx.Timeout(30.0, connect=2.0), headers=auth_headers(api_key), **client_kwargs(self.url)
        )

    def close(self) -> None:
        self._client.close()

    def models(self, step: str) -> dict[str, dict[str, Any]]:
        """Each model's status object ({value, failed?, exit_code?, args}) by id."""
        try:
            reply = self._client.get(self.url + MODELS_PATH)
            if reply.status_code != 200:
                raise StepError(step, f"the router's {MODELS_PATH} answered HTTP {reply.status_code}"
                                      f"{_reason(reply)}: is {self.url} a llama-server in router mode?")
            items = parse_models(reply.content)
        except httpx.HTTPError as exc:
            raise StepError(step, f"the router at {self.url} does not answer {MODELS_PATH}: "
                                  f"{type(exc).__name__}") from exc
        except ValueError as exc:
            raise StepError(step, f"the router's {MODELS_PATH} is not a model list: {exc}") from exc
        return {m["id"]: m["status"] if isinstance(m.get("status"), dict) else {} for m in items}

    def status(self, model: str, step: str) -> dict[str, Any]:
        models = self.models(step)
        if model not in models:
            known = ", ".join(sorted(models)) or "none"
            raise StepError(step, f"{self.KIND} at {self.url} has no model {model!r} (it has: {known})")
        return models[model]

    def answers(self) -> bool:
        """Does anything answer HTTP at the router's address?"""
        try:
            self._client.get(self.url + self.profile.health_path, timeout=5.0)
        except httpx.HTTPError:
            return False
        return True

    def props(self) -> dict[str, Any]:
        try:
            reply = self._client.get(self.url + "/props")
            data = reply.json() if reply.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            data = {}
        return data if isinstance(data, dict) else {}

    def post(self, action: str, model: str, step: str) -> httpx.Response:
        try:
            return self._client.post(f"{self.url}{MODELS_PATH}/{action}", json={"model": model})
        except httpx.HTTPError as exc:
            raise StepError(step, f"POST {MODELS_PATH}/{action} of {model}: {type(exc).__name__}") from exc

    # ---- steps ---------------------------------------------------------------------------------------

    def unload(self, model: str, progress: Callable[[str], object]) -> None:
        """Ask the router to unload `model` (the drain waits until it has)."""
        if self.status(model, "stop").get("value") in ("unloaded", "downloaded"):
            progress(f"{model} was not loaded on the router: nothing to unload")
            return
        reply = self.post("unload", model, "stop")
        if reply.status_code != 200 and "not running" not in reply.text:
            raise StepError("stop", f"the router refused to unload {model}: HTTP {reply.status_code}"
                                    f"{_reason(reply)}")
        progress(f"the router accepted the unload of {model}")

    def wait_unloaded(self, model: str, pids: set[int], cancel: threading.Event,
                      progress: Callable[[str], object], timeout: float) -> str:
        """Until the model is unloaded (stopped) and its process is gone."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if cancel.is_set():
                raise Cancelled("drain")
            value = self.status(model, "drain").get("value")
            alive = sorted(pid for pid in pids if pid_alive(pid))
            blockers = []
            if value not in self.UNLOADED:
                blockers.append(f"{model} is {value} on {self.KIND}")
            if alive:
                blockers.append(f"its process {', '.join(map(str, alive))} still runs")
            if not blockers:
                gone = f"its process {', '.join(map(str, sorted(pids)))} gone" if pids else \
                    "no process of it seen on this machine"
                return f"{model} unloaded, {gone}"
            message = "; ".join(blockers)
            if message != last:
                progress(message)
                last = message
            if time.monotonic() >= deadline:
                raise StepError("drain", timeout_message("drain", timeout, message), timed_out=True)
            time.sleep(POLL_S)

    def load(self, model: str, progress: Callable[[str], object]) -> str | None:
        """Ask the router to load `model`: what the load will do beside it ("" when nothing), None when it
        was loaded already (nothing asked)."""
        status = self.status(model, "start")
        if status.get("value") == "loaded":
            return None
        loaded = [m for m, s in self.models("start").items() if s.get("value") in ("loaded", "loading")]
        limit = self.props().get("max_instances")
        reply = self.post("load", model, "start")
        if reply.status_code == 404:
            raise StepError("start", f"the router does not know {model!r}{_reason(reply)}")
        if reply.status_code != 200:
            already = "already running" in reply.text
            raise StepError("start", f"{model} is already running on the router (loaded by someone else "
                                     "since the switch began)" if already else
                            f"the router refused to load {model}: HTTP {reply.status_code}{_reason(reply)}")
        beside = ""
        if isinstance(limit, int) and limit > 0 and len(loaded) >= limit:
            beside = (f"; it holds {len(loaded)} of its limit of {limit} models ({', '.join(loaded)}), so it "
                      "unloads the least recently used one")
        progress(f"the router accepted the load of {model}{beside}")
        return beside

    def wait_loaded(self, model: str, cancel: threading.Event, progress: Callable[[str], object],
                    timeout: float) -> None:
        """Until the model is loaded (ready); a load that failed is named with its exit code."""
        deadline = time.monotonic() + timeout
        began = time.monotonic()
        seen_loading = False
        while True:
            if cancel.is_set():
                raise Cancelled("ready")
            status = self.status(model, "ready")
            value = status.get("value")
            if value == self.LOADED:
                return
            self.check_load(model, status, seen_loading)
            seen_loading = seen_loading or value not in self.UNLOADED
            progress(f"{model} is {value} ({time.monotonic() - began:.0f} s)")
            if time.monotonic() >= deadline:
                raise StepError("ready", timeout_message("ready", timeout, f"{model} is {value}"),
                                timed_out=True)
            time.sleep(POLL_S)

    def check_load(self, model: str, status: dict[str, Any], seen_loading: bool) -> None:
        """Raise when the load has failed."""
        if status.get("failed") or (seen_loading and status.get("value") == "unloaded"):
            code = status.get("exit_code")
            raise StepError("ready", f"the router could not load {model}: its process exited"
                                     + (f" with code {code}" if code is not None else "")
                                     + " (the router's log says why)")

    def processes(self, model: str) -> set[int]:
        return model_processes(self.profile, model)


class LlamaSwap(Router):
    """llama-swap (tui.sources.swap): /running for states, POST /api/models/unload/{model} (it answers once
    the process has stopped), and no load call: a request naming a model starts it, so the start is a GET of
    /upstream/{model}/health in a thread while /running is watched; its answer tells a failed start."""

    KIND = "llama-swap"
    UNLOADED = ("stopped", "shutdown")
    LOADED = "ready"

    def __init__(self, profile: Profile, api_key: str | None) -> None:
        super().__init__(profile, api_key)
        self._start: tuple[threading.Thread, list[httpx.Response | str]] | None = None

    def running(self, step: str) -> list[dict[str, Any]]:
        try:
            reply = self._client.get(self.url + swap_source.RUNNING_PATH)
        except httpx.HTTPError as exc:
            raise StepError(step, f"llama-swap at {self.url} does not answer {swap_source.RUNNING_PATH}: "
                                  f"{type(exc).__name__}") from exc
        if swap_source.running_states(reply.status_code, reply.content) is None:
            raise StepError(step, f"{self.url}{swap_source.RUNNING_PATH} is not llama-swap's answer "
                                  f"(HTTP {reply.status_code})")
        return [item for item in reply.json()["running"] if isinstance(item, dict)]

    def models(self, step: str) -> dict[str, dict[str, Any]]:
        listed = super().models(step)  # /v1/models lists every model it has
        states = {str(i.get("model")): i for i in self.running(step)}
        return {m: {"value": str(states[m].get("state")) if m in states else "stopped",
                    "proxy": states.get(m, {}).get("proxy")} for m in {*listed, *states}}

    def unload(self, model: str, progress: Callable[[str], object]) -> None:
        if self.status(model, "stop").get("value") in self.UNLOADED:
            progress(f"{model} was not running on llama-swap: nothing to unload")
            return
        try:
            reply = self._client.post(f"{self.url}/api/models/unload/{quote(model, safe='')}",
                                      timeout=self.profile.stop_timeout_s + 30)
        except httpx.HTTPError as exc:
            raise StepError("stop", f"POST /api/models/unload/{model}: {type(exc).__name__}") from exc
        if reply.status_code != 200:
            raise StepError("stop", f"llama-swap refused to unload {model}: HTTP {reply.status_code}"
                                    f"{_reason(reply)}")
        progress(f"llama-swap stopped {model}")

    def load(self, model: str, progress: Callable[[str], object]) -> str | None:
        if self.status(model, "start").get("value") == self.LOADED:
            return None
        answers: list[httpx.Response | str] = []

        def start() -> None:
            try:
                answers.append(self._client.get(f"{self.url}{swap_source.upstream(model, '/health')}",
                                                timeout=self.profile.start_timeout_s))
            except httpx.HTTPError as exc:
                answers.append(type(exc).__name__)

        thread = threading.Thread(target=start, name=f"llama-swap start {model}", daemon=True)
        thread.start()
        self._start = (thread, answers)
        progress(f"asked llama-swap for {model} (GET /upstream/{model}/health starts it)")
        return ""

    def profiles(self, step: str) -> tuple[list[str], str | None]:
        """llama-swap's profile ids and the active one."""
        try:
            data = self._client.get(self.url + swap_source.PROFILES_PATH).json()
            listed = [str(p.get("id")) for p in data.get("profiles") or [] if isinstance(p, dict)]
            return listed, data.get("active")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise StepError(step, f"llama-swap's {swap_source.PROFILES_PATH}: {type(exc).__name__}") from exc

    def check_profile(self, name: str, step: str) -> None:
        known, _ = self.profiles(step)
        if name not in known:
            listed = ", ".join(known) or "none"
            raise StepError(step, f"llama-swap has no profile {name!r} (it has: {listed})")

    def activate(self, name: str, progress: Callable[[str], object]) -> None:
        """Make `name` llama-swap's active profile (its model pins), and check it took."""
        try:
            reply = self._client.put(self.url + swap_source.PROFILES_PATH + "/active", json={"name": name})
        except httpx.HTTPError as exc:
            raise StepError("start", f"PUT {swap_source.PROFILES_PATH}/active: {type(exc).__name__}") from exc
        if reply.status_code != 200:
            raise StepError("start", f"llama-swap refused profile {name}: HTTP {reply.status_code}"
                                     f"{_reason(reply)}")
        active = self.profiles("start")[1]
        if active != name:
            raise StepError("start", f"llama-swap's active profile is {active!r} after setting {name!r}")
        progress(f"llama-swap's active profile is {name}")

    def check_load(self, model: str, status: dict[str, Any], seen_loading: bool) -> None:
        if self._start is None or self._start[0].is_alive() or not self._start[1]:
            return
        answer = self._start[1][0]
        if isinstance(answer, str) or answer.status_code != 200:
            why = answer if isinstance(answer, str) else f"HTTP {answer.status_code}{_reason(answer)}"
            raise StepError("ready", f"llama-swap could not start {model}: {why}")

    def processes(self, model: str) -> set[int]:
        """The upstream process: what listens on the port of /running's proxy URL, on this machine."""
        proxy = self.models("resolve").get(model, {}).get("proxy")
        where = urlsplit(proxy) if isinstance(proxy, str) else None
        if where is None or where.port is None or not is_loopback_host(where.hostname):
            return set()
        return {p.pid for p in port_listeners(where.port) if p is not None}


def open_router(profile: Profile, api_key: str | None) -> Router:
    """The router a profile's `router_model` lives on: llama-swap when its /running answers as llama-swap
    does, else a llama-server in router mode."""
    swap = LlamaSwap(profile, api_key)
    try:
        swap.running("resolve")
    except StepError:
        swap.close()
        return Router(profile, api_key)
    return swap


def model_processes(profile: Profile, model: str) -> set[int]:
    """PIDs of the router's child llama-server that runs `model` (its argv names it with --alias). Only a
    router on this machine can be looked at; elsewhere the empty set."""
    found: set[int] = set()
    for router in port_listeners(profile.port):
        if router is None:
            continue
        try:
            for child in router.children(recursive=True):
                argv = child.cmdline()
                if any(a == "--alias" and b == model for a, b in itertools.pairwise(argv)):
                    found.add(child.pid)
        except psutil.Error:
            continue
    return found


def _reason(reply: httpx.Response) -> str:
    message = error_text(reply.content, limit=120)
    return f" ({message})" if message else ""
