"""The report's Method: how a comparison was measured, in sentences written from what its run recorded.

Every sentence comes from the result itself (its "method" facts, tui.compare.ab.method_facts, and its
blocks and requests), never from what the code would do today: a result written by an enginetop that did
not record how it ran says so instead of guessing.
"""

from __future__ import annotations

from html import escape
from typing import Any

from tui.base.stats import median
from tui.compare.analysis import units_of
from tui.html.page import num, section


def method_section(result: dict[str, Any]) -> str:
    """Every sentence from what this run recorded (result["method"], its blocks and requests)."""
    facts = result.get("method")
    if facts is None:
        items = [
            "This result was written by an enginetop that did not record how the run was done (no "
            "\"method\" in its JSON): which engines were restarted, the warm-up and the GPU sampling are "
            "unknown. Its configuration is in the JSON's \"config\"."
        ]
    else:
        items = [
            _method_engines(facts),
            _method_schedule(result, facts),
            _method_requests(result, facts),
            _method_cache(result),
            _method_metrics(result),
            _method_statistics(result),
            _method_gpu(result, facts),
            _method_host(result),
        ]
    return section(
        "Method",
        "How it was measured — the numbers only mean something with this",
        "<ol>" + "".join(f"<li>{i}</li>" for i in items if i) + "</ol>",
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _method_engines(facts: dict[str, Any]) -> str:
    words = []
    for arm in facts["arms"]:
        name = f"<b>{escape(arm['name'])}</b>"
        if arm["restarted"]:
            text = f"{name}: {_plural(arm['starts'], 'fresh engine start')}"
            if arm["starts"] and arm["safe_switch_starts"] == arm["starts"]:
                text += (" through the safe switch (stop → VRAM, PIDs and port drained → start → /health "
                         "and a real 1-token completion)")
            elif arm["safe_switch_starts"]:
                text += f", {arm['safe_switch_starts']} of them through the safe switch"
            cold = arm["cold_start_s"]
            if cold:
                text += f", cold start {min(cold):.1f}–{max(cold):.1f} s"
        else:
            origin = escape(arm.get("origin") or "attached")
            rounds = _plural(arm["starts"], "round")
            text = f"{name}: never restarted ({origin}); {rounds} in time on the engine as it ran"
        if arm["failed_starts"]:
            text += f"; {arm['failed_starts']} failed to start (see Errors)"
        words.append(text)
    warm = facts["warmup_requests"]
    if warm:
        sent = sum(a["warmup_sent"] for a in facts["arms"])
        ok = sum(a["warmup_ok"] for a in facts["arms"])
        when = " and ".join(sorted({"after each start" if a["restarted"] else "at each round"
                                    for a in facts["arms"]}))
        warm_words = (f"Before measuring, {_plural(warm, 'unrecorded warm-up request')} {when} ({sent} sent, "
                      f"{ok} answered).")
    else:
        warm_words = "No warm-up requests were sent: the first block of each start or round measured it cold."
    return "Engines. " + "; ".join(words) + ". " + warm_words


def _method_schedule(result: dict[str, Any], facts: dict[str, Any]) -> str:
    cfg = result["config"]
    arms = facts["arms"]
    names = [escape(a["name"]) for a in arms]
    fresh = [escape(a["name"]) for a in arms if a["restarted"]]
    kept = [escape(a["name"]) for a in arms if not a["restarted"]]
    if facts["mode"] == "switch":
        text = ("Schedule <b>switch</b>: one engine at a time; round i starts instance i of each arm in turn "
                "(in the order given, reversed in odd rounds) and runs its blocks back to back")
    else:
        if not fresh:
            who = "all engines kept running side by side"
        elif not kept:
            who = "round i started instance i of every arm, side by side on distinct ports"
        else:
            who = (f"round i started instance i of {', '.join(fresh)} beside the running "
                   f"{', '.join(kept)}")
        text = f"Schedule <b>coresident</b>: {who}"
        if len(arms) > 1:
            text += (f"; within a round blocks go through the arms in turn ({' '.join(names)} …), the next "
                     "round in reverse order, so drift hits every arm alike")
    units = units_of(result, "s")
    blocks = len(result["blocks"])
    return (f"{text}. Planned per arm: {cfg['instances']} {units} × {_plural(cfg['blocks'], 'block')} × "
            f"{_plural(cfg['requests_per_block'], 'request')}; {_plural(blocks, 'block')} recorded in all.")


def _method_requests(result: dict[str, Any], facts: dict[str, Any]) -> str:
    req = facts["requests"]
    if req.get("replay"):
        return (
            f"A block is {result['config']['requests_per_block']} requests of the workload "
            f"<b>{escape(req['workload'])}</b> ({req['workload_requests']} requests in all), one after "
            "another, each asking for its recorded output length exactly (ignore_eos); the block at one "
            "place in the schedule gets the same requests on every arm. A block's value is the median of its "
            f"successful requests. Its first request began “{escape(req['first_prompt_start'])}…”."
        )
    nonce = (req.get("params") or {}).get("nonce")
    seed = f"the request's seed (block seed {escape(req['block_seed'])}) and its number"
    tag = f"a tag made from {seed}"
    if nonce:
        tag = (f"a tag hashed from this run's nonce <b>{escape(str(nonce))}</b>, {seed}, so it matches no "
               "earlier request's prompt, in this run or another")
    return (
        f"A block is {result['config']['requests_per_block']} sequential single-stream requests of workload "
        f"<b>{escape(req['workload'])}</b>: max_tokens {num(req.get('max_tokens'), 0)}, temperature "
        f"{num(req.get('temperature'), 0)}, ignore_eos {'on' if req.get('ignore_eos') else 'off'}. A block's "
        f"value is the median of its successful requests. Every prompt starts with {tag}; the first "
        f"measured prompt began “{escape(req['first_prompt_start'])}…”."
    )


def _requests(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for b in result["blocks"] for r in b["requests"] if r.get("ok")]


def _method_cache(result: dict[str, Any]) -> str:
    requests = _requests(result)
    told = [r for r in requests if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    if not told:
        return (f"No engine reported how many prompt tokens came from its cache ({len(requests)} successful "
                "requests): whether a prompt cache served part of a prompt is not known.")
    cached = sum(r["cached_tokens"] for r in told)
    prompt = sum(r["prompt_tokens"] for r in told)
    worst = max(r["cached_tokens"] / r["prompt_tokens"] for r in told)
    text = (f"Prompt cache: {len(told)} of {len(requests)} successful requests said how many prompt tokens "
            f"came from a cache: {cached} of {prompt} ({100 * cached / prompt:.0f}%), at most "
            f"{100 * worst:.0f}% of one request's prompt.")
    served = [r for r in requests if r.get("cache_served")]
    if served:
        text += f" {len(served)} were flagged as served from the cache: their TTFT and prefill measure a hit."
    return text


def _method_metrics(result: dict[str, Any]) -> str:
    blocks = [b for b in result["blocks"] if b.get("token_source")]
    server = sum(1 for b in blocks if b["token_source"] == "server")
    requests = _requests(result)
    own = sum(1 for r in requests if r.get("server_decode_tps") is not None)
    prefill = {src: sum(1 for r in requests if r.get("prefill_source") == src)
               for src in ("server", "client-lower-bound")}
    text = ("decode tok/s = (completion_tokens − 1) / (last token − first token) on the client clock; "
            f"completion tokens came from the server's usage in {server} of {len(blocks)} blocks")
    if server < len(blocks):
        text += ", from a count of stream chunks in the others (the server sent no token counts)"
    text += (f". The engine's own decode figure was reported for {own} of {len(requests)} requests"
             + (", shown beside it, labelled server-side" if own else "") + ". ")
    connect = [r["connect_s"] for r in requests if r.get("connect_s") is not None]
    if any("connect_s" in r for r in requests):  # recorded by clients that send after connecting
        middle = median(connect)
        apart = f"measured apart (median {1000 * middle:.1f} ms)" if middle is not None else "not measured"
        text += ("TTFT is the client's time from sending a request to its first content chunk; opening the "
                 f"connection was {apart} and is not in it. ")
    else:
        text += ("TTFT is the client's time from the start of a request, a new connection's set-up included, "
                 "to its first content chunk. ")
    text += (f"prefill tok/s: the engine's own figure for {prefill['server']} requests, a client-side lower "
             f"bound (uncached prompt tokens / TTFT) for {prefill['client-lower-bound']}.")
    return text


def _method_statistics(result: dict[str, Any]) -> str:
    cfg = result["config"]
    unit = units_of(result)
    units = units_of(result, "s")
    return (
        f"Per arm: median, CV% and range over blocks, and the median of each {unit}. The verdict is "
        f"<b>reproducible</b> when the CV of the {unit} medians is ≤ {cfg['cv_threshold_pct']:g}%, <b>not "
        "reproducible</b> above (the seeds' steady arms scattered 0.3–0.6%, the untrustworthy one "
        f"46.7–73.4), and <b>single {unit}</b> when only one gave data. Ratios are of medians against the "
        f"first arm, with a hierarchical percentile bootstrap 95% interval ({cfg['bootstrap_samples']} "
        f"resamples, seed {cfg['seed']}): {units} drawn with replacement, then blocks within them, so "
        f"scatter between {units} widens the interval."
    )


def _method_gpu(result: dict[str, Any], facts: dict[str, Any]) -> str:
    gpu = facts["gpu"]
    cfg = result["config"]
    blocks = result["blocks"]
    if gpu["origin"] is None:
        return f"The GPU was not sampled: {escape(gpu['why_not'] or 'no reason recorded')}."
    seen = [b for b in blocks if (b.get("gpu") or {}).get("gpus")]
    if not seen:
        reasons = sorted({(b.get("gpu") or {}).get("unavailable") or "no GPU" for b in blocks})
        return (f"GPU state was asked of {escape(gpu['origin'])} every {gpu['interval_s']:g} s during each "
                f"block, and no GPU answered ({escape('; '.join(reasons))}): the GPU state is unknown.")
    throttled = sum(1 for b in blocks if b.get("throttled"))
    text = (f"GPU state was read from {escape(gpu['origin'])} every {gpu['interval_s']:g} s during each "
            f"block ({len(seen)} of {len(blocks)} blocks have readings): temperature, power, utilisation, "
            f"memory bandwidth, clock-event reasons. {_plural(throttled, 'block')} saw a real throttle "
            "reason")
    if cfg.get("exclude_throttled"):
        return text + " and were left out of the statistics."
    return text + "; any such block is kept in the statistics (--exclude-throttled drops them)."


def _method_host(result: dict[str, Any]) -> str:
    blocks = result["blocks"]
    measured = sum(1 for b in blocks if b.get("host_cpu_pct") is not None)
    return (f"Host CPU busy % (every process on the machine) was measured over {measured} of {len(blocks)} "
            "blocks, with a baseline of its own.")
