"""What the command line asks of the fleet view, and the sources it makes (feed sources: tui.live.feed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tui.fleet.dcgm import DcgmDirectSource, DcgmPrometheusSource
from tui.fleet.prometheus import PrometheusClient
from tui.fleet.source import FleetSource
from tui.model.samples import GpuReport
from tui.net.keepalive import Transports

DEFAULT_REFRESH_S = 5.0


@dataclass
class FleetOptions:
    prometheus: str | None = None  # base URL; None = no Prometheus (GPUs from --dcgm only)
    token: str | None = field(default=None, repr=False)  # bearer token, from --prometheus-key-file
    match: str | None = None  # e.g. {job=~"vllm.*"}
    refresh_s: float = DEFAULT_REFRESH_S
    dcgm: list[str] = field(default_factory=list)  # dcgm-exporter /metrics URLs read directly
    timeout_s: float = 5.0
    # API keys for probing engines opened from the table (`f`): by engine name as the table shows it, or
    # "*" for every engine without its own (--api-key-file / --api-key-env with --prometheus)
    engine_keys: dict[str, str] = field(default_factory=dict, repr=False)

    def key_for(self, engine: str) -> str | None:
        return self.engine_keys.get(engine, self.engine_keys.get("*"))


@dataclass
class FleetSources:
    client: PrometheusClient | None
    engines: FleetSource | None
    gpus: DcgmPrometheusSource | DcgmDirectSource | None

    def all(self) -> list:
        return [s for s in (self.engines, self.gpus) if s is not None]

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if isinstance(self.gpus, DcgmDirectSource):
            await self.gpus.aclose()


def make_sources(options: FleetOptions, gpu_report: Callable[[], GpuReport | None],
                 transports: Transports | None = None) -> FleetSources:
    """`transports`: how an engine of the fleet is reached directly (the /slots of the one opened)."""
    client = PrometheusClient(options.prometheus, options.token, timeout=options.timeout_s) \
        if options.prometheus else None
    engines = FleetSource(client, options.match, options.refresh_s, gpus=gpu_report) if client else None
    if engines is not None:
        engines.transports = transports
    gpus: DcgmPrometheusSource | DcgmDirectSource | None = None
    if options.dcgm:
        gpus = DcgmDirectSource(options.dcgm, options.refresh_s, timeout=options.timeout_s)
    elif client is not None:
        gpus = DcgmPrometheusSource(client, None, options.refresh_s)
    return FleetSources(client, engines, gpus)
