"""The judges: each turns an engine's evidence (tui.model.findings.Evidence) into at most one finding,
with the figures it rests on and what to try next. A judge never fires on too little data; the thresholds
below say how much is enough, and a figure that is not known (None) never counts as zero.
"""

from __future__ import annotations

from collections.abc import Callable

from tui.base import install
from tui.engines.knowledge import DraftKind, EngineKnowledge
from tui.engines.known import by_name
from tui.model.config import EngineConfig
from tui.model.findings import Evidence, Figure, Finding, PositionAcceptance, TrafficFacts

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
# Speculative decoding: drafts that must have reached a position before its acceptance is judged, and what a
# drafted token costs as a share of a step of the target model, by what drafts it (an assumption, stated in
# the finding: `sweep-param` and `ab` measure the real cost). A draft model runs a forward pass of its own per
# token; the model's own draft heads (MTP, EAGLE, Medusa) about one layer's; an n-gram lookup next to nothing,
# so a rejected n-gram token costs only its share of the verification step. A method not known is given the
# cheapest cost: a position is then called wasted only where it would be whatever drafted it.
MIN_SPEC_DRAFTS = 50
DRAFT_COSTS: dict[DraftKind, float] = {"draft model": 0.20, "model heads": 0.10, "n-gram": 0.05}
DRAFT_COST = DRAFT_COSTS["draft model"]
_COST_WORDS: dict[DraftKind, str] = {
    "draft model": "a token from a draft model is assumed to cost 20% of a target step (the draft's own "
                   "forward pass; an n-gram lookup would cost ~0)",
    "model heads": "a token from the model's own draft heads is assumed to cost 10% of a target step (one "
                   "head's pass, against 20% for a separate draft model)",
    "n-gram": "an n-gram token is assumed to cost 5% of a target step: the lookup costs ~0, and a rejected "
              "n-gram token costs only its share of the verification",
    "unknown": "what drafts the tokens is not known: a drafted token is assumed to cost 5% of a target step, "
               "the cheapest method's cost (n-gram lookups; a draft model's would be 20%)",
}
# Host memory at start: a tree's peak (PSS where read, else RSS) over this share of the RAM, or this much of
# it in swap (a few pages in swap are the kernel's housekeeping, not a start that ran out of memory).
START_RAM_SHARE = 0.8
START_SWAP_BYTES = 256 * 2**20
MIB = 2**20
GIB = 2**30


def _gib(n: int | float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.1f} GiB"


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.2%}"


def _knows(config: EngineConfig | None, field: str, otherwise: str) -> str:
    """What the engine's own knowledge (tui.engines) names for `field`: its option, in its words."""
    known = by_name(config.engine) if config is not None else None
    return str(getattr(known, field)) if known is not None else otherwise


def _context_option(config: EngineConfig) -> str:
    known = by_name(config.engine)
    return known.context_option if known else "the context limit"


def _finding(ev: Evidence, id: str, severity: str, title: str, suggestion: str, evidence: list[str],
             **figures: Figure) -> Finding:
    return Finding(id, ev.engine, severity, title, suggestion, tuple(evidence),  # type: ignore[arg-type]
                   tuple(figures.items()))


def _knowledge(config: EngineConfig | None) -> EngineKnowledge | None:
    return by_name(config.engine) if config is not None else None


