"""The analysis of a comparison's result: per arm, per pair of arms, and what each arm's figures reveal.

Pure: it works on the stored result (the JSON tui.compare.ab.run_comparison writes), never on a run, so a
report is re-rendered and a result re-analysed from its file alone, years later, by another enginetop.

- Per arm: median, CV% and range over blocks; the median of each instance (round); CV% across those
  medians decides the verdict (stats.verdict). Blocks run while the GPU throttled are left out when the
  run asked so (--exclude-throttled).
- Ratios of medians against the first arm get a hierarchical bootstrap 95% interval (instances, then
  blocks), and a verdict that says whether the interval excludes 1 and whether both arms reproduced.
- Speculative decoding over an arm's blocks, and the findings its configuration and those figures hold.
- Words every reader of a result shares (report, command line, A/B screen): an arm's verdict, and what one
  repetition of it is (a fresh instance; a round in time for an attached arm).
"""

from __future__ import annotations

from typing import Any

from tui.compare.stats import bootstrap_ratio_ci, cv_pct, median, summarize, verdict
from tui.findings.judge import judge
from tui.model.findings import Evidence, SpecFacts, accepted_shares
from tui.sources.config import config_from_json

# The figures each block keeps (the median over its successful requests) and the analysis summarises.
METRICS = ("decode_tps", "ttft_s", "prefill_tps", "server_decode_tps")


def _blocks_used(result: dict[str, Any], arm: str) -> tuple[list[dict[str, Any]], int]:
    exclude = bool(result["config"].get("exclude_throttled"))
    metric = primary_metric(result)
    mine = [b for b in result["blocks"] if b["arm"] == arm and b.get(metric) is not None]
    used = [b for b in mine if not (exclude and b.get("throttled"))]
    return used, len(mine) - len(used)


def primary_metric(result: dict[str, Any]) -> str:
    """What the verdict is about: decode speed, except for long-prefill (1 token out: prefill speed)."""
    return "prefill_tps" if result["config"].get("workload") == "long-prefill" else "decode_tps"


def primary_metric_name(cmp: dict[str, Any]) -> str:
    return cmp.get("verdict_metric", "decode_tps")


def _groups(blocks: list[dict[str, Any]], metric: str) -> list[list[float]]:
    by_instance: dict[int, list[float]] = {}
    for b in blocks:
        if b.get(metric) is not None:
            by_instance.setdefault(b["instance"], []).append(float(b[metric]))
    return [by_instance[k] for k in sorted(by_instance)]


def _mean_of(blocks: list[dict[str, Any]], key: str) -> float | None:
    values = [b["gpu"][key] for b in blocks if b.get("gpu") and b["gpu"].get(key) is not None]
    return sum(values) / len(values) if values else None


def _mean_block(blocks: list[dict[str, Any]], key: str) -> float | None:
    values = [b[key] for b in blocks if b.get(key) is not None]
    return sum(values) / len(values) if values else None


def analyze_arm(result: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any]:
    threshold = float(result["config"]["cv_threshold_pct"])
    used, excluded = _blocks_used(result, arm["name"])
    all_blocks = [b for b in result["blocks"] if b["arm"] == arm["name"]]
    groups = _groups(used, primary_metric(result))
    instance_medians = [median(g) for g in groups]
    instance_values = [v for v in instance_medians if v is not None]
    temps = [b["gpu"]["temp_c_max"] for b in used if b.get("gpu") and b["gpu"].get("temp_c_max") is not None]
    return {
        "name": arm["name"],
        "blocks_total": len(all_blocks),
        "blocks_used": len(used),
        "blocks_excluded_throttled": excluded,
        "blocks_throttled": sum(1 for b in all_blocks if b.get("throttled")),
        "blocks_without_data": sum(1 for b in all_blocks if b.get(primary_metric(result)) is None),
        "verdict_metric": primary_metric(result),
        "instances": len(groups),
        "instance_unit": "rounds" if arm.get("attached") else "instances",  # attached: never restarted
        "instance_decode_tps": instance_values,
        "instance_cv_pct": cv_pct(instance_values),
        "verdict": verdict(instance_values, threshold),
        **{metric: summarize([b.get(metric) for b in used]).as_dict() for metric in METRICS},
        "token_source": _merge_sources(b.get("token_source") for b in used),
        "gpu_util_pct": _mean_of(used, "util_gpu_pct_mean"),
        "power_w": _mean_of(used, "power_w_mean"),
        "mem_bw_pct": _mean_of(used, "mem_bw_pct_mean"),
        "temp_c_max": max(temps) if temps else None,
        "host_cpu_pct": _mean_block(used, "host_cpu_pct"),
        "spec": _spec_of(result, arm["name"], all_blocks),
        # joules per generated token per block (tui.sources.energy.run_energy), over the blocks used
        "joules_per_token": summarize([b.get("joules_per_token") for b in used]).as_dict(),
        "energy_scope": _merge_sources(b.get("energy_scope") for b in used),
        "energy_source": _merge_sources(b.get("energy_source") for b in used),
        "energy_note": next((b["energy_note"] for b in used if b.get("energy_note")), None),
    }


