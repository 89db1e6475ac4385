"""The judges: each turns an engine's evidence (tui.model.findings.Evidence) into at most one finding,
with the figures it rests on and what to try next. A judge never fires on too little data; the thresholds
below say how much is enough, and a figure that is not known (None) never counts as zero.
"""

from __future__ import annotations

from collections.abc import Callable

from tui.model.config import EngineConfig
from tui.model.findings import Evidence, Figure, Finding, TrafficFacts

# Prefix cache: at least this many requests whose sharing is known, sharing at least this many tokens (and
# this share of their prompts) with earlier requests; "missing" when the engine served under half of what was
# shared.
MIN_PREFIX_REQUESTS = 5
MIN_SHARED_TOKENS = 256
MIN_SHARED_SHARE = 0.10
EVICTING_BELOW = 0.5
# A KV pool this much larger than the context: one request can never use most of it.
POOL_OVER_CONTEXT = 1.5
NEAR_CONTEXT = 0.9  # the longest request reached this share of the context
# Slots split: watched this long with this many requests before "never used together" is said.
MIN_SLOTS_WATCH_S = 60.0
MIN_SLOTS_REQUESTS = 5
# Queueing: this many requests timed by both the client and the engine, TTFT this many times the engine's
# prompt time and at least this far above it.
MIN_QUEUE_REQUESTS = 10
QUEUE_FACTOR = 3.0
QUEUE_GAP_S = 0.25
# Speculative decoding: drafts before acceptance per position is judged, and what a drafted token costs, as a
# share of a target model's step (an assumption, stated in the finding: `sweep-param` measures the real one).
MIN_SPEC_DRAFTS = 50
DRAFT_COST = 0.2
# Host memory at start: a tree's peak RSS over this share of the RAM, or any of it in swap.
START_RAM_SHARE = 0.8
MIB = 2**20
GIB = 2**30


def _gib(n: int | float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.1f} GiB"


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.2%}"


def _finding(ev: Evidence, id: str, severity: str, title: str, suggestion: str, evidence: list[str],
             **figures: Figure) -> Finding:
    return Finding(id, ev.engine, severity, title, suggestion, tuple(evidence),  # type: ignore[arg-type]
                   tuple(figures.items()))


def _prefix_flag(config: EngineConfig | None) -> str:
    engine = config.engine if config else ""
    if engine == "vLLM":
        return ("restart vLLM with --enable-prefix-caching (for a hybrid Mamba model, see its "
                "mamba_cache_mode)")
    if engine == "SGLang":
        return "restart SGLang without --disable-radix-cache"
    if engine == "llama.cpp":
        return "restart llama-server without --no-cache-prompt, and send requests with cache_prompt left on"
    return "turn the engine's prefix cache on"


def _prefill_words(t: TrafficFacts, tokens: int) -> tuple[str, float | None]:
    rate = t.computed_rate
    if rate is None or tokens <= 0:
        return "", None
    seconds = tokens / rate
    bound = " (at most: measured from TTFT)" if t.prefill_source == "TTFT" else ""
    return f": ~{seconds:.1f} s of prefill a cache would have skipped{bound}", seconds


