"""What enginetop watches: an engine's URL, its name on screen, and how to reach it (key, paths)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineTarget:
    name: str
    url: str  # base URL without credentials, e.g. http://127.0.0.1:8080 (tui.net.policy.split_credentials)
    api_key: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)  # user:password from the URL
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    model: str | None = None  # what requests name: a llama-server router's model (None: the engine's own)
    # the API its probes speak: "ollama" (its native /api/chat), "openai", or None: asked once
    # (tui.probe.ollama)
    api: str | None = None

    @property
    def base(self) -> str:
        return self.url.rstrip("/")
