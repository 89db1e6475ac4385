"""Parameter sweep over one profile: the same argv with one option set to each value, compared like A/B.

`--param spec-draft-n-max=1,2,3` sets `--spec-draft-n-max` to 1, 2, 3 (replacing the value already in
the argv, or appending the option when it is absent). The value `off` removes the option and its value,
for a "feature off" baseline. Each value becomes an arm named `<option>=<value>`; the seeds found the
model card's default (n=6) to be the worst setting, which is why this exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tui.lifecycle.profiles import Profile

OFF = "off"


@dataclasses.dataclass(frozen=True, slots=True)
class ParamSpec:
    option: str  # with its dashes: "--threads"
    values: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.option.lstrip("-")


def parse_param_spec(text: str) -> ParamSpec:
    """'spec-draft-n-max=1,2,3' or '--threads=1,2' -> ParamSpec."""
    name, sep, values = text.partition("=")
    name = name.strip()
    items = tuple(v.strip() for v in values.split(",") if v.strip())
    if not sep or not name.lstrip("-") or not items:
        raise ValueError(f"--param {text!r}: expected OPTION=V1,V2,... (e.g. spec-draft-n-max=1,2,3)")
    if len(set(items)) != len(items):
        raise ValueError(f"--param {text!r}: a value is listed twice")
    option = name if name.startswith("-") else ("-" if len(name) == 1 else "--") + name
    return ParamSpec(option, items)


def set_option(argv: tuple[str, ...] | list[str], option: str, value: str) -> list[str]:
    """argv with `option value` set: replaces `option X` / `option=X`, appends when absent; OFF removes it."""
    out: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == option:
            found = True
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            if value != OFF:
                out += [option, value]
            i += 2 if has_value else 1
            continue
        if arg.startswith(option + "="):
            found = True
            if value != OFF:
                out.append(f"{option}={value}")
            i += 1
            continue
        out.append(arg)
        i += 1
    if not found and value != OFF:
        out += [option, value]
    return out


def sweep_profiles(profile: Profile, spec: ParamSpec) -> list[tuple[str, Profile]]:
    """One derived profile per value, named `<profile>:<option>=<value>`."""
    if profile.argv is None:
        raise ValueError(f"profile {profile.name} attaches to a running server: there is no argv to sweep")
    out = []
    for value in spec.values:
        arm = f"{spec.name}={value}"
        derived = dataclasses.replace(
            profile, name=f"{profile.name}:{arm}", argv=tuple(set_option(profile.argv, spec.option, value))
        )
        out.append((arm, derived))
    return out


def sweep_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The seeds' table: value, decode tok/s, reproduction, GPU utilisation, power, memory bandwidth %."""
    rows = []
    analysis = result["analysis"]["arms"]
    for arm in result["arms"]:
        a = analysis[arm["name"]]
        decode = a["decode_tps"]
        rows.append(
            {
                "arm": arm["name"],
                "value": (arm.get("param") or {}).get("value"),
                "decode_tps": decode["median"],
                "decode_min": decode["min"],
                "decode_max": decode["max"],
                "instances": a["instances"],
                "instance_cv_pct": a["instance_cv_pct"],
                "verdict": a["verdict"],
                "ttft_s": a["ttft_s"]["median"],
                "gpu_util_pct": a["gpu_util_pct"],
                "power_w": a["power_w"],
                "mem_bw_pct": a["mem_bw_pct"],
            }
        )
    return rows


def best_value(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Fastest reproducible value; None when no value was reproducible (then nothing should be chosen)."""
    good = [r for r in rows if r["verdict"] == "reproducible" and r["decode_tps"] is not None]
    return max(good, key=lambda r: r["decode_tps"]) if good else None