def prefix_cache(ev: Evidence) -> Finding | None:
    t, config = ev.traffic, ev.config
    if t is None or t.shared_known < MIN_PREFIX_REQUESTS or t.shared_tokens < MIN_SHARED_TOKENS \
            or t.prompt_tokens <= 0 or t.shared_tokens / t.prompt_tokens < MIN_SHARED_SHARE:
        return None
    cached = t.cached_tokens
    on = config.prefix_caching if config else None
    share = (f"the last {t.shared_known} requests shared {t.shared_tokens:,} of {t.prompt_tokens:,} prompt "
             "tokens with earlier ones")
    evidence = [f"{share} (their prompts' tokens compared block by block)",
                f"cached tokens the engine reported: {'not said' if cached is None else f'{cached:,}'}"]
    if config is not None and config.prefix_caching is not None:
        evidence.append(f"prefix caching {'on' if on else 'off'}, read from {', '.join(config.sources)}")
    figures: dict[str, Figure] = dict(requests=t.shared_known, prompt_tokens=t.prompt_tokens,
                                      shared_tokens=t.shared_tokens, cached_tokens=cached)
    if on is False:
        missed = t.shared_tokens - min(cached or 0, t.shared_tokens)
        words, seconds = _prefill_words(t, missed)
        return _finding(ev, "prefix-cache-off", "warning",
                        f"prefix caching is off on {ev.engine}; {share}, {cached or 0:,} served from "
                        f"cache{words}",
                        _prefix_flag(config), evidence, prefill_s_lost=seconds, **figures)
    if cached is None or cached >= EVICTING_BELOW * t.shared_tokens:
        return None
    missed = t.shared_tokens - cached
    words, seconds = _prefill_words(t, missed)
    block = f" (its KV block is {config.block_size} tokens: a shared part shorter than a block is never " \
            "served)" if config is not None and config.block_size else ""
    state = "is on but" if on else "(its setting is not published)"
    return _finding(ev, "prefix-cache-missing", "warning",
                    f"the prefix cache of {ev.engine} {state} served only {cached:,} of the "
                    f"{t.shared_tokens:,} prompt tokens the last {t.shared_known} requests shared with "
                    f"earlier ones{words}",
                    "look for eviction (KV pool too small for the sessions kept), requests spread over "
                    "llama.cpp slots that do not share a cache, or a prompt that changes near its start"
                    + block, evidence, prefill_s_lost=seconds, **figures)


def context_below_pool(ev: Evidence) -> Finding | None:
    c, t = ev.config, ev.traffic
    if c is None or c.context_tokens is None or c.kv_pool_tokens is None or c.split_slots:
        return None
    if c.kv_pool_tokens < POOL_OVER_CONTEXT * c.context_tokens:
        return None
    near = t is not None and (t.refused_for_length > 0 or (
        t.longest_tokens is not None and t.longest_tokens >= NEAR_CONTEXT * c.context_tokens))
    flag = {"vLLM": "--max-model-len", "SGLang": "--context-length",
            "llama.cpp": "--kv-unified-per-slot"}.get(c.engine, "the context limit")
    seen = ""
    if t is not None and t.longest_tokens is not None:
        seen = f"; the longest request seen used {t.longest_tokens:,} tokens"
    return _finding(ev, "context-below-pool", "warning" if near else "info",
                    f"context {c.context_tokens:,} of a {c.kv_pool_tokens:,}-token KV pool: one request can "
                    f"use at most {_share(c.context_tokens / c.kv_pool_tokens)} of the pool{seen}",
                    f"raise {flag} (up to the model's own context) if your requests need longer contexts",
                    [f"context and KV pool read from {', '.join(c.sources)}"],
                    context_tokens=c.context_tokens, kv_pool_tokens=c.kv_pool_tokens,
                    longest_tokens=t.longest_tokens if t else None)


def context_below_traffic(ev: Evidence) -> Finding | None:
    c, t = ev.config, ev.traffic
    if t is None or c is None or c.context_tokens is None:
        return None
    longest = max(t.longest_tokens or 0, t.refused_prompt_tokens or 0)
    if t.refused_for_length == 0 and longest < NEAR_CONTEXT * c.context_tokens:
        return None
    if c.split_slots:
        return None  # slots_split says it with the slots' figures
    plural = "s" if t.refused_for_length != 1 else ""
    refused = f"{t.refused_for_length} request{plural} refused for length (\"{t.refused_words}\"); " \
        if t.refused_for_length else ""
    flag = {"vLLM": "--max-model-len", "SGLang": "--context-length", "llama.cpp": "-c / --ctx-size"}.get(
        c.engine, "the context limit")
    return _finding(ev, "context-below-traffic", "error" if t.refused_for_length else "warning",
                    f"{refused}the longest request seen needs {longest:,} tokens, the context is "
                    f"{c.context_tokens:,}", f"raise {flag} above {longest:,}",
                    [f"context read from {', '.join(c.sources)}",
                     "lengths from the engine's usage and refusals"],
                    refused=t.refused_for_length, longest_tokens=longest, context_tokens=c.context_tokens)


