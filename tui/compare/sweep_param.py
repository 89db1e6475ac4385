"""Parameter sweep over one profile: the same argv with one option set to each value, compared like A/B.

`--param spec-draft-n-max=1,2,3` sets `--spec-draft-n-max` to 1, 2, 3 (replacing the value already in the
argv, or appending the option when it is absent). The value `off` removes the option and its value, for a
"feature off" baseline; for a speculative option (`--spec-*`, `-md`) it removes every speculative option, so
the baseline is the engine with speculation off. Each value becomes an arm named `<option>=<value>`; the seeds
found the model card's default (n=6) to be the worst setting, which is why this exists.
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


# llama-server's speculative options: "off" for any of them turns speculation off, so the sweep's baseline is
# the engine without a draft at all (removing only --spec-draft-n-max would leave its default depth of 3)
SPEC_PREFIXES = ("--spec-", "--draft")
SPEC_FLAGS = ("-md", "--model-draft", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "-devd",
              "--device-draft")


def is_spec_option(option: str) -> bool:
    return option.startswith(SPEC_PREFIXES) or option in SPEC_FLAGS


def without_spec(argv: tuple[str, ...] | list[str]) -> list[str]:
    """argv with every speculative option (and its value) removed: speculation off."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if is_spec_option(name):
            takes = "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("-")
            i += 2 if takes else 1
            continue
        out.append(arg)
        i += 1
    return out


def sweep_profiles(profile: Profile, spec: ParamSpec) -> list[tuple[str, Profile]]:
    """One derived profile per value, named `<profile>:<option>=<value>`."""
    if profile.argv is None:
        raise ValueError(f"profile {profile.name} attaches to a running server: there is no argv to sweep")
    out = []
    for value in spec.values:
        arm = f"{spec.name}={value}"
        if value == OFF and is_spec_option(spec.option):
            argv = without_spec(profile.argv)
        else:
            argv = set_option(profile.argv, spec.option, value)
        derived = dataclasses.replace(profile, name=f"{profile.name}:{arm}", argv=tuple(argv))
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
                # joules per generated token (median over blocks) and whose: beside tok/s, per value
                "joules_per_token": (a.get("joules_per_token") or {}).get("median"),
                "energy_scope": a.get("energy_scope"),
                "spec": a.get("spec"),  # acceptance, mean length, per position (None: it did not draft)
            }
        )
    return rows


def best_value(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Fastest reproducible value; None when no value was reproducible (then nothing should be chosen)."""
    good = [r for r in rows if r["verdict"] == "reproducible" and r["decode_tps"] is not None]
    return max(good, key=lambda r: r["decode_tps"]) if good else None


def margins(rows: list[dict[str, Any]], best: dict[str, Any]) -> dict[str, Any]:
    """How far the best value is ahead: of the next fastest value, and of speculation off (the arm that did
    not draft, where the others did), as ratios of decode tok/s."""
    others = [r for r in rows if r is not best and r["decode_tps"] is not None]
    runner_up = max(others, key=lambda r: r["decode_tps"]) if others else None
    off = next((r for r in others if r.get("spec") is None), None) if best.get("spec") is not None else None
    return {"next": runner_up["value"] if runner_up else None,
            "over_next": best["decode_tps"] / runner_up["decode_tps"] if runner_up and runner_up["decode_tps"]
            else None,
            "off": off["value"] if off else None,
            "over_off": best["decode_tps"] / off["decode_tps"] if off and off["decode_tps"] else None}
