"""An AMD GPU's energy counter from `amd-smi`, for the boards whose hwmon has no energy1_input (most amdgpu
boards): run by tui.sources.sysfs_gpu at most every AMD_SMI_EVERY_S, each card matched by its PCI address."""

from __future__ import annotations

import json
import logging
import subprocess
from typing import Any

log = logging.getLogger(__name__)


def amd_smi_energy(binary: str) -> dict[str, float | None]:
    """Each AMD GPU's energy counter in joules, by its PCI address as amd-smi reports it (lower case), or by
    "#N" (amd-smi's GPU id) where no address is known. `amd-smi metric --energy --json` gives each GPU's
    {"gpu": N, "energy": {"total_energy_consumption": ...}}; `amd-smi list --json` gives its {"gpu": N, "bdf":
    "0000:03:00.0"} (amdsmi_cli/amdsmi_commands.py). The JSON's shape differs between ROCm releases: any
    `total_energy_consumption` (or `energy_accumulator`) per GPU is taken, as {"value": V, "unit": U}, "V U"
    or a number of joules. **Not checked on a real card.**"""
    energy = _amd_smi_gpus(binary, "metric", "--energy", "--json")
    try:
        bdfs = {str(g.get("gpu")): str(g.get("bdf")).lower() for g in _amd_smi_gpus(binary, "list", "--json")
                if isinstance(g, dict) and g.get("bdf") not in (None, "N/A")}
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.info("amd-smi list gave no PCI addresses (%s): its GPUs are matched by their order", exc)
        bdfs = {}
    out: dict[str, float | None] = {}
    for position, g in enumerate(energy):
        gpu_id = str(g.get("gpu", position)) if isinstance(g, dict) else str(position)
        own = g.get("bdf") if isinstance(g, dict) else None
        bdf = str(own).lower() if own not in (None, "N/A") else bdfs.get(gpu_id)
        out[bdf if bdf else f"#{gpu_id}"] = _energy_of(g)
    return out


def _amd_smi_gpus(binary: str, *args: str) -> list[Any]:
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise OSError(proc.stderr.strip() or f"amd-smi exited {proc.returncode}")
    data = json.loads(proc.stdout)
    gpus = data if isinstance(data, list) else data.get("gpu_data") or data.get("gpus") or [data]
    return list(gpus)


def _energy_of(node: Any) -> float | None:
    if isinstance(node, dict):
        for key in ("total_energy_consumption", "energy_accumulator"):
            if key in node:
                return _joules(node[key])
        for value in node.values():
            found = _energy_of(value)
            if found is not None:
                return found
    return None


def _joules(value: Any) -> float | None:
    unit = "J"
    if isinstance(value, dict):
        value, unit = value.get("value"), str(value.get("unit") or "J")
    elif isinstance(value, str):
        parts = value.split()
        value, unit = parts[0], (parts[1] if len(parts) > 1 else "J")
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    scale = {"J": 1.0, "mJ": 1e-3, "uJ": 1e-6, "µJ": 1e-6, "kJ": 1e3}.get(unit, 1.0)
    return number * scale
