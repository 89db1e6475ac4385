"""Changing the model of a llama-server router, each step checked independently and timed.

The router answers `POST /models/load` and `/models/unload` at once and does the work in the background,
so every verdict here comes from looking again: GET /models (which loads nothing) for the model's status,
the OS for its child process, and for readiness a real 1-token completion sent only once /models says
`loaded` (a request naming an unloaded model would load it). Blocking (httpx.Client): the switch runs in
a thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psutil

from tui.base.process import pid_alive, port_listeners
from tui.lifecycle.engine import Cancelled, StepError, timeout_message
from tui.lifecycle.profiles import Profile
from tui.net.policy import auth_headers, client_kwargs, error_text
from tui.sources.router import MODELS_PATH, parse_models

POLL_S = 0.2
UNLOAD_TIMEOUT_S = 60.0


class Router:
    """One router, as a switch talks to it."""

    def __init__(self, profile: Profile, api_key: str | None) -> None:
        self.profile = profile
        self.url = profile.url
        self._client = httpx.Client(
            timeout=httpx.Timeout(30.0, connect=2.0), headers=auth_headers(api_key), **client_kwargs(self.url)
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            raise StepError(step, f"the router at {self.url} has no model {model!r} (it has: {known})")
        return models[model]

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
                      progress: Callable[[str], object], timeout: float = UNLOAD_TIMEOUT_S) -> str:
        """Until /models says unloaded and the model's child process is gone."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if cancel.is_set():
                raise Cancelled("drain")
            value = self.status(model, "drain").get("value")
            alive = sorted(pid for pid in pids if pid_alive(pid))
            blockers = []
            if value != "unloaded":
                blockers.append(f"{model} is {value} on the router")
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

    def load(self, model: str, progress: Callable[[str], object]) -> bool:
        """Ask the router to load `model`; False when it was loaded already (nothing asked)."""
        status = self.status(model, "start")
        if status.get("value") == "loaded":
            return False
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
        words = f"the router accepted the load of {model}"
        if isinstance(limit, int) and limit > 0 and len(loaded) >= limit:
            words += (f"; it holds {len(loaded)} of its limit of {limit} models ({', '.join(loaded)}), so it "
                      "unloads the least recently used one")
        progress(words)
        return True

    def wait_loaded(self, model: str, cancel: threading.Event, progress: Callable[[str], object],
                    timeout: float) -> None:
        """Until /models says loaded; a load that failed is named with its exit code."""
        deadline = time.monotonic() + timeout
        began = time.monotonic()
        seen_loading = False
        while True:
            if cancel.is_set():
                raise Cancelled("ready")
            status = self.status(model, "ready")
            value = status.get("value")
            if value == "loaded":
                return
            if status.get("failed") or (seen_loading and value == "unloaded"):
                code = status.get("exit_code")
                raise StepError("ready", f"the router could not load {model}: its process exited"
                                         + (f" with code {code}" if code is not None else "")
                                         + " (the router's log says why)")
            seen_loading = seen_loading or value == "loading"
            progress(f"{model} is {value} ({time.monotonic() - began:.0f} s)")
            if time.monotonic() >= deadline:
                raise StepError("ready", timeout_message("ready", timeout, f"{model} is {value}"),
                                timed_out=True)
            time.sleep(POLL_S)


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