def _prefix_flag(config: EngineConfig | None) -> str:
    knows = _knowledge(config)
    return knows.prefix_cache_on if knows is not None else "turn the engine's prefix cache on"


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
        how = "the engine's default: its command line does not set it" \
            if "prefix_caching" in config.defaults else f"read from {', '.join(config.sources)}"
        evidence.append(f"prefix caching {'on' if on else 'off'} ({how})")
    figures: dict[str, Figure] = dict(requests=t.shared_known, prompt_tokens=t.prompt_tokens,
                                      shared_tokens=t.shared_tokens, cached_tokens=cached)
    if on is False:
        missed = t.shared_tokens - min(cached or 0, t.shared_tokens)
        words, seconds = _prefill_words(t, missed)
        served = f"{cached:,} served from cache" if cached is not None else \
            "served from cache: unknown (the engine did not say)"
        return _finding(ev, "prefix-cache-off", "warning",
                        f"prefix caching is off on {ev.engine}; {share}, {served}{words}",
                        _prefix_flag(config), evidence, prefill_s_lost=seconds, **figures)
    if cached is None or cached >= EVICTING_BELOW * t.shared_tokens:
        return None
    missed = t.shared_tokens - cached
    words, seconds = _prefill_words(t, missed)
    block = f" (its KV block is {config.block_size} tokens: a shared part shorter than a block is never " \
            "served)" if config is not None and config.block_size else ""
    state = ("is on (its default) but" if "prefix_caching" in config.defaults else "is on but") \
        if on and config is not None else "(its setting is not published)"
    return _finding(ev, "prefix-cache-missing", "warning",
                    f"the prefix cache of {ev.engine} {state} served only {cached:,} of the "
                    f"{t.shared_tokens:,} prompt tokens the last {t.shared_known} requests shared with "
                    f"earlier ones{words}",
                    "look for eviction (KV pool too small for the sessions kept), requests spread over "
                    "llama.cpp slots that do not share a cache, or a prompt that changes near its start"
                    + block, evidence, prefill_s_lost=seconds, **figures)


def _needed(c: EngineConfig, t: TrafficFacts | None) -> tuple[int, str] | None:
    """The most context the traffic needed, in words, where it needed the context's limit: requests refused
    for length, or the longest one within NEAR_CONTEXT of the context. None otherwise."""
    if t is None or c.context_tokens is None:
        return None
    longest = max(t.longest_tokens or 0, t.refused_prompt_tokens or 0)
    if t.refused_for_length:
        plural = "s" if t.refused_for_length != 1 else ""
        return longest, f"{t.refused_for_length} request{plural} refused for length (\"{t.refused_words}\")"
    if t.longest_tokens is not None and t.longest_tokens >= NEAR_CONTEXT * c.context_tokens:
        return longest, (f"the longest request seen used {t.longest_tokens:,} tokens "
                         f"({_share(t.longest_tokens / c.context_tokens)} of the context)")
    return None


def context_below_pool(ev: Evidence) -> Finding | None:
    """A pool larger than one request's context is how vLLM and SGLang are built (many requests share it):
    only traffic that needed more context makes it a finding."""
    c, t = ev.config, ev.traffic
    if c is None or c.context_tokens is None or c.kv_pool_tokens is None or c.split_slots:
        return None
    if c.kv_pool_tokens < POOL_OVER_CONTEXT * c.context_tokens:
        return None
    needed = _needed(c, t)
    if needed is None:
        return None
    longest, what = needed
    flag = _context_option(c)
    return _finding(ev, "context-below-pool", "warning",
                    f"context {c.context_tokens:,} of a {c.kv_pool_tokens:,}-token KV pool: one request can "
                    f"use at most {_share(c.context_tokens / c.kv_pool_tokens)} of the pool, and the traffic "
                    f"needed more: {what}",
                    f"raise {flag} towards the pool's {c.kv_pool_tokens:,} tokens (up to the model's own "
                    "context): the pool holds it, though fewer requests that long then fit at once"
                    if longest <= c.kv_pool_tokens else
                    f"raise {flag} and the KV pool with it: the pool itself holds only {c.kv_pool_tokens:,} "
                    "tokens (more memory for the cache, or a smaller KV cache dtype)",
                    [f"context and KV pool read from {', '.join(c.sources)}",
                     "lengths from the engine's usage and refusals"],
                    context_tokens=c.context_tokens, kv_pool_tokens=c.kv_pool_tokens,
                    longest_tokens=longest or None, refused=t.refused_for_length if t else 0)


