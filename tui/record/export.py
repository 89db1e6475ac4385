"""A recording as OpenMetrics text (for `promtool tsdb create-blocks-from openmetrics`) or as CSV.

Engine readings go out under the engine's own metric names (llamacpp:tokens_predicted_total,
vllm:time_to_first_token_seconds_bucket, ...), labelled job/instance/engine like a Prometheus scrape of the
engine would be, so a recording sits beside a fleet's own data in Grafana. GPU, host and probe figures go
out as enginetop_* gauges. Timestamps are the samples' wall-clock times.
"""

from __future__ import annotations

import csv
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from tui.model.events import ProbeEvent
from tui.model.samples import EngineSample, GpuReport, HostSample
from tui.probe.results import ProbeResult
from tui.record.reader import Recording
from tui.sources.metrics import metric_names

Point = tuple[str, str, dict[str, str], float, float]  # family, type, labels, value, unix time

GPU_GAUGES = {
    "util_gpu_pct": "enginetop_gpu_utilization_percent",
    "util_mem_pct": "enginetop_gpu_memory_utilization_percent",
    "mem_bw_gbps": "enginetop_gpu_memory_bandwidth_gbps", "power_w": "enginetop_gpu_power_watts",
    "power_limit_w": "enginetop_gpu_power_limit_watts", "temp_c": "enginetop_gpu_temperature_celsius",
    "sm_clock_mhz": "enginetop_gpu_sm_clock_mhz", "mem_clock_mhz": "enginetop_gpu_memory_clock_mhz",
    "vram_used_bytes": "enginetop_gpu_vram_used_bytes", "vram_total_bytes": "enginetop_gpu_vram_total_bytes",
    "clock_event_mask": "enginetop_gpu_clock_event_reasons",
}
HOST_GAUGES = {
    "cpu_pct": "enginetop_host_cpu_percent", "ram_used_bytes": "enginetop_host_ram_used_bytes",
    "ram_total_bytes": "enginetop_host_ram_total_bytes", "swap_used_bytes": "enginetop_host_swap_used_bytes",
}
PROBE_GAUGES = {
    "ttft_s": "enginetop_probe_ttft_seconds", "server_ttft_s": "enginetop_probe_server_ttft_seconds",
    "decode_tps": "enginetop_probe_decode_tokens_per_second",
    "prefill_tps": "enginetop_probe_prefill_tokens_per_second", "e2e_s": "enginetop_probe_e2e_seconds",
    "completion_tokens": "enginetop_probe_completion_tokens",
}


def points(rec: Recording, job: str = "enginetop") -> Iterator[Point]:
    for row in rec.rows():
        item = row.item
        if isinstance(item, EngineSample):
            yield from _engine(item, row.wall, job)
        elif isinstance(item, GpuReport):
            for gpu in item.gpus:
                labels = {"job": job, "instance": gpu.host or rec.meta.get("host", ""), "gpu": str(gpu.index),
                          **({"name": gpu.name} if gpu.name else {})}
                for field, family in GPU_GAUGES.items():
                    value = getattr(gpu, field)
                    if value is not None:
                        yield family, "gauge", labels, float(value), row.wall
                yield "enginetop_gpu_throttled", "gauge", labels, float(gpu.throttled), row.wall
                if gpu.energy_j is not None:  # the GPU's own counter (NVML since the driver loaded, hwmon)
                    yield "enginetop_gpu_energy_joules", "counter", labels, gpu.energy_j, row.wall
        elif isinstance(item, HostSample):
            labels = {"job": job, "instance": rec.meta.get("host", "")}
            for field, family in HOST_GAUGES.items():
                value = getattr(item, field)
                if value is not None:
                    yield family, "gauge", labels, float(value), row.wall
            for tree in item.engines:
                yield ("enginetop_engine_rss_bytes", "gauge", {**labels, "engine": tree.engine},
                       float(tree.rss_bytes), row.wall)
            if item.cpu_energy_j is not None:  # RAPL, every package, wraps undone since enginetop read it
                yield "enginetop_host_cpu_energy_joules", "counter", labels, item.cpu_energy_j, row.wall
        elif isinstance(item, ProbeEvent):
            yield from _probe(item.result, item.engine, row.wall, job)


