"""Which GPUs an engine runs on: by Kubernetes pod where both sides name one, else by host.

dcgm-exporter in Kubernetes labels each GPU with the `namespace`/`pod` (and `container`) using it, and engines
found through Kubernetes service discovery carry their own `namespace`/`pod` (fleet.md §2, §4). There an
engine's instance is usually the pod's address, which never equals the node name dcgm-exporter reports, so
the host alone finds nothing, or, for a pod on the host's network, every GPU of the node, other pods' too.

The rule, per engine: if the engine has a pod and some GPU is labelled with that same (namespace, pod), its
GPUs are those; else, if the engine's labels name its GPUs (a UUID label, or GPU indices on its host), those;
otherwise they are the GPUs whose host is the engine's host (the node part of its instance). Only the last
is a guess: those figures are the node's, shared by every engine on it, and `Share.own` says so.
The Prometheus rule EngineThrottledGpuSlow (tui.fleet.alerts) joins by pod, else node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tui.model.samples import EngineSample, GpuSample

Pod = tuple[str, str]  # namespace, pod
# Labels an engine's scrape target may carry that name its GPUs (relabelled from the device plugin or set by
# hand): dcgm-exporter's own UUID label, or GPU indices ("0" or "0,1").
UUID_LABELS = ("gpu_uuid", "UUID", "uuid")
INDEX_LABELS = ("gpu", "gpus", "gpu_index")


@dataclass(frozen=True, slots=True)
class Share:
    """An engine's GPUs. `own`: they are the engine's (matched by pod or by GPU labels); else they are every
    GPU of its node, which other engines there share: their power, utilisation and heat are the node's."""

    gpus: tuple[GpuSample, ...]
    own: bool


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
        self.by_uuid: dict[str, GpuSample] = {}
        for g in gpus:
            if g.pod:
                self.by_pod.setdefault((g.namespace or "", g.pod), []).append(g)
            if g.host is not None:
                self.by_host.setdefault(g.host, []).append(g)
            if g.uuid:
                self.by_uuid[g.uuid] = g

    def of(self, host: str | None, pod: Pod | None) -> tuple[GpuSample, ...]:
        if pod is not None and pod in self.by_pod:
            return tuple(self.by_pod[pod])
        return tuple(self.by_host.get(host, ())) if host is not None else ()

    def share(self, engine: EngineSample) -> Share:
        """The engine's GPUs, and whether they are its own (see the module's rule)."""
        pod = engine_pod(engine)
        if pod is not None and pod in self.by_pod:
            return Share(tuple(self.by_pod[pod]), own=True)
        labels = dict(engine.labels)
        uuids = [u.strip() for name in UUID_LABELS for u in labels.get(name, "").split(",") if u.strip()]
        named = tuple(self.by_uuid[u] for u in uuids if u in self.by_uuid)
        if named:
            return Share(named, own=True)
        node = tuple(self.by_host.get(engine.host, ())) if engine.host is not None else ()
        indices = {i.strip() for name in INDEX_LABELS for i in labels.get(name, "").split(",") if i.strip()}
        indexed = tuple(g for g in node if str(g.index) in indices)
        if indexed:
            return Share(indexed, own=True)
        return Share(node, own=False)


def gpus_of(engine: EngineSample, gpus: Iterable[GpuSample]) -> tuple[GpuSample, ...]:
    """The GPUs `engine` (a fleet EngineSample) runs on, among `gpus` (e.g. a dcgm GpuReport's)."""
    return GpuMatcher(gpus).of(engine.host, engine_pod(engine))