def context_below_traffic(ev: Evidence) -> Finding | None:
    c, t = ev.config, ev.traffic
    if t is None or c is None or c.context_tokens is None or c.split_slots:
        return None  # split slots: slots_split says it with the slots' figures
    needed = _needed(c, t)
    if needed is None:
        return None
    longest, what = needed
    flag = _context_option(c)
    # never a value at or below the context in force: the traffic came near it, or was refused at it
    now = c.context_tokens
    raise_to = f"raise {flag} to at least {longest:,} (now {now:,})" if longest > now \
        else f"raise {flag} above the current {now:,}"
    return _finding(ev, "context-below-traffic", "error" if t.refused_for_length else "warning",
                    f"{what}; the context is {c.context_tokens:,}"
                    + (f" and the longest request seen needs {longest:,} tokens" if t.refused_for_length
                       and longest else ""),
                    raise_to, [f"context read from {', '.join(c.sources)}",
                               "lengths from the engine's usage and refusals"],
                    refused=t.refused_for_length, longest_tokens=longest or None,
                    context_tokens=c.context_tokens)


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
                    f"more slots ({_knows(ev.config, 'slots_option', 'its slots')}) or less load; "
                    f"`{install.command()} capacity` "
                    "finds the arrival rate it holds within an SLO",
                    ["TTFT measured at the proxy; the engine's prompt time from its own timings",
                     "waiting requests from the engine's own gauge"],
                    ttft_p50_s=t.ttft_p50_s, engine_prompt_p50_s=t.engine_prompt_p50_s, waiting_max=waiting)


def _rate_words(p: PositionAcceptance) -> str:
    if p.rate is None:
        return "?"
    return f"{p.rate:.0%}" if p.exact else f"≤{p.rate:.0%}"


def spec_depth(ev: Evidence) -> Finding | None:
    """A draft position accepted less often than a drafted token costs, over the drafts that reached it. The
    depth is the configured one; where some drafts stopped short of it, each position's acceptance is only
    bounded from above (SpecFacts.positions), and a position is called wasted only when even that bound is
    below the cost. Position 1 wasted: speculation off."""
    s, c = ev.spec, ev.config
    if s is None or s.drafts < MIN_SPEC_DRAFTS or c is None or c.spec_n_max is None \
            or c.spec_type in (None, "off"):
        return None
    depth = c.spec_n_max
    positions = s.positions(depth)
    if positions is None:
        return None  # the counters contradict the configured depth: nothing is judged on them
    knows = _knowledge(c)
    # "on": the engine says it drafts, not how
    kind: DraftKind = knows.draft_kind(c.spec_type) if knows is not None and c.spec_type != "on" \
        else "unknown"
    cost = DRAFT_COSTS.get(kind, min(DRAFT_COSTS.values()))
    wasted = next((p for p in positions
                   if p.rate is not None and p.reached >= MIN_SPEC_DRAFTS and p.rate < cost), None)
    if wasted is None:
        return None
    exact = positions[0].exact
    bound = "" if exact else "at most "
    least = "" if exact else "at least "
    shown = ", ".join(_rate_words(p) for p in positions)
    reached = f"{bound}{wasted.rate:.0%} of the {least}{wasted.reached:,.0f} drafts that reached it"
    below = f"below the {cost:.0%} of a step a drafted token ({kind}) is assumed to cost"
    enginetop = install.command()
    measure = ("; then measure the decode rate at each depth, speculation off included "
               f"(`{enginetop} sweep-param`, `{enginetop} ab`): the cost here is assumed, not measured")
    if wasted.position == 1:
        title = (f"speculative decoding does not pay on {ev.engine}: position 1 is accepted in {reached} "
                 f"(per position: {shown}), {below}")
        knob = knows.spec_off if knows is not None else "turn speculative decoding off"
    else:
        keep = wasted.position - 1
        title = (f"drafts past depth {keep} are wasted on {ev.engine}: position {wasted.position} is "
                 f"accepted in {reached} (per position: {shown}), {below}")
        knob = knows.spec_depth(keep, depth, c.spec_type) if knows is not None else \
            f"a draft depth of {keep} (now {depth})"
    evidence = [f"accepted tokens per draft position from the engine's own counters, over {s.drafts:,.0f} "
                "drafts",
                f"draft depth {depth}{' (the engine default)' if 'spec_n_max' in c.defaults else ''} and "
                f"type {c.spec_type} from the configuration ({', '.join(c.sources)})"]
    if exact:
        evidence.append(f"every draft reached every position: {s.draft_tokens:,.0f} drafted tokens = "
                        f"{s.drafts:,.0f} drafts x depth {depth}")
    else:
        evidence.append(f"some drafts stopped short of depth {depth} ({s.draft_tokens:,.0f} drafted "
                        f"tokens, under {s.drafts * depth:,.0f} = drafts x depth: p-min, n-min, a lookup "
                        "that found nothing, a reply's end); the engines do not say which positions each "
                        "draft reached, so each position is taken over the fewest drafts that can have "
                        "reached it: its acceptance is at most the figure shown")
    evidence.append(_COST_WORDS[kind])
    return _finding(ev, "spec-depth", "warning", title, knob + measure, evidence,
                    drafts=s.drafts, draft_tokens=s.draft_tokens, depth=depth, draft_kind=kind,
                    draft_cost=cost, exact=exact, wasted_from_position=wasted.position,
                    **{f"accept_pos_{p.position}": None if p.rate is None else round(p.rate, 4)
                       for p in positions})