def _engine(sample: EngineSample, wall: float, job: str) -> Iterator[Point]:
    labels = {"job": job, "instance": urlsplit(sample.url).netloc or sample.name, "engine": sample.name}
    yield "enginetop_engine_up", "gauge", labels, float(sample.health == "up"), wall
    reading = sample.reading
    if reading is None:
        return
    for field, (family, label) in metric_names(reading.dialect).items():
        value = getattr(reading, field)
        if value is None:
            continue
        these = {**labels, label[0]: label[1]} if label and label[1] else labels
        if field.endswith("_buckets"):
            for bound, count in value:
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                yield family, "histogram", {**these, "le": le}, count, wall
            yield family, "histogram", {**these, "_": "count"}, value[-1][1], wall
            total = getattr(reading, field.replace("_buckets", "_sum"), None)
            if total is not None:
                yield family, "histogram", {**these, "_": "sum"}, total, wall
        elif field == "finish_reasons" and label:
            for reason, count in value:
                yield family, "counter", {**these, label[0]: reason}, count, wall
        elif field.endswith("_sum") or field.startswith("iteration_"):
            continue  # a histogram's sum goes with its buckets above; tokens per step stay in the recording
        else:
            yield family, "counter" if field.endswith("_total") else "gauge", these, float(value), wall


def _probe(result: ProbeResult, engine: str, wall: float, job: str) -> Iterator[Point]:
    labels = {"job": job, "instance": urlsplit(result.url).netloc or engine, "engine": engine,
              "workload": result.workload}
    yield "enginetop_probe_ok", "gauge", labels, float(result.ok), wall
    for field, family in PROBE_GAUGES.items():
        value = getattr(result, field)
        if value is not None:
            yield family, "gauge", labels, float(value), wall


def _sample_name(family: str, kind: str, labels: dict[str, str]) -> tuple[str, dict[str, str]]:
    if kind == "counter":
        return family + "_total", labels
    if kind == "histogram":
        if labels.get("_") in ("count", "sum"):
            return f"{family}_{labels['_']}", {k: v for k, v in labels.items() if k != "_"}
        return family + "_bucket", labels
    return family, labels


def _labels(labels: dict[str, str]) -> str:
    esc = (lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))  # noqa: E731
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def write_openmetrics(rec: Recording, out: IO[str], job: str = "enginetop") -> int:
    """Every family's samples together (OpenMetrics wants a family in one place), each series in time
    order (a sample not after the last of its series, e.g. after a wall-clock step, is left out)."""
    lines = 0
    kinds: dict[str, str] = {}
    last: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="enginetop-export-") as tmp:
        files: dict[str, IO[str]] = {}
        for family, kind, labels, value, wall in points(rec, job):
            name, labels = _sample_name(family, kind, labels)
            series = _labels(labels)
            ts = round(wall, 3)
            if last.get((name, series), -math.inf) >= ts:
                continue
            last[(name, series)] = ts
            f = files.get(family)
            if f is None:
                kinds[family] = kind
                f = files[family] = open(Path(tmp) / f"{len(files)}.om", "w+", encoding="utf-8")  # noqa: SIM115
            f.write(f"{name}{series} {value!r} {ts:.3f}\n")
            lines += 1
        for family, f in files.items():
            out.write(f"# TYPE {family} {kinds[family]}\n")
            f.seek(0)
            while chunk := f.read(1 << 20):
                out.write(chunk)
            f.close()
    out.write("# EOF\n")
    return lines


def write_csv(rec: Recording, out: IO[str], job: str = "enginetop") -> int:
    """One line per value: unix time, metric (the OpenMetrics sample name), labels (k=v;...), value."""
    writer = csv.writer(out)
    writer.writerow(["time", "metric", "labels", "value"])
    lines = 0
    for family, kind, labels, value, wall in points(rec, job):
        name, labels = _sample_name(family, kind, labels)
        writer.writerow([f"{wall:.3f}", name, ";".join(f"{k}={v}" for k, v in labels.items()), repr(value)])
        lines += 1
    return lines
