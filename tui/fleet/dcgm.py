"""Remote GPUs from NVIDIA dcgm-exporter series: through Prometheus (one query for every field of every GPU)
or straight from an exporter's /metrics (`--dcgm URL`, no Prometheus needed). Both make one GpuReport of
GpuSamples with `host` set, which the store and the GPU panel take like the local NVML ones.

Label and field facts (../shared/reference/fleet.md §4): the node is `Hostname` in most deployed versions
and `hostname` since a late-2026 rename (both read, and the scrape's instance when neither is there);
field 112 is `DCGM_FI_DEV_CLOCKS_EVENT_REASONS`, formerly `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`, with NVML's
bit meanings, decoded into the same words as the local panel (tui.sources.gpu.throttle_words). A field the
GPU does not support is a huge "blank" sentinel (about 9.22e18 for integers, 2^47 for doubles): n/a.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tui.fleet.prometheus import Labels, PromError, PrometheusClient
from tui.fleet.source import host_of
from tui.model.samples import REAL_THROTTLE_MASK, GpuReport, GpuSample
from tui.net.policy import proxy_for, public_url, split_credentials
from tui.sources.gpu import throttle_words

MIB = 1 << 20
FIELDS = {  # dcgm-exporter series -> what it becomes
    "DCGM_FI_DEV_GPU_UTIL": "util_gpu_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "util_mem_pct",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",  # ratio 0..1, profiling field (data-centre GPUs)
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",  # counter, mJ since the driver loaded (field 156)
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "mask",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "mask_old",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
}
SELECTOR = '{__name__=~"' + "|".join(FIELDS) + '"}'


def is_blank(value: float) -> bool:
    """dcgm's "no value" sentinels: DCGM_INT64_BLANK and neighbours (~9.22e18), DCGM_FP64_BLANK (2^47)."""
    return value >= 9.2e18 or 140737488355328.0 <= value < 140737488355328.0 + 16


def _clean(value: float | None) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value) or is_blank(value):
        return None
    return value


def gpu_key(labels: Labels) -> tuple[str, str, str]:
    host = labels.get("Hostname") or labels.get("hostname") or host_of(labels.get("instance", ""))
    return host, labels.get("gpu", ""), labels.get("UUID", "")


def build_report(series: Iterable[tuple[str, Labels, float | None]], t: float | None = None) -> GpuReport:
    """(metric name, labels, value) of dcgm-exporter series -> one GpuSample per (host, gpu, UUID)."""
    t = time.monotonic() if t is None else t
    per_gpu: dict[tuple[str, str, str], dict] = {}
    for name, labels, raw in series:
        field = FIELDS.get(name)
        if field is None:
            continue
        key = gpu_key(labels)
        values = per_gpu.setdefault(key, {"_labels": labels})
        values[field] = _clean(raw)
    gpus = [_sample(key, values, t) for key, values in per_gpu.items()]
    gpus.sort(key=lambda g: (g.host or "", g.index))
    return GpuReport(t=t, gpus=tuple(gpus), driver_version=None,
                     unavailable=None if gpus else "no dcgm-exporter series found")


def _sample(key: tuple[str, str, str], v: dict, t: float) -> GpuSample:
    labels = v["_labels"]
    host, gpu, uuid = key
    mask_value = v.get("mask") if v.get("mask") is not None else v.get("mask_old")
    mask = int(mask_value) if mask_value is not None else None
    used, free, reserved = v.get("fb_used"), v.get("fb_free"), v.get("fb_reserved")
    total = used + free + (reserved or 0.0) if used is not None and free is not None else None
    dram = v.get("dram_active")
    xid = v.get("xid")
    return GpuSample(
        index=int(gpu) if gpu.isdigit() else 0, t=t, name=labels.get("modelName"), uuid=uuid or None,
        util_gpu_pct=v.get("util_gpu_pct"), util_mem_pct=v.get("util_mem_pct"),
        mem_bw_pct=dram * 100 if dram is not None else None,
        mem_bw_source="dcgm DRAM_ACTIVE" if dram is not None else None,
        power_w=v.get("power_w"), power_limit_w=v.get("power_limit_w"), temp_c=v.get("temp_c"),
        sm_clock_mhz=v.get("sm_clock_mhz"), mem_clock_mhz=v.get("mem_clock_mhz"),
        vram_used_bytes=int(used * MIB) if used is not None else None,
        vram_total_bytes=int(total * MIB) if total is not None else None,
        clock_event_mask=mask, throttle_reasons=throttle_words(mask) if mask is not None else (),
        throttled=bool(mask is not None and mask & REAL_THROTTLE_MASK),
        host=host or None, xid_error=int(xid) if xid is not None else None, vendor="NVIDIA", driver="dcgm",
        energy_j=energy / 1000 if (energy := v.get("energy_mj")) is not None else None,
        **pod_of(labels))  # type: ignore[arg-type]  # pod_of gives only namespace and pod, both str | None