def start_memory(ev: Evidence) -> Finding | None:
    m = ev.start
    if m is None:
        return None
    killed = m.ended.startswith("killed")
    footprint = m.peak_pss_bytes if m.peak_pss_bytes is not None else m.peak_rss_bytes
    heavy = footprint >= START_RAM_SHARE * m.ram_total_bytes or m.peak_swap_bytes >= START_SWAP_BYTES
    if not killed and not heavy:
        return None
    swap = f" + {_gib(m.peak_swap_bytes)} in swap" if m.peak_swap_bytes >= START_SWAP_BYTES else ""
    size = f"PSS {_gib(m.peak_pss_bytes)} (RSS {_gib(m.peak_rss_bytes)})" if m.peak_pss_bytes is not None \
        else f"RSS {_gib(m.peak_rss_bytes)}"
    peak = f"peak {size}{swap} of the machine's {_gib(m.ram_total_bytes)} RAM"
    evidence = [f"its process tree sampled while it started; peak {m.peak_after_s:.1f} s after launch",
                f"host memory at the peak: {_gib(m.ram_used_bytes)} used, {_gib(m.swap_used_bytes)} swap"]
    if m.peak_pss_bytes is not None:
        evidence.append("PSS counts the pages its processes share once, as the sum of their RSS does not")
    figures: dict[str, Figure] = dict(peak_rss_bytes=m.peak_rss_bytes, peak_pss_bytes=m.peak_pss_bytes,
                                      peak_swap_bytes=m.peak_swap_bytes, ram_total_bytes=m.ram_total_bytes)
    if killed:
        host = ""
        if m.ram_used_at_end_bytes is not None:
            host = f"; the host then had {_gib(m.ram_used_at_end_bytes)} of {_gib(m.ram_total_bytes)} in use"
            if m.swap_used_at_end_bytes:
                host += f" and {_gib(m.swap_used_at_end_bytes)} in swap"
        evidence.append(m.oom_evidence or "")
        what = m.ended
        if m.oom and m.ended.startswith("killed by "):
            # "killed by SIGKILL while starting" -> "killed by the out-of-memory killer (SIGKILL) while
            # starting": the signal named once
            signal, _, rest = m.ended.removeprefix("killed by ").partition(" ")
            what = f"killed by the out-of-memory killer ({signal})" + (f" {rest}" if rest else "")
        return _finding(ev, "engine-killed", "error", f"{ev.engine} was {what}, at {peak}{host}",
                        "give it more RAM or swap, or lower what its start needs "
                        f"({_knows(ev.config, 'memory_options', 'a smaller context or KV cache')})",
                        [e for e in evidence if e], oom=m.oom, ended=m.ended, **figures)
    return _finding(ev, "start-memory", "warning",
                    f"{ev.engine}'s start took its process tree to {peak}",
                    "leave headroom: a start that peaks here can be killed on a busier machine", evidence,
                    **figures)


