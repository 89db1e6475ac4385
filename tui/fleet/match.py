"""Which GPUs an engine runs on: by Kubernetes pod where both sides name one, else by host.

dcgm-exporter in Kubernetes labels each GPU with the `namespace`/`pod` (and `container`) using it, and engines
found through Kubernetes service discovery carry their own `namespace`/`pod` (fleet.md §2, §4). There an
engine's instance is usually the pod's address, which never equals the node name dcgm-exporter reports, so
the host alone finds nothing, or, for a pod on the host's network, every GPU of the node, other pods' too.

The rule, per engine: if the engine has a pod and some GPU is labelled with that same (namespace, pod), its
GPUs are those; otherwise they are the GPUs whose host is the engine's host (the node part of its instance).
The Prometheus rule EngineThrottledGpuSlow (tui.fleet.alerts) joins the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from tui.sources.samples import EngineSample, GpuSample

Pod = tuple[str, str]  # namespace, pod


def engine_pod(engine: EngineSample) -> Pod | None:
    return pod_of_labels(engine.labels)


def pod_of_labels(labels: tuple[tuple[str, str], ...]) -> Pod | None:
    """(namespace, pod) from an EngineSample's labels, None when it has no pod."""
    named = dict(labels)
    return (named.get("namespace", ""), named["pod"]) if named.get("pod") else None


class GpuMatcher:
    """The GPUs of many engines against one GPU report, indexed once (the fleet matches every engine)."""

    def __init__(self, gpus: Iterable[GpuSample]) -> None:
        self.by_pod: dict[Pod, list[GpuSample]] = {}
        self.by_host: dict[str, list[GpuSample]] = {}
        for g in gpus:
            if g.pod:
                self.by_pod.setdefault((g.namespace or "", g.pod), []).append(g)
            if g.host is not None:
                self.by_host.setdefault(g.host, []).append(g)

    def of(self, host: str | None, pod: Pod | None) -> tuple[GpuSample, ...]:
        if pod is not None and pod in self.by_pod:
            return tuple(self.by_pod[pod])
        return tuple(self.by_host.get(host, ())) if host is not None else ()


def gpus_of(engine: EngineSample, gpus: Iterable[GpuSample]) -> tuple[GpuSample, ...]:
    """The GPUs `engine` (a fleet EngineSample) runs on, among `gpus` (e.g. a dcgm GpuReport's)."""
    return GpuMatcher(gpus).of(engine.host, engine_pod(engine))
