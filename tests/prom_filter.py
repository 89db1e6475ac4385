"""What prometheus_client's exposition answers to `?name[]=...`, for stand-ins of a vLLM (tests, bench/).

vLLM serves its registry under `/metrics/` through prometheus_client's ASGI app, which keeps only the samples
named by `name[]` (CollectorRegistry.restricted_registry). A stand-in replaying a captured body answers the
same way here: the capture is parsed into families, registered, and written by prometheus_client's own
restricted registry and encoder, the code a real vLLM runs.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector


class _Captured(Collector):
    def __init__(self, body: str) -> None:
        self.families = list(text_string_to_metric_families(body))

    def collect(self):
        return self.families

    def describe(self):  # the registry files a collector by the names these carry
        return self.families


def restricted(body: str, query: str) -> bytes:
    """`body` as a prometheus_client registry answers the query string `query` (without the `?`)."""
    names = parse_qs(query).get("name[]", [])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Captured(body))
    return generate_latest(registry.restricted_registry(names))
