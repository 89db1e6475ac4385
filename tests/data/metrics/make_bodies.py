"""Generate the captured-shape /metrics fixtures with prometheus_client itself, so the exposition details
(`_total` handling, `_created` gauge families, bucket lines, label order, escaping) are exactly what the
engines' own prometheus_client emits. Names, labels, help texts and default buckets follow
/work/shared/reference/engine-metrics.md §1 and §3 (vLLM 0.33 / 0.8-era V1 loggers.py, SGLang 0.5.23
metrics_collector.py).

Run:  .venv/bin/python tests/data/metrics/make_bodies.py
Writes vllm_0_33.txt, vllm_old.txt, sglang_0_5_23.txt and expected.json (the ground truth this script fed
into the metric objects; the tests compare parse results against it, not against a second parser).
The llama.cpp body (llamacpp.txt) is not generated: it was captured from the real llama-server.
"""

from __future__ import annotations

import bisect
import json
import random
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
    generate_latest,
)

HERE = Path(__file__).resolve().parent

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10,
                 30, 60)
SGL_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGL_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                   0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
SGL_E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
                   2400]
SGL_PROMPT_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000,
                      12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000,
                      100000, 200000, 300000, 400000, 600000, 800000, 1000000, 1100000]

VLLM_HANDLERS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses", "/v1/embeddings",
                 "/tokenize", "/detokenize", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank",
                 "/v2/rerank", "/invocations", "/v1/audio/transcriptions", "/v1/audio/translations",
                 "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/classify",
                 "/v1/chat/completions/render", "/v1/completions/render", "/sleep", "/wake_up",
                 "/reset_prefix_cache", "/scale_elastic_ep", "/collective_rpc", "/tokenizer_info",
                 "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel", "/v1/messages",
                 "/generative_scoring", "/get_world_size"]


def build_1_2_5(max_value: int) -> list[int]:
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


def cumulative(bounds: list[float], values: list[float]) -> list[list[float]]:
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    acc, out = 0, []
    for b, c in zip([*bounds, float("inf")], counts, strict=True):
        acc += c
        out.append([b, acc])
    return out


def http_metrics(reg: CollectorRegistry, rng: random.Random, handlers: list[str]) -> None:
    """prometheus_fastapi_instrumentator defaults (statuses grouped as 2xx/4xx/5xx)."""
    reqs = Counter("http_requests_total", "Total number of requests by method, status and handler.",
                   ["method", "status", "handler"], registry=reg)
    req_size = Summary("http_request_size_bytes", "Content length of incoming requests by handler. Only "
                       "value of header is respected. Otherwise ignored. No percentile calculated. ",
                       ["handler"], registry=reg)
    resp_size = Summary("http_response_size_bytes", "Content length of outgoing responses by handler. Only "
                        "value of header is respected. Otherwise ignored. No percentile calculated. ",
                        ["handler"], registry=reg)
    highr = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific "
                      "labels. Made for more accurate percentile calculations. ", buckets=HIGHR_BUCKETS,
                      registry=reg)
    dur = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler. Made to be "
                    "only used if aggregation by handler is important. ", ["handler", "method"],
                    buckets=(0.1, 0.5, 1), registry=reg)
    for h in handlers:
        method = "GET" if h in ("/v1/models", "/tokenizer_info", "/get_world_size") else "POST"
        for status in ("2xx", "4xx", "5xx"):
            n = rng.randint(1, 40)
            reqs.labels(method, status, h).inc(n)
            for _ in range(n):
                d = rng.lognormvariate(-1, 1)
                highr.observe(d)
                dur.labels(h, method).observe(d)
                req_size.labels(h).observe(rng.randint(50, 5000))
                resp_size.labels(h).observe(rng.randint(50, 50000))


def process_metrics(reg: CollectorRegistry) -> None:
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)


