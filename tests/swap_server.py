"""A loopback stand-in for llama-swap (github.com/mostlygeek/llama-swap), which no package registry ships.

It answers as llama-swap's own source does (internal/server/server.go, api.go, apigroup.go; read at commit
0bdb3720, 2026-08): the same paths, JSON shapes, error envelope and SSE framing, and the behaviour a monitor
must respect: a request naming a model (in its body, or under /upstream/{model}/) STARTS that model when it
is not ready, stopping the other (one swap group, swap: true); /running lists only processes that are not
stopped; unloading blocks until the process is gone. Its upstreams are real: each model is a real process
(the tests run the real llama-server with the demo model) started on a free port when first asked for.

    python -m tests.swap_server --port P --models '{"gemma-a": ["llama-server", "--port", "${PORT}", ...]}'

What it leaves out: the UI, logs endpoints, peers, selectors, matrix routing, TTLs, /api/metrics/activity,
/api/performance; /metrics answers 503 "# performance monitor not available" as llama-swap does without
its perf monitor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.base.process import Launched, free_port, launch, stop_group  # noqa: E402

STATES = ("stopped", "starting", "ready", "stopping", "shutdown")
INFERENCE = ("/v1/chat/completions", "/v1/completions")


@dataclass
class Model:
    id: str
    cmd: list[str]  # ${PORT} is replaced by the port it gets
    state: str = "stopped"
    port: int | None = None
    process: Launched | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None


def go_json(value: Any) -> str:
    """As Go's encoding/json writes it: no spaces."""
    return json.dumps(value, separators=(",", ":"))


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=go_json)


def error(status: int, message: str) -> web.Response:
    """swaputil.SendResponse: the OpenAI-shaped envelope with src llama-swap."""
    kinds = {400: ("invalid_request_error", "invalid_request"), 404: ("invalid_request_error", "not_found"),
             409: ("invalid_request_error", "conflict"), 502: ("server_error", "bad_gateway")}
    kind, code = kinds.get(status, ("server_error", "internal_error"))
    detail = {"message": message, "type": kind, "param": None, "code": code}
    return reply({"src": "llama-swap", "error": detail}, status)


class Swap:
    def __init__(self, models: dict[str, list[str]], profiles: dict[str, dict[str, str]],
                 log_dir: Path) -> None:
        self.models = {name: Model(name, cmd) for name, cmd in models.items()}
        self.profiles = profiles
        self.active: str | None = None
        self.log_dir = log_dir
        self.listeners: set[asyncio.Queue[dict[str, Any]]] = set()
        self.inflight: dict[str, dict[str, Any]] = {}
        self.lock = asyncio.Lock()  # one swap at a time, like the router's run loop
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    # ---- events ---------------------------------------------------------------------------------------

    def emit(self, kind: str, data: Any) -> None:
        message = {"type": kind, "data": go_json(data)}
        for queue in self.listeners:
            queue.put_nowait(message)

    def model_status(self) -> list[dict[str, Any]]:
        return [{"id": m.id, "name": "", "description": "", "state": m.state, "unlisted": False, "peerID": ""}
                for m in self.sorted()]

    def sorted(self) -> list[Model]:
        return sorted(self.models.values(), key=lambda m: m.id)

    def set_state(self, model: Model, state: str) -> None:
        model.state = state
        self.emit("modelStatus", self.model_status())

    # ---- processes --------------------------------------------------------------------------------------

    async def ensure_ready(self, model: Model) -> str | None:
        """Start `model` if it is not ready, stopping the others first (swap). None, or why it failed."""
        async with self.lock:
            if model.state == "ready" and model.process is not None and model.process.alive():
                return None
            for other in self.models.values():
                if other is not model and other.state != "stopped":
                    await self._stop(other)
            return await self._start(model)

    async def _start(self, model: Model) -> str | None:
        self.set_state(model, "starting")
        model.port = free_port()
        argv = [a.replace("${PORT}", str(model.port)) for a in model.cmd]
        model.process = launch(argv, self.log_dir / f"swap-{model.id}-{model.port}.log")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not model.process.alive():
                self.set_state(model, "stopped")
                return f"upstream command exited prematurely with code {model.process.poll()}"
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"http://127.0.0.1:{model.port}/health") as reply:
                    if reply.status == 200:
                        self.set_state(model, "ready")
                        return None
            await asyncio.sleep(0.1)
        await self._stop(model)
        return "health check timed out"

    async def _stop(self, model: Model) -> None:
        if model.process is None:
            model.state = "stopped"
            return
        self.set_state(model, "stopping")
        process, model.process = model.process, None
        await asyncio.to_thread(stop_group, process, 10.0)
        self.set_state(model, "stopped")

    async def unload(self, names: list[str]) -> None:
        async with self.lock:
            for name in names:
                await self._stop(self.models[name])

    async def close(self) -> None:
        for model in self.models.values():
            if model.process is not None:
                await asyncio.to_thread(stop_group, model.process, 10.0)
        await self.http.close()

    # ---- proxying ---------------------------------------------------------------------------------------

    async def forward(self, request: web.Request, model: Model, path: str, body: bytes,
                      tracked: bool) -> web.StreamResponse:
        """Start the model if it is not ready, then pass the request through. `tracked`: an inference request,
        in flight from the moment it arrives (a model still starting included), as llama-swap's inflight
        middleware counts it; its monitoring reads (/metrics, /slots) are not."""
        entry = {"id": uuid.uuid4().hex[:16], "timestamp": datetime.now(UTC).isoformat(), "model": model.id,
                 "req_path": path, "method": request.method, "req_headers": {},
                 "remote_ip": request.remote or "", "resp_headers": {}, "resp_bytes": 0, "elapsed_ms": 0,
                 "began": time.monotonic()}
        if tracked:
            self.inflight[entry["id"]] = entry
            self.emit("inflight", {"operation": "upsert", "request": public(entry)})
        try:
            failure = await self.ensure_ready(model)
            if failure is not None:
                return error(502, f"unable to start process: {failure}")
            url = f"http://127.0.0.1:{model.port}{path}"
            if request.query_string:
                url += "?" + request.query_string
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() in ("content-type", "authorization")}
            async with self.http.request(request.method, url, data=body or None, headers=headers) as upstream:
                response = web.StreamResponse(status=upstream.status)
                for key in ("Content-Type", "Cache-Control"):
                    if key in upstream.headers:
                        response.headers[key] = upstream.headers[key]
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    entry["resp_bytes"] += len(chunk)
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            if self.inflight.pop(entry["id"], None) is not None:
                self.emit("inflight", {"operation": "remove", "id": entry["id"]})

    def inflight_snapshot(self) -> list[dict[str, Any]]:
        return sorted((public(e) for e in self.inflight.values()), key=lambda e: e["timestamp"])