def pod_of(labels: Labels) -> dict[str, str | None]:
    """The pod using the GPU, as dcgm-exporter labels it in Kubernetes. Scraped without honor_labels, the
    scrape's own target labels (dcgm-exporter's pod) take `pod`/`namespace` and the exporter's move to
    `exported_pod`/`exported_namespace`: those then are the pod using the GPU."""
    if labels.get("exported_pod"):
        pod, namespace = labels.get("exported_pod"), labels.get("exported_namespace")
    else:
        pod, namespace = labels.get("pod"), labels.get("namespace")
    return {"namespace": namespace or None, "pod": pod or None}


def parse_exposition(text: str, instance: str = "") -> list[tuple[str, Labels, float | None]]:
    """A dcgm-exporter /metrics body -> (name, labels, value); `instance` stands in for a missing host."""
    out: list[tuple[str, Labels, float | None]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in FIELDS:
                labels = dict(s.labels)
                labels.setdefault("instance", instance)
                out.append((s.name, labels, float(s.value)))
    return out


class _Stale:
    """Keeps the last good report; a failure returns it with every GPU marked stale and the reason."""

    last: GpuReport | None = None
    error: str | None = None

    def _failed(self, why: str) -> GpuReport:
        self.error = why
        now = time.monotonic()
        if self.last is None or not self.last.gpus:
            return GpuReport(t=now, unavailable=why)
        gpus = tuple(dataclasses.replace(g, t=now, stale=True) for g in self.last.gpus)
        return GpuReport(t=now, gpus=gpus, error=why)

    def _ok(self, report: GpuReport) -> GpuReport:
        self.error = None
        self.last = report
        return report


class DcgmPrometheusSource(_Stale):
    """Every GPU whose dcgm-exporter Prometheus scrapes: one instant query for all fields of all GPUs."""

    name = "dcgm via prometheus"

    def __init__(self, client: PrometheusClient, match: str | None = None, interval_s: float = 5.0) -> None:
        self.client, self.interval_s = client, interval_s
        inner = SELECTOR[1:-1] + (f", {match.strip().strip('{}')}" if match and match.strip("{} ") else "")
        self.expr = "{" + inner + "}"

    async def read(self) -> list[GpuReport]:
        try:
            result = await self.client.query(self.expr)
        except PromError as exc:
            return [self._failed(exc.message)]
        return [self._ok(build_report((labels.get("__name__", ""), labels, v) for labels, v in result))]


class DcgmDirectSource(_Stale):
    """dcgm-exporters read straight from their /metrics (`--dcgm URL`, repeatable)."""

    name = "dcgm"

    def __init__(self, urls: list[str], interval_s: float = 5.0, timeout: float = 3.0) -> None:
        self.urls = [split_credentials(u)[0] for u in urls]
        self.interval_s, self.timeout = interval_s, timeout
        # which nodes each exporter reported, so they stay listed (stale) when it fails
        self._hosts: dict[str, set[str]] = {}
        self._clients = {proxy_for(u): httpx.AsyncClient(timeout=timeout, trust_env=False, proxy=proxy_for(u))
                         for u in self.urls}

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def _one(self, url: str) -> list[tuple[str, Labels, float | None]]:
        shown = public_url(url)
        try:
            r = await self._clients[proxy_for(url)].get(url)
        except httpx.TimeoutException:
            why = f"dcgm-exporter at {shown} did not answer within {self.timeout:g}s"
            raise PromError("timeout", why) from None
        except httpx.HTTPError:
            why = f"dcgm-exporter at {shown} refused the connection: is it running?"
            raise PromError("down", why) from None
        if r.status_code != 200:
            raise PromError("http", f"dcgm-exporter at {shown} answered HTTP {r.status_code}")
        try:
            return parse_exposition(r.text, httpx.URL(url).host)
        except ValueError as exc:
            raise PromError("format", f"dcgm-exporter at {shown}: not Prometheus text ({exc})") from None

    async def read(self) -> list[GpuReport]:
        answers = await asyncio.gather(*(self._one(u) for u in self.urls), return_exceptions=True)
        series, errors, failed = [], [], []
        for url, answer in zip(self.urls, answers, strict=True):
            if isinstance(answer, PromError):
                errors.append(answer.message)
                failed.append(url)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                series.extend(answer)
                self._hosts[url] = {gpu_key(labels)[0] for _, labels, _ in answer}
        if errors and not series:
            return [self._failed("; ".join(errors))]
        report = build_report(series)
        if failed and self.last is not None:  # the nodes that did not answer keep their last values, stale
            gone = set().union(*(self._hosts.get(u, set()) for u in failed))
            kept = tuple(dataclasses.replace(g, t=report.t, stale=True)
                         for g in self.last.gpus if g.host in gone)
            report = dataclasses.replace(report, gpus=report.gpus + kept)
        self.last = report
        self.error = "; ".join(errors) or None
        return [dataclasses.replace(report, error=self.error)]