def vllm_033() -> tuple[bytes, dict]:
    rng = random.Random(33)
    reg = CollectorRegistry()
    process_metrics(reg)
    http_metrics(reg, rng, VLLM_HANDLERS)
    model = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    max_model_len = 262144
    ln = ["model_name", "engine"]
    lv = (model, "0")

    def g(name, doc, extra=()):
        return Gauge(name, doc, [*ln, *extra], registry=reg)

    def c(name, doc, extra=()):
        return Counter(name, doc, [*ln, *extra], registry=reg)

    def h(name, doc, buckets, extra=()):
        return Histogram(name, doc, [*ln, *extra], buckets=buckets, registry=reg)

    running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
    waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
    by_reason = g("vllm:num_requests_waiting_by_reason", "Number of requests waiting by reason. Sum of all "
                  "reasons equals vllm:num_requests_waiting.", ["reason"])
    sleep = g("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
              "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
              "level 2.", ["sleep_state"])
    kv = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    prefix_q = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
    prefix_h = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
    ext_q = c("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-"
              "instance cache sharing, in terms of number of queried tokens.")
    ext_h = c("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-"
              "instance cache sharing, in terms of number of cached tokens.")
    mm_q = c("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")
    mm_h = c("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
    preempt = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
    prompt = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
    by_source = c("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"])
    cached = c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
    cached_by = c("vllm:prompt_tokens_cached_by_source", "Number of cached prompt tokens by source.",
                  ["source"])
    gen = c("vllm:generation_tokens", "Number of generation tokens processed.")
    success = c("vllm:request_success", "Count of successfully processed requests.", ["finished_reason"])
    rejections = Counter("vllm:admission_rejections", "Number of requests rejected by frontend admission "
                         "control.", ["model_name", "reason"], registry=reg)
    drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
    draft_toks = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
    accepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
    per_pos = c("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                ["position"])
    flops = c("vllm:estimated_flops_per_gpu_total", "Estimated number of floating point operations per GPU "
              "(for Model Flops Utilization calculations).")
    rbytes = c("vllm:estimated_read_bytes_per_gpu_total", "Estimated number of bytes read from memory per "
               "GPU (for Model Bandwidth Utilization calculations).")
    wbytes = c("vllm:estimated_write_bytes_per_gpu_total", "Estimated number of bytes written to memory per "
               "GPU (for Model Bandwidth Utilization calculations).")
    tok_buckets = build_1_2_5(max_model_len)
    h_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets)
    h_gen = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets)
    h_iter = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
               ITERATION_BUCKETS)
    h_maxgen = h("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested "
                 "generation tokens.", tok_buckets)
    h_n = h("vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20])
    h_maxtok = h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                 tok_buckets)
    h_preempt = h("vllm:request_num_preemptions", "Number of preemptions per request.",
                  [1, 2, 3, 4, 5, 10, 20])
    h_kvcomp = h("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during "
                 "prefill (excluding cached tokens).", tok_buckets)
    h_ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
               TTFT_BUCKETS)
    h_itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
    h_tpot = h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per "
               "request.", ITL_BUCKETS)
    h_e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              LATENCY_BUCKETS)
    h_queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                LATENCY_BUCKETS)
    h_inf = h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
              LATENCY_BUCKETS)
    h_pre = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
              LATENCY_BUCKETS)
    h_dec = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
              LATENCY_BUCKETS)
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 ["block_size", "cache_dtype", "calculate_kv_scales", "enable_prefix_caching", "engine",
                  "gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks", "prefix_caching_hash_algo",
                  "sliding_window", "swap_space"], registry=reg)
    info.labels("16", "auto", "False", "True", "0", "0.9", "None", "48231", "sha256", "None", "4").set(1)
    # --enable-lora --max-loras 4 on a long-running server: lora_requests_info gets a new label set for every
    # distinct (running, waiting) adapter combination and never drops old ones, which is what makes real
    # multi-adapter /metrics bodies this long. Value = set_to_current_time().
    lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                 ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg)
    adapters = [f"support-{i}" for i in range(6)] + [f"sql-{i}" for i in range(6)]
    seen: set[tuple[str, str]] = set()
    while len(seen) < 1745:
        running_set = sorted(rng.sample(adapters, rng.randint(0, 4)))
        waiting_set = sorted(rng.sample(adapters, rng.randint(0, 3)))
        seen.add((",".join(waiting_set), ",".join(running_set)))
    for waiting_l, running_l in sorted(seen):
        lora.labels("4", waiting_l, running_l).set(1.7960e9 + rng.random() * 86400)

    running.labels(*lv).set(7)
    waiting.labels(*lv).set(3)
    by_reason.labels(*lv, "capacity").set(2)
    by_reason.labels(*lv, "deferred").set(1)
    for state, v in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
        sleep.labels(*lv, state).set(v)
    kv.labels(*lv).set(0.4375)

    n_req = 1800
    ttfts, itls, reasons = [], [], {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
    # vllm:prompt_tokens counts every prompt token, cache hits included (as in the real 0.32 capture);
    # by_source{local_compute} the computed ones.
    tot_prompt = tot_computed = tot_gen = tot_q = tot_hit = 0
    for _ in range(n_req):
        p = rng.randint(20, 6000)
        hit = (p // 16) * 16 if rng.random() < 0.3 else 0
        out = rng.randint(1, 1500)
        tot_prompt += p
        tot_computed += p - hit
        tot_gen += out
        tot_q += p
        tot_hit += hit
        ttfts.append(rng.lognormvariate(-2.0, 1.0))
        itls.extend(rng.lognormvariate(-3.6, 0.4) for _ in range(8))
        r = rng.choices(list(reasons), weights=[70, 25, 3, 1, 1])[0]
        reasons[r] += 1
        h_prompt.labels(*lv).observe(p)
        h_gen.labels(*lv).observe(out)
        h_maxgen.labels(*lv).observe(out)
        h_n.labels(*lv).observe(1)
        h_maxtok.labels(*lv).observe(2048)
        h_preempt.labels(*lv).observe(0)
        h_kvcomp.labels(*lv).observe(p - hit)
        h_tpot.labels(*lv).observe(rng.lognormvariate(-3.6, 0.3))
        for hist in (h_e2e, h_queue, h_inf, h_pre, h_dec):
            hist.labels(*lv).observe(rng.lognormvariate(0.5, 1.0))
        h_iter.labels(*lv).observe(rng.randint(1, 8192))
    for v in ttfts:
        h_ttft.labels(*lv).observe(v)
    for v in itls:
        h_itl.labels(*lv).observe(v)
    prompt.labels(*lv).inc(tot_prompt)
    gen.labels(*lv).inc(tot_gen)
    prefix_q.labels(*lv).inc(tot_q)
    prefix_h.labels(*lv).inc(tot_hit)
    cached.labels(*lv).inc(tot_hit)
    ext_q.labels(*lv).inc(0)
    ext_h.labels(*lv).inc(0)
    mm_q.labels(*lv).inc(0)
    mm_h.labels(*lv).inc(0)
    preempt.labels(*lv).inc(4)
    sources = (("local_compute", tot_computed), ("local_cache_hit", tot_hit), ("external_kv_transfer", 0))
    for src, v in sources:
        by_source.labels(*lv, src).inc(v)
    for src, v in (("device", tot_hit), ("host", 0), ("p2p", 0), ("disk", 0), ("external_unspecified", 0)):
        cached_by.labels(*lv, src).inc(v)
    for reason, v in reasons.items():
        success.labels(*lv, reason).inc(v)
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        rejections.labels(model, reason).inc(0)
    k = 3  # num_speculative_tokens
    n_drafts = 52000
    acc_pos = [41000, 30500, 21800]
    drafts.labels(*lv).inc(n_drafts)
    draft_toks.labels(*lv).inc(n_drafts * k)
    accepted.labels(*lv).inc(sum(acc_pos))
    for pos, v in enumerate(acc_pos):
        per_pos.labels(*lv, str(pos)).inc(v)
    for m in (flops, rbytes, wbytes):
        m.labels(*lv).inc(0)

    expected = {
        "dialect": "vllm", "running": 7, "waiting": 3, "kv_cache_usage": 0.4375,
        "prompt_tokens_processed_total": tot_prompt, "prompt_tokens_computed_total": tot_computed,
        "prompt_tokens_cached_total": tot_hit, "generation_tokens_total": tot_gen,
        "prefix_cache_queries_total": tot_q, "prefix_cache_hits_total": tot_hit,
        "spec_drafts_total": n_drafts, "spec_draft_tokens_total": n_drafts * k,
        "spec_accepted_tokens_total": sum(acc_pos), "requests_finished_total": n_req,
        "ttft_buckets": cumulative(TTFT_BUCKETS, ttfts), "itl_buckets": cumulative(ITL_BUCKETS, itls),
    }
    return generate_latest(reg), expected


def vllm_old() -> tuple[bytes, dict]:
    """0.8-era V1 names (loggers.py before the 0.9 renames): gpu_cache_usage_perc, gpu_prefix_cache_*,
    time_per_output_token_seconds; no spec decode; labels model_name + engine."""
    rng = random.Random(8)
    reg = CollectorRegistry()
    process_metrics(reg)
    http_metrics(reg, rng, VLLM_HANDLERS[:8])
    model = "meta-llama/Llama-3.1-8B-Instruct"
    lv = (model, "0")
    ln = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ln,
                    registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ln,
                    registry=reg)
    usage = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", ln,
                  registry=reg)
    q = Counter("vllm:gpu_prefix_cache_queries", "GPU prefix cache queries, in terms of number of queried "
                "blocks.", ln, registry=reg)
    hits = Counter("vllm:gpu_prefix_cache_hits", "GPU prefix cache hits, in terms of number of cached "
                   "blocks.", ln, registry=reg)
    preempt = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", ln,
                      registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ln, registry=reg)
    gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ln, registry=reg)
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      [*ln, "finished_reason"], registry=reg)
    h_ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln,
                       buckets=TTFT_BUCKETS, registry=reg)
    h_tpot = Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                       ln, buckets=ITL_BUCKETS, registry=reg)
    h_e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", ln,
                      buckets=LATENCY_BUCKETS, registry=reg)
    running.labels(*lv).set(2)
    waiting.labels(*lv).set(0)
    usage.labels(*lv).set(0.125)
    ttfts = [rng.lognormvariate(-1.5, 0.8) for _ in range(300)]
    tpots = [rng.lognormvariate(-3.2, 0.3) for _ in range(3000)]
    for v in ttfts:
        h_ttft.labels(*lv).observe(v)
    for v in tpots:
        h_tpot.labels(*lv).observe(v)
    for _ in range(300):
        h_e2e.labels(*lv).observe(rng.lognormvariate(1, 1))
    q.labels(*lv).inc(9100)
    hits.labels(*lv).inc(2300)
    preempt.labels(*lv).inc(0)
    prompt.labels(*lv).inc(251234)
    gen.labels(*lv).inc(60210)
    for reason, v in (("stop", 280), ("length", 19), ("abort", 1)):
        success.labels(*lv, reason).inc(v)
    expected = {
        "dialect": "vllm", "running": 2, "waiting": 0, "kv_cache_usage": 0.125,
        # no cached-token counter, and gpu_prefix_cache_hits may count blocks: computed is unknown
        "prompt_tokens_processed_total": 251234, "prompt_tokens_computed_total": None,
        "prompt_tokens_cached_total": None, "generation_tokens_total": 60210,
        "prefix_cache_queries_total": 9100, "prefix_cache_hits_total": 2300,
        "spec_drafts_total": None, "spec_draft_tokens_total": None, "spec_accepted_tokens_total": None,
        "requests_finished_total": 300,
        "ttft_buckets": cumulative(TTFT_BUCKETS, ttfts), "itl_buckets": cumulative(ITL_BUCKETS, tpots),
    }
    return generate_latest(reg), expected