def _spec_of(result: dict[str, Any], arm: str, blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Speculative decoding over the arm's blocks: from the engine's counters taken around each instance's
    blocks (acceptance per position, drafts), else from each request's own timings (llama.cpp draft_n and
    draft_n_accepted). None for an arm that did not draft."""
    spans = [i["spec"] for i in result["instances"] if i["arm"] == arm and i.get("spec")]
    timed = [r["server_timings"] for b in blocks for r in b["requests"]
             if (r.get("server_timings") or {}).get("draft_n") is not None]
    drafted = sum(t["draft_n"] for t in timed)
    accepted_timed = sum(t.get("draft_n_accepted") or 0 for t in timed)
    if spans and sum(x["drafts"] for x in spans) > 0:
        drafts = sum(x["drafts"] for x in spans)
        tokens = sum(x["draft_tokens"] for x in spans)
        accepted = sum(x["accepted"] for x in spans)
        depth = max(len(x["per_position"]) for x in spans)
        # the spans' accepted tokens per position (a span's SpecFacts), summed
        per_pos = [sum(x["per_position"][k] for x in spans if k < len(x["per_position"]))
                   for k in range(depth)]
        return {"source": "engine counters", "drafts": drafts, "draft_tokens": tokens, "accepted": accepted,
                "acceptance_rate": accepted / tokens if tokens else None,
                "mean_accepted_length": 1 + accepted / drafts,
                "per_position": list(accepted_shares(per_pos, drafts) or ()),
                "accepted_per_position": per_pos}
    if drafted:
        return {"source": "request timings", "drafts": None, "draft_tokens": drafted,
                "accepted": accepted_timed, "acceptance_rate": accepted_timed / drafted,
                "mean_accepted_length": None, "per_position": []}
    return None


def arm_findings(name: str, config: dict[str, Any] | None,
                 spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What an arm's configuration and its speculative figures (the engine's counters) reveal."""
    facts = None
    if spec is not None and spec.get("drafts"):
        # the accepted tokens themselves; a result written before they were kept has only their shares
        accepted = spec.get("accepted_per_position")
        if accepted is None:
            accepted = [p * spec["drafts"] for p in spec.get("per_position") or ()]
        facts = SpecFacts(spec["drafts"], spec["draft_tokens"], spec["accepted"], tuple(accepted))
    return [f.json() for f in judge(Evidence(name, config_from_json(config), spec=facts))]


def verdict_words(arm: dict[str, Any]) -> str:
    """An arm's verdict in words: "single round" for an attached arm that ran one round."""
    if arm["verdict"] == "single instance" and arm.get("instance_unit") == "rounds":
        return "single round"
    return arm["verdict"]


def unit_of(result: dict[str, Any], arm: str) -> str:
    """An attached arm repeats in rounds of time (nothing restarted); any other in fresh instances."""
    attached = next((a.get("attached") for a in result["arms"] if a["name"] == arm), False)
    return "round" if attached else "instance"


def units_of(result: dict[str, Any], plural: str = "") -> str:
    """The unit for headings over every arm: 'instance', 'round', or 'instance / round' when mixed."""
    return " / ".join(u + plural for u in sorted({unit_of(result, a["name"]) for a in result["arms"]}))


def _merge_sources(sources: Any) -> str | None:
    found = {s for s in sources if s}
    if not found:
        return None
    return found.pop() if len(found) == 1 else "mixed"


def compare_arms(result: dict[str, Any], base: str, other: str) -> dict[str, Any]:
    """Ratio other/base of medians per metric, with the bootstrap interval and what it allows to say."""
    base_used, _ = _blocks_used(result, base)
    other_used, _ = _blocks_used(result, other)
    cfg = result["config"]
    out: dict[str, Any] = {"base": base, "other": other, "verdict_metric": primary_metric(result)}
    for metric in ("decode_tps", "ttft_s", "prefill_tps"):
        num, den = _groups(other_used, metric), _groups(base_used, metric)
        num_med = median([v for g in num for v in g])
        den_med = median([v for g in den for v in g])
        entry: dict[str, Any] = {"ratio": None, "ci_low": None, "ci_high": None}
        if num and den and num_med is not None and den_med:
            entry["ratio"] = num_med / den_med
            try:
                lo, hi = bootstrap_ratio_ci(
                    num, den, n_boot=int(cfg.get("bootstrap_samples", 5000)), seed=int(cfg.get("seed", 0))
                )
                entry["ci_low"], entry["ci_high"] = lo, hi
            except ValueError as exc:
                entry["error"] = str(exc)
        out[metric] = entry
    return out


def comparison_verdict(cmp: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    decode = cmp[primary_metric_name(cmp)]
    if decode["ratio"] is None:
        return "no data"
    bad = [n for n in (cmp["base"], cmp["other"]) if arms[n]["verdict"] != "reproducible"]
    lo, hi = decode["ci_low"], decode["ci_high"]
    if lo is not None and hi is not None and (lo > 1 or hi < 1):
        words = f"{cmp['other']} {'faster' if lo > 1 else 'slower'} than {cmp['base']} (interval excludes 1)"
    else:
        what = "decode" if primary_metric_name(cmp) == "decode_tps" else "prefill"
        words = f"no {what} difference shown between {cmp['other']} and {cmp['base']} (interval includes 1)"
    if bad:
        units = sorted({arms[n]["instance_unit"] for n in bad})
        words += (
            f"; but {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not reproducible across "
            f"{' / '.join(units)}"
        )
    return words


def analyze(result: dict[str, Any]) -> dict[str, Any]:
    arms = {a["name"]: analyze_arm(result, a) for a in result["arms"]}
    names = [a["name"] for a in result["arms"]]
    comparisons = []
    for other in names[1:]:
        cmp = compare_arms(result, names[0], other)
        cmp["verdict"] = comparison_verdict(cmp, arms)
        comparisons.append(cmp)
    return {
        "cv_threshold_pct": result["config"]["cv_threshold_pct"],
        "exclude_throttled": result["config"].get("exclude_throttled", False),
        "arms": arms,
        "comparisons": comparisons,
    }