# Requests, as the engine counted them: enough to say "the context cut them" or "preempted with the pool full"
MIN_ENDED = 5
LENGTH_SHARE = 0.5  # of the requests that ended, at least this share ended at the length cap
KV_FULL = 0.9


def length_cap(ev: Evidence) -> Finding | None:
    """Requests that ended at the length cap because the context ran out, not because the client's max_tokens
    said so: vLLM refuses a request whose prompt + max_tokens exceeds the context, so one that ends "length"
    with its prompt and output filling the context had no max_tokens (vLLM then gives it what is left)."""
    rs, c = ev.requests, ev.config
    if rs is None or c is None or c.context_tokens is None or not rs.ended or rs.ended < MIN_ENDED:
        return None
    # llama.cpp (the proxy's figures) says "length" for a client's own max_tokens too: only those cut sooner
    length = dict(rs.finish_window).get("length", 0.0) if rs.origin is None else rs.length_unasked or 0.0
    if length / rs.ended < LENGTH_SHARE or rs.prompt_len is None or rs.gen_len is None:
        return None
    prompt, gen = rs.prompt_len[0], rs.gen_len[0]
    if prompt is None or gen is None or prompt + gen < NEAR_CONTEXT * c.context_tokens:
        return None
    flag = _context_option(c)
    seen = "the engine's own histograms" if rs.origin is None else "the answers relayed by enginetop's proxy"
    return _finding(
        ev, "length-cap", "warning",
        f"{length:.0f} of {rs.ended:.0f} requests ended at the length cap with prompt + output averaging "
        f"{prompt + gen:,.0f} of the {c.context_tokens:,}-token context: the context cut them, not the "
        "clients' max_tokens",
        f"raise {flag} (now {c.context_tokens:,}) if the KV pool holds more, or have clients set max_tokens "
        "to what they need",
        [f"finish reasons in the window: {', '.join(f'{r} {n:.0f}' for r, n in rs.finish_window)}"
         + ("" if rs.origin is None else f"; {length:.0f} of them before the max_tokens their clients asked"),
         f"prompt {prompt:,.0f} + generated {gen:,.0f} tokens on average ({seen})"],
        ended=rs.ended, length=length, context_tokens=c.context_tokens, avg_tokens=prompt + gen)


def preemptions(ev: Evidence) -> Finding | None:
    """Requests preempted while the KV pool was full: each gives its KV blocks back and computes its prompt
    again later, so the pool's size, not the GPU, sets the pace."""
    rs = ev.requests
    if rs is None or not rs.preemptions_per_s or rs.kv_usage_max is None or rs.kv_usage_max < KV_FULL:
        return None
    count = rs.preemptions_per_s * rs.window_s
    pool = ev.config.kv_pool_tokens if ev.config is not None else None
    where = f" of {pool:,} tokens" if pool else ""
    return _finding(
        ev, "preemptions", "warning",
        f"{count:.0f} preemptions in the last {rs.window_s:.0f} s with the KV pool{where} "
        f"{rs.kv_usage_max:.0%} full: preempted requests compute their prompt again",
        f"give the KV cache more room ({_knows(ev.config, 'memory_options', 'a larger KV cache')}) or admit "
        f"fewer requests at once ({_knows(ev.config, 'slots_option', 'fewer slots')})",
        [f"{rs.preemptions_per_s:.2f} preemptions/s, the pool at most {rs.kv_usage_max:.0%} full (the "
         "engine's own counters)"],
        preemptions=count, kv_usage_max=rs.kv_usage_max)


JUDGES: tuple[Callable[[Evidence], Finding | None], ...] = (
    prefix_cache, context_below_pool, context_below_traffic, slots_split, queueing, spec_depth, start_memory,
    length_cap, preemptions)


def judge(ev: Evidence) -> list[Finding]:
    """Every finding that holds for this engine now, most severe first."""
    return by_severity([f for j in JUDGES if (f := j(ev)) is not None])


def by_severity(found: list[Finding]) -> list[Finding]:
    """Most severe first (a stable sort: each judge's order within a severity stays)."""
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order[f.severity])