def sglang() -> tuple[bytes, dict]:
    """SGLang serves /metrics through MultiProcessCollector: no `_created` series, no process collectors."""
    from prometheus_client import disable_created_metrics, enable_created_metrics

    disable_created_metrics()
    try:
        return _sglang()
    finally:
        enable_created_metrics()


def _sglang() -> tuple[bytes, dict]:
    rng = random.Random(523)
    reg = CollectorRegistry()
    model = "Qwen/Qwen3-8B"
    sched_ln = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    sched_lv = (model, "unified", "0", "0", "0")
    tok_ln = ["model_name", "engine_type"]
    tok_lv = (model, "unified")

    def sg(name, doc, value):
        Gauge(name, doc, sched_ln, registry=reg).labels(*sched_lv).set(value)

    sg("sglang:num_running_reqs", "The number of running requests.", 12)
    sg("sglang:num_queue_reqs", "The number of requests in the waiting queue.", 5)
    sg("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)
    sg("sglang:gen_throughput", "The generation throughput (token/s).", 812.5)
    sg("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.28125)
    sg("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode.", 23110)
    sg("sglang:token_usage", "The token usage.", 0.3125)
    sg("sglang:full_token_usage", "The token usage for full attention layers.", 0.3125)
    sg("sglang:swa_token_usage", "The token usage for SWA layers.", 0)
    sg("sglang:mamba_usage", "The token usage for Mamba layers.", 0)
    sg("sglang:num_used_tokens", "The number of used tokens.", 40960)
    sg("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool.", 80000)
    sg("sglang:kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV cache pool.",
       10112)
    sg("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool.", 40960)
    sg("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", 131072)
    sg("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", 2.75)
    sg("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.", 0.5833)
    sg("sglang:spec_num_steps", "The number of speculative decoding steps.", 3)
    sg("sglang:spec_num_draft_tokens", "The number of speculative decoding draft tokens.", 4)
    sg("sglang:num_retracted_reqs", "The number of retracted requests.", 0)
    sg("sglang:utilization", "The utilization.", 0.91)

    prompt = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                     [*tok_ln, "is_streaming"], registry=reg)
    gen = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                  [*tok_ln, "is_streaming"], registry=reg)
    verify = Counter("sglang:spec_verify_calls_total", "Number of speculative decoding verification calls.",
                     tok_ln, registry=reg)
    cached = Counter("sglang:cached_tokens_total", "Number of cached prompt tokens by source "
                     "(device/host/storage).", [*tok_ln, "cache_source"], registry=reg)
    nreq = Counter("sglang:num_requests_total", "Number of requests processed.", [*tok_ln, "is_streaming"],
                   registry=reg)
    Counter("sglang:num_so_requests_total", "Number of structured output requests processed.", tok_ln,
            registry=reg).labels(*tok_lv).inc(0)
    Counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tok_ln,
            registry=reg).labels(*tok_lv).inc(2)
    h_prompt = Histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", tok_ln,
                         buckets=SGL_PROMPT_BUCKETS, registry=reg)
    h_ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       [*tok_ln, "is_streaming"], buckets=SGL_TTFT_BUCKETS, registry=reg)
    h_itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                      tok_ln, buckets=SGL_ITL_BUCKETS, registry=reg)
    h_e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                      "seconds", [*tok_ln, "is_streaming"], buckets=SGL_E2E_BUCKETS, registry=reg)

    totals = {"prompt": 0, "gen": 0, "device": 0, "host": 0, "req": 0}
    ttfts, itls = [], []
    for i in range(400):
        streaming = "true" if i % 3 else "false"
        p, out = rng.randint(50, 8000), rng.randint(1, 1000)
        dev = (p // 2) if rng.random() < 0.4 else 0
        host = 64 if dev and rng.random() < 0.2 else 0
        prompt.labels(*tok_lv, streaming).inc(p)
        gen.labels(*tok_lv, streaming).inc(out)
        nreq.labels(*tok_lv, streaming).inc()
        if dev:
            cached.labels(*tok_lv, "device").inc(dev)
        if host:
            cached.labels(*tok_lv, "host").inc(host)
        totals["prompt"] += p
        totals["gen"] += out
        totals["device"] += dev
        totals["host"] += host
        totals["req"] += 1
        t = rng.lognormvariate(-1.0, 0.7)
        ttfts.append(t)
        h_ttft.labels(*tok_lv, streaming).observe(t)
        h_prompt.labels(*tok_lv).observe(p)
        h_e2e.labels(*tok_lv, streaming).observe(rng.lognormvariate(1.5, 0.8))
        for _ in range(5):
            v = rng.lognormvariate(-4.2, 0.4)
            itls.append(v)
            h_itl.labels(*tok_lv).observe(v)
    verify.labels(*tok_lv).inc(15000)
    expected = {
        "dialect": "sglang", "running": 12, "waiting": 5, "kv_cache_usage": 0.3125,
        "prompt_tokens_processed_total": totals["prompt"], "prompt_tokens_computed_total": None,
        "prompt_tokens_cached_total": totals["device"] + totals["host"],
        "generation_tokens_total": totals["gen"],
        "prefix_cache_queries_total": totals["prompt"],
        "prefix_cache_hits_total": totals["device"] + totals["host"],
        "spec_drafts_total": 15000, "spec_draft_tokens_total": None, "spec_accepted_tokens_total": None,
        "requests_finished_total": totals["req"], "cache_hit_rate_gauge": 0.28125,
        "spec_accept_rate_gauge": 0.5833, "spec_accept_length_gauge": 2.75,
        "ttft_buckets": cumulative(SGL_TTFT_BUCKETS, ttfts), "itl_buckets": cumulative(SGL_ITL_BUCKETS, itls),
    }
    return generate_latest(reg), expected


def main() -> None:
    expected = {}
    for name, fn in (("vllm_0_33", vllm_033), ("vllm_old", vllm_old), ("sglang_0_5_23", sglang)):
        body, exp = fn()
        (HERE / f"{name}.txt").write_bytes(body)
        expected[name] = exp
        print(f"{name}.txt: {len(body.splitlines())} lines, {len(body)} bytes")
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