def slots_split(ev: Evidence) -> Finding | None:
    c, t = ev.config, ev.traffic
    if c is None or not c.split_slots or c.slots is None or c.context_tokens is None:
        return None
    refused = t.refused_for_length if t is not None else 0
    busy = max(ev.concurrency_max or 0, (t.max_in_flight or 0) if t else 0)
    watched = ev.watched_s >= MIN_SLOTS_WATCH_S and t is not None and t.requests >= MIN_SLOTS_REQUESTS
    if not refused and not (watched and busy <= c.slots // 2):
        return None
    pool = c.kv_pool_tokens or c.slots * c.context_tokens
    parts = [f"{c.slots} slots of {c.context_tokens:,} tokens each"]
    if ev.concurrency_max is not None or (t is not None and t.max_in_flight is not None):
        parts.append(f"at most {busy} request{'s' if busy != 1 else ''} ran at a time")
    if refused:
        parts.append(f"{refused} request{'s' if refused != 1 else ''} {'were' if refused != 1 else 'was'} "
                     f"refused for length")
    need = max(t.refused_prompt_tokens or 0, t.longest_tokens or 0) if t is not None else 0
    held = f": one slot of {pool:,}, or --kv-unified, would have held {'them' if refused != 1 else 'it'}" \
        if refused and need <= pool else ""
    evidence = [f"slots and per-slot context from {', '.join(c.sources)}"]
    if t is not None and t.refused_words:
        evidence.append(f"the engine's words: \"{t.refused_words}\"")
    return _finding(ev, "slots-split", "error" if refused else "warning", "; ".join(parts) + held,
                    f"start llama-server with -np {max(busy, 1)} -c {pool} (or --kv-unified: every slot may "
                    f"then use the whole {pool:,})", evidence, slots=c.slots, slot_context=c.context_tokens,
                    kv_pool_tokens=pool, concurrency_max=busy, refused=refused, needed_tokens=need or None)


def queueing(ev: Evidence) -> Finding | None:
    t = ev.traffic
    if t is None or t.timed_requests < MIN_QUEUE_REQUESTS or t.ttft_p50_s is None \
            or t.engine_prompt_p50_s is None:
        return None
    ttft, prompt = t.ttft_p50_s, t.engine_prompt_p50_s
    if ttft < QUEUE_FACTOR * prompt or ttft - prompt < QUEUE_GAP_S:
        return None
    waiting = ev.waiting_max or 0
    if waiting <= 0 and (t.max_in_flight or 0) <= (ev.config.slots or 1 if ev.config else 1):
        return None  # nothing waited that we saw: the gap is the client's or the network's
    return _finding(ev, "queueing", "warning",
                    f"requests wait before {ev.engine} starts them: the traffic's TTFT p50 is "
                    f"{t.ttft_p50_s * 1000:.0f} ms against the engine's own prompt time p50 "
                    f"{t.engine_prompt_p50_s * 1000:.0f} ms (over {t.timed_requests} requests), with up to "
                    f"{max(waiting, 0)} waiting",
                    "more slots (llama.cpp -np, vLLM --max-num-seqs) or less load; `enginetop capacity` "
                    "finds the arrival rate it holds within an SLO",
                    ["TTFT measured at the proxy; the engine's prompt time from its own timings",
                     "waiting requests from the engine's own gauge"],
                    ttft_p50_s=t.ttft_p50_s, engine_prompt_p50_s=t.engine_prompt_p50_s, waiting_max=waiting)


def spec_depth(ev: Evidence) -> Finding | None:
    s, c = ev.spec, ev.config
    if s is None or s.drafts < MIN_SPEC_DRAFTS or not s.per_position:
        return None
    rates = s.position_rates
    wasted = next((k for k, r in enumerate(rates) if r < DRAFT_COST), None)
    if wasted is None:
        return None
    shown = ", ".join(f"{r:.0%}" for r in rates)
    depth = len(rates)
    keep = max(wasted, 1)
    depths = ",".join(map(str, range(1, depth + 1)))
    return _finding(ev, "spec-depth", "warning",
                    f"drafts past depth {wasted} are wasted on {ev.engine}: position {wasted + 1} is "
                    f"accepted in {rates[wasted]:.0%} of {s.drafts:.0f} drafts (per position: {shown}), "
                    f"below the {DRAFT_COST:.0%} of a step a drafted token is assumed to cost",
                    f"--spec-draft-n-max {keep} (now {c.spec_n_max if c and c.spec_n_max else depth}); "
                    f"measure it: `enginetop sweep-param PROFILE --param spec-draft-n-max={depths}`",
                    ["accepted tokens per draft position since the engine started, from its own counters"],
                    drafts=s.drafts, wasted_from_position=wasted + 1, depth=depth,
                    **{f"accept_pos_{k + 1}": round(r, 4) for k, r in enumerate(rates)})


def start_memory(ev: Evidence) -> Finding | None:
    m = ev.start
    if m is None:
        return None
    killed = m.ended.startswith("killed")
    heavy = m.peak_rss_bytes >= START_RAM_SHARE * m.ram_total_bytes or m.peak_swap_bytes > 0
    if not killed and not heavy:
        return None
    swap = f" + {_gib(m.peak_swap_bytes)} in swap" if m.peak_swap_bytes else ""
    peak = f"peak RSS {_gib(m.peak_rss_bytes)}{swap} of the machine's {_gib(m.ram_total_bytes)} RAM"
    evidence = [f"its process tree sampled while it started; peak {m.peak_after_s:.1f} s after launch",
                f"host memory at the peak: {_gib(m.ram_used_bytes)} used, {_gib(m.swap_used_bytes)} swap"]
    if killed:
        host = ""
        if m.ram_used_at_end_bytes is not None:
            host = f"; the host then had {_gib(m.ram_used_at_end_bytes)} of {_gib(m.ram_total_bytes)} in use"
            if m.swap_used_at_end_bytes:
                host += f" and {_gib(m.swap_used_at_end_bytes)} in swap"
        by = " by the out-of-memory killer" if m.oom else ""
        evidence.append(m.oom_evidence or "")
        what = m.ended.replace("killed by", f"killed{by} ({m.ended.split()[2]})", 1) if by else m.ended
        return _finding(ev, "engine-killed", "error", f"{ev.engine} was {what}, at {peak}{host}",
                        "give it more RAM or swap, or lower what its start needs (vLLM: --max-model-len, "
                        "--gpu-memory-utilization, --enforce-eager; fewer CPU threads compiling)",
                        [e for e in evidence if e], peak_rss_bytes=m.peak_rss_bytes,
                        peak_swap_bytes=m.peak_swap_bytes, ram_total_bytes=m.ram_total_bytes, oom=m.oom,
                        ended=m.ended)
    return _finding(ev, "start-memory", "warning",
                    f"{ev.engine}'s start took its process tree to {peak}",
                    "leave headroom: a start that peaks here can be killed on a busier machine", evidence,
                    peak_rss_bytes=m.peak_rss_bytes, peak_swap_bytes=m.peak_swap_bytes,
                    ram_total_bytes=m.ram_total_bytes)


JUDGES: tuple[Callable[[Evidence], Finding | None], ...] = (
    prefix_cache, context_below_pool, context_below_traffic, slots_split, queueing, spec_depth, start_memory)


def judge(ev: Evidence) -> list[Finding]:
    """Every finding that holds for this engine now, most severe first."""
    found = [f for j in JUDGES if (f := j(ev)) is not None]
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order[f.severity])
