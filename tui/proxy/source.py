"""The proxy's traffic as a feed source (tui.live.feed): the figures of a proxy running in this process, or of
a separate `enginetop proxy` read over HTTP, become TrafficSamples for the same store as everything else."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx

from tui.base.defaults import TRAFFIC_PATH
from tui.model.findings import TrafficFacts
from tui.model.samples import RequestStats
from tui.model.traffic import TrafficSample, TrafficStats
from tui.net.policy import error_text
from tui.proxy.server import TrafficProxy

_STATS_FIELDS = {f.name for f in dataclasses.fields(TrafficStats)}
_FACTS_FIELDS = {f.name for f in dataclasses.fields(TrafficFacts)}
_REQUEST_FIELDS = {f.name for f in dataclasses.fields(RequestStats)}


class ProxyTraffic:
    """A proxy this process runs."""

    def __init__(self, proxy: TrafficProxy, interval_s: float = 1.0) -> None:
        self.proxy = proxy
        self.interval_s = interval_s
        self.name = "traffic proxy"

    async def read(self) -> list[TrafficSample]:
        return self.proxy.samples()


class RemoteTraffic:
    """A separate `enginetop proxy`, read at URL/enginetop/traffic. While it does not answer, each engine it
    reported keeps its last figures with the reason beside them."""

    def __init__(self, url: str, interval_s: float = 1.0, timeout_s: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.name = f"traffic {self.url}"
        self._last: dict[str, TrafficSample] = {}
        self._client: httpx.AsyncClient | None = None

    async def read(self) -> list[TrafficSample]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        t, wall = time.monotonic(), time.time()
        try:
            reply = await self._client.get(self.url + TRAFFIC_PATH)
            if reply.status_code != 200:
                raise ValueError(f"HTTP {reply.status_code}: {error_text(reply.content)}")
            samples = [TrafficSample(str(item["name"]), str(item["proxy_url"]), t, wall,
                                     _stats(item["stats"])) for item in reply.json()]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            why = f"the proxy at {self.url} did not answer: {exc or type(exc).__name__}"
            return [dataclasses.replace(s, t=t, wall=wall, error=why) for s in self._last.values()]
        self._last = {s.name: s for s in samples}
        return samples

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _stats(data: dict[str, object]) -> TrafficStats:
    """A later proxy's extra figures are ignored."""
    # JSON's values, typed only at run time: a bad one fails where TrafficStats is used, as a read error
    fields = {k: v for k, v in data.items() if k in _STATS_FIELDS}
    if isinstance(facts := fields.get("facts"), dict):
        fields["facts"] = TrafficFacts(**{k: v for k, v in facts.items() if k in _FACTS_FIELDS})
    if isinstance(lives := fields.get("per_request"), dict):
        fields["per_request"] = RequestStats(**{k: _tuples(v) for k, v in lives.items()
                                                 if k in _REQUEST_FIELDS})
    return TrafficStats(**fields)  # type: ignore[arg-type]


def _tuples(value: Any) -> Any:
    """JSON's arrays back into the tuples the samples hold (quantiles, (reason, count) pairs)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
