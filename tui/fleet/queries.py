"""The PromQL of every fleet figure: one query per figure for the whole fleet, never one per engine.

Each expression answers for every engine at once, grouped by the labels that tell engines apart
(job, instance, and vLLM's / SGLang's model_name and vLLM's data-parallel `engine`; llama.cpp has none of
its own, so its series group by job and instance only and the other two read as ""). The three dialects
are joined with `or` (their series never share a label set: one instance speaks one dialect), and where
vLLM renamed a metric the new name comes first, so an engine exposing both (0.9, 0.10) is counted once.
Ratios keep the `(denominator > 0)` guard, so no traffic gives no sample (n/a), never NaN.

`match` is the user's selector without braces, e.g. `job=~"vllm.*"`; it is put inside every selector.
"""

from __future__ import annotations

from dataclasses import dataclass

KEY_LABELS = ("job", "instance", "model_name", "engine")
# Kubernetes service discovery's target labels ride along (empty elsewhere): they tell which pod an engine is,
# so its GPUs can be found by pod where dcgm-exporter labels GPUs with the pod using them (tui.fleet.match)
K8S_LABELS = ("namespace", "pod")
BY = ", ".join(KEY_LABELS + K8S_LABELS)


def strip_match(match: str | None) -> str:
    """`{job=~"x"}` or `job=~"x"` -> `job=~"x"`; the matchers go inside every selector."""
    text = (match or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    return text


@dataclass(frozen=True, slots=True)
class Windows:
    rate: str = "1m"  # counters' rates, as Grafana's $__rate_interval: at least 4 scrape intervals
    latency: str = "5m"  # histogram quantiles want more observations than a rate does


def window(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


class FleetQueries:
    def __init__(self, match: str | None = None, windows: Windows | None = None) -> None:
        self.match = strip_match(match)
        self.windows = windows or Windows()

    def s(self, metric: str, extra: str = "") -> str:
        """A selector with the user's matchers (and `extra` ones)."""
        inner = ", ".join(m for m in (self.match, extra) if m)
        return f"{metric}{{{inner}}}" if inner else metric

    def _rate(self, metric: str, extra: str = "", w: str | None = None) -> str:
        return f"sum by ({BY}) (rate({self.s(metric, extra)}[{w or self.windows.rate}]))"

    def _sum(self, metric: str, extra: str = "") -> str:
        return f"sum by ({BY}) ({self.s(metric, extra)})"

    def _quantile(self, q: float, *buckets: str) -> str:
        w = self.windows.latency
        inner = " or ".join(f"sum by (le, {BY}) (rate({self.s(b)}[{w}]))" for b in buckets)
        return f"histogram_quantile({q:g}, {inner})"

    def discovery(self) -> str:
        """Every engine seen in the last 15 minutes, with its dialect: one that went down stays listed."""
        def one(metric: str, dialect: str) -> str:
            return (f'label_replace(group by ({BY}) (last_over_time({self.s(metric)}[15m])), '
                    f'"dialect", "{dialect}", "", "")')
        return " or ".join((one("vllm:num_requests_running", "vllm"),
                            one("sglang:num_running_reqs", "sglang"),
                            one("llamacpp:requests_processing", "llamacpp")))

    def up(self) -> str:
        # `up` carries only the scrape labels: a model_name matcher would hide every target, so only
        # job/instance matchers would apply; up is one series per target, so the whole set is cheap.
        return "up"

    def figures(self) -> dict[str, str]:
        r, sm, q = self._rate, self._sum, self._quantile
        itl = ("vllm:inter_token_latency_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
               "sglang:inter_token_latency_seconds_bucket")
        llama_prompt = r("llamacpp:prompt_tokens_total")
        llama_cached = r("llamacpp:prompt_tokens_cached_total")
        return {
            "gen_tps": " or ".join((r("vllm:generation_tokens_total"), r("sglang:generation_tokens_total"),
                                    r("llamacpp:tokens_predicted_total"))),
            # every prompt token, cache hits included (llama.cpp counts the two apart)
            "prompt_processed_tps": " or ".join((
                r("vllm:prompt_tokens_total"), r("sglang:prompt_tokens_total"),
                f"({llama_prompt} + {llama_cached})", llama_prompt)),
            # prompt tokens really prefilled (cache hits excluded)
            "prompt_computed_tps": " or ".join((
                r("vllm:prompt_tokens_by_source_total", 'source="local_compute"'),
                f'({r("sglang:prompt_tokens_total")} - {r("sglang:cached_tokens_total")})',
                llama_prompt)),
            "prefix_cache_hit_rate": " or ".join((
                f'{r("vllm:prefix_cache_hits_total", w=self.windows.latency)} / '
                f'({r("vllm:prefix_cache_queries_total", w=self.windows.latency)} > 0)',
                f'{r("vllm:gpu_prefix_cache_hits_total", w=self.windows.latency)} / '
                f'({r("vllm:gpu_prefix_cache_queries_total", w=self.windows.latency)} > 0)',
                f'{r("sglang:cached_tokens_total", w=self.windows.latency)} / '
                f'({r("sglang:prompt_tokens_total", w=self.windows.latency)} > 0)',
                f"avg by ({BY}) ({self.s('sglang:cache_hit_rate')})",
                f'{r("llamacpp:prompt_tokens_cached_total", w=self.windows.latency)} / '
                f'(({r("llamacpp:prompt_tokens_total", w=self.windows.latency)} + '
                f'{r("llamacpp:prompt_tokens_cached_total", w=self.windows.latency)}) > 0)')),
            "ttft_p50_s": q(0.5, "vllm:time_to_first_token_seconds_bucket",
                            "sglang:time_to_first_token_seconds_bucket"),
            "ttft_p90_s": q(0.9, "vllm:time_to_first_token_seconds_bucket",
                            "sglang:time_to_first_token_seconds_bucket"),
            # time_per_output_token_seconds: the same histogram before vLLM 0.11's rename
            "itl_p50_s": q(0.5, *itl),
            "itl_p90_s": q(0.9, *itl),
            "running": " or ".join((sm("vllm:num_requests_running"), sm("sglang:num_running_reqs"),
                                    sm("llamacpp:requests_processing"))),
            "waiting": " or ".join((sm("vllm:num_requests_waiting"), sm("sglang:num_queue_reqs"),
                                    sm("llamacpp:requests_deferred"))),
            # a fraction: averaged over label sets, never summed (two half-full caches are not one full)
            "kv_cache_usage": " or ".join((
                f"avg by ({BY}) ({self.s('vllm:kv_cache_usage_perc')})",
                f"avg by ({BY}) ({self.s('vllm:gpu_cache_usage_perc')})",
                f"avg by ({BY}) ({self.s('sglang:token_usage')})")),
            # cumulative counters, for the snapshot and as a direct check against the engines' own /metrics
            "generation_tokens_total": " or ".join((
                sm("vllm:generation_tokens_total"), sm("sglang:generation_tokens_total"),
                sm("llamacpp:tokens_predicted_total"))),
            "prompt_tokens_processed_total": " or ".join((
                sm("vllm:prompt_tokens_total"), sm("sglang:prompt_tokens_total"),
                f'({sm("llamacpp:prompt_tokens_total")} + {sm("llamacpp:prompt_tokens_cached_total")})',
                sm("llamacpp:prompt_tokens_total"))),
        }

    def engine_range(self, figure: str, labels: dict[str, str]) -> str:
        """One engine's figure over time (the column view's back-fill): the fleet expression, narrowed."""
        narrowed = FleetQueries(", ".join(m for m in (self.match, _exact(labels)) if m), self.windows)
        return narrowed.figures()[figure]


def _exact(labels: dict[str, str]) -> str:
    return ", ".join(f'{k}="{escape(labels[k])}"' for k in ("job", "instance") if labels.get(k)) + "".join(
        f', {k}="{escape(labels[k])}"' for k in ("model_name", "engine") if labels.get(k))


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