def public(entry: dict[str, Any]) -> dict[str, Any]:
    """An in-flight entry as llama-swap sends it, elapsed_ms as of now."""
    shown = {k: v for k, v in entry.items() if k != "began"}
    shown["elapsed_ms"] = int((time.monotonic() - entry["began"]) * 1000)
    return shown


def app_for(swap: Swap) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/health")
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(status=503, text="# performance monitor not available\n")

    @routes.get("/running")
    async def running(request: web.Request) -> web.Response:
        listed = [{"model": m.id, "state": m.state, "cmd": " ".join(m.cmd), "proxy": f"http://127.0.0.1:{m.port}",
                   "ttl": 0, "name": "", "description": ""}
                  for m in swap.sorted() if m.state not in ("stopped", "shutdown")]
        return reply({"running": listed})

    @routes.get("/v1/models")
    @routes.get("/models")
    async def models(request: web.Request) -> web.Response:
        created = int(time.time())
        data = [{"id": m.id, "object": "model", "created": created, "owned_by": "llama-swap",
                 "status": {"value": "unloaded" if m.state in ("stopped", "shutdown") else "loaded"},
                 "meta": {"llamaswap": {"type": "model"}}} for m in swap.sorted()]
        return reply({"object": "list", "data": data})

    @routes.post("/api/models/unload")
    async def unload_all(request: web.Request) -> web.Response:
        await swap.unload(list(swap.models))
        return reply({"msg": "ok"})

    @routes.post("/api/models/unload/{model:.+}")
    async def unload_one(request: web.Request) -> web.Response:
        name = request.match_info["model"].lstrip("/")
        if name not in swap.models:
            return error(404, "model not found")
        await swap.unload([name])
        return web.Response(text="OK")

    @routes.get("/api/profiles")
    async def profiles(request: web.Request) -> web.Response:
        return reply({"active": swap.active, "profiles": [
            {"id": name, "description": "", "pins": pins} for name, pins in sorted(swap.profiles.items())]})

    @routes.put("/api/profiles/active")
    async def active(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "invalid profile request")
        if "name" not in body:
            return error(400, "profile name is required")
        name = body["name"]
        if name is not None and name not in swap.profiles:
            return error(404, f"profile {name} not found")
        swap.active = name
        swap.emit("profileChanged", {"active": swap.active})
        return reply({"active": swap.active})

    @routes.get("/api/events")
    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive",
            "X-Accel-Buffering": "no"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        swap.listeners.add(queue)
        initial = [
            {"type": "logData", "data": go_json({"source": "proxy", "data": "llama-swap listening\n"})},
            {"type": "logData", "data": go_json({"source": "upstream", "data": ""})},
            {"type": "modelStatus", "data": go_json(swap.model_status())},
            {"type": "uiConfig", "data": go_json({})},
            {"type": "profileChanged", "data": go_json({"active": swap.active})},
            {"type": "inflight", "data": go_json({"operation": "snapshot",
                                                  "requests": swap.inflight_snapshot()})},
        ]
        try:
            for message in initial:
                await response.write(f"event:message\ndata:{go_json(message)}\n\n".encode())
            while True:
                message = await queue.get()
                await response.write(f"event:message\ndata:{go_json(message)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            swap.listeners.discard(queue)
        return response

    @routes.route("*", "/upstream/{model}/{path:.*}")
    async def upstream(request: web.Request) -> web.StreamResponse:
        model = swap.models.get(request.match_info["model"])
        if model is None:
            return error(404, "model not found")
        path = "/" + request.match_info["path"]
        return await swap.forward(request, model, path, await request.read(), tracked=path in INFERENCE)

    async def by_body(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            name = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return error(400, "invalid JSON")
        if not name:
            return error(400, "missing or invalid 'model' key")
        model = swap.models.get(name)
        if model is None:
            return error(400, f"could not find suitable inference handler for {name}")
        return await swap.forward(request, model, request.path, body, tracked=True)

    app = web.Application()
    app.add_routes(routes)
    for path in INFERENCE:
        app.router.add_post(path, by_body)
    return app


async def serve(port: int, models: dict[str, list[str]], profiles: dict[str, dict[str, str]],
                log_dir: Path) -> None:
    swap = Swap(models, profiles, log_dir)
    runner = web.AppRunner(app_for(swap), handle_signals=False, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"llama-swap stand-in listening on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await swap.close()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--models", required=True, help="JSON: model id -> argv with ${PORT}")
    parser.add_argument("--profiles", default="{}", help="JSON: profile id -> pins {model: model}")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    asyncio.run(serve(args.port, json.loads(args.models), json.loads(args.profiles), args.log_dir))


if __name__ == "__main__":
    main()
