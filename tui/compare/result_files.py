"""A comparison's result as files: RESULT.json (schema enginetop.compare/1) and the CSV tables beside it,
written and read back. The HTML rendering of a result is tui.compare.report."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != "enginetop.compare/1":
        raise ValueError(f"{path} is not an enginetop ab/sweep-param result (no schema enginetop.compare/1)")
    return data


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in row.items()})
    return path


def write_result(result: dict[str, Any], json_path: Path) -> list[Path]:
    """RESULT.json and, beside it, RESULT.arms.csv, RESULT.blocks.csv, RESULT.requests.csv (+ concurrency)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    stem = json_path.with_suffix("")
    written = [json_path]
    arms = []
    for arm in result["arms"]:
        a = result["analysis"]["arms"][arm["name"]]
        row = {
            "arm": arm["name"],
            "param_value": (arm.get("param") or {}).get("value"),
            "verdict": a["verdict"],
            "instances": a["instances"],
            "instance_cv_pct": a["instance_cv_pct"],
            "blocks_used": a["blocks_used"],
            "blocks_throttled": a["blocks_throttled"],
            "gpu_util_pct": a["gpu_util_pct"],
            "power_w": a["power_w"],
            "mem_bw_pct": a["mem_bw_pct"],
            "temp_c_max": a["temp_c_max"],
            "host_cpu_pct": a.get("host_cpu_pct"),
            "joules_per_token_median": (a.get("joules_per_token") or {}).get("median"),
            "energy_scope": a.get("energy_scope"),
            "energy_source": a.get("energy_source"),
            "argv": arm.get("argv"),
        }
        for metric in ("decode_tps", "server_decode_tps", "ttft_s", "prefill_tps"):
            for stat in ("median", "cv_pct", "min", "max"):
                row[f"{metric}_{stat}"] = a[metric][stat]
        arms.append(row)
    written.append(_write_csv(stem.with_name(stem.name + ".arms.csv"), arms))
    blocks = [
        {k: v for k, v in b.items() if k not in ("requests", "gpu")}
        | {f"gpu_{k}": v for k, v in (b.get("gpu") or {}).items()}
        for b in result["blocks"]
    ]
    written.append(_write_csv(stem.with_name(stem.name + ".blocks.csv"), blocks))
    requests = [
        {"arm": b["arm"], "instance": b["instance"], "block": b["block"], "seq": b["seq"]}
        | {k: v for k, v in r.items() if k != "server_timings"}
        for b in result["blocks"]
        for r in b["requests"]
    ]
    written.append(_write_csv(stem.with_name(stem.name + ".requests.csv"), requests))
    if result.get("concurrency"):
        written.append(_write_csv(stem.with_name(stem.name + ".concurrency.csv"), result["concurrency"]))
    return written
