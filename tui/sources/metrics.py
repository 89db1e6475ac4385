"""Parse one engine's Prometheus /metrics body into an EngineReading, whatever the engine's dialect.

Only the families enginetop shows are handed to prometheus_client's parser: a vLLM body is ~3,000 lines
and the pure-Python parser needs ~20 ms for all of it, far too slow for a 1 s refresh of several engines.
The pre-filter keeps every sample line and `# HELP`/`# TYPE` line of a wanted family (exact name match),
so those families are parsed exactly as the full body would be; a malformed line in a family we do not
read is not noticed, which is fine because nothing depends on it.

Aggregation across label sets (vLLM `engine`/`model_name`/`finished_reason`, SGLang `tp_rank`,
`is_streaming`, `cache_source`, ...): counters and count-like gauges are summed; fraction gauges
(KV-cache usage, SGLang's hit-rate and speculative gauges) are averaged, since summing two engines'
"0.5 full" would read "100% full". Histogram buckets are summed per upper bound.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tui.model.samples import Buckets, Dialect, EngineReading
from tui.sources.metrics_pieces import HEADER_PREFIXES, PieceCache, by_family


class MetricsFormatError(ValueError):
    """The /metrics body is not valid Prometheus text; the message says where."""


@dataclass(frozen=True, slots=True)
class _Source:
    field: str
    # "sum" | "mean" | "hist" | "pos" (a count per `position` label, position 0 first) | "hsum" / "hcount" (a
    # histogram's _sum / _count) | "by" (a count per value of the label named in `label`)
    kind: str
    families: tuple[str, ...]  # parser family names (counters without `_total`), first present wins
    label: tuple[str, str] | None = None  # only the series with this (label, value); "by": (label, "")


def _s(field: str, kind: str, *families: str, label: tuple[str, str] | None = None) -> _Source:
    return _Source(field, kind, families, label)


_SUFFIXES = {"hist": ("_bucket",), "hsum": ("_sum",), "hcount": ("_count",)}


# Family names as prometheus_client's parser reports them: a counter exposed as `x_total` is family `x`.
_DIALECTS: dict[Dialect, tuple[_Source, ...]] = {
    "llamacpp": (
        _s("running", "sum", "llamacpp:requests_processing"),
        _s("waiting", "sum", "llamacpp:requests_deferred"),
        # llama.cpp's prompt counter excludes cached tokens: it is the computed count (processed = + cached)
        _s("prompt_tokens_computed_total", "sum", "llamacpp:prompt_tokens"),
        _s("prompt_tokens_cached_total", "sum", "llamacpp:prompt_tokens_cached"),
        _s("generation_tokens_total", "sum", "llamacpp:tokens_predicted"),
        _s("generation_seconds_total", "sum", "llamacpp:tokens_predicted_seconds"),
        _s("spec_drafts_total", "sum", "llamacpp:spec_decode_num_drafts"),
        _s("spec_draft_tokens_total", "sum", "llamacpp:spec_decode_num_draft_tokens"),
        _s("spec_accepted_tokens_total", "sum", "llamacpp:spec_decode_num_accepted_tokens"),
        _s("spec_accepted_per_pos", "pos", "llamacpp:spec_decode_num_accepted_tokens_per_pos"),
    ),
    "vllm": (
        _s("running", "sum", "vllm:num_requests_running"),
        _s("waiting", "sum", "vllm:num_requests_waiting"),
        # gpu_* are the pre-0.9 names (removed by 0.11); 0.9/0.10 expose both, the new one wins.
        _s("kv_cache_usage", "mean", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        # prompt_tokens counts every prompt token, cache hits included (the real 0.32 capture: 1155 =
        # local_compute 643 + local_cache_hit 512); by_source{local_compute} is what was really prefilled.
        _s("prompt_tokens_processed_total", "sum", "vllm:prompt_tokens"),
        _s("prompt_tokens_computed_total", "sum", "vllm:prompt_tokens_by_source",
           label=("source", "local_compute")),
        _s("prompt_tokens_cached_total", "sum", "vllm:prompt_tokens_cached"),
        _s("generation_tokens_total", "sum", "vllm:generation_tokens"),
        _s("prefix_cache_queries_total", "sum", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        _s("prefix_cache_hits_total", "sum", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        _s("spec_drafts_total", "sum", "vllm:spec_decode_num_drafts"),
        _s("spec_draft_tokens_total", "sum", "vllm:spec_decode_num_draft_tokens"),
        _s("spec_accepted_tokens_total", "sum", "vllm:spec_decode_num_accepted_tokens"),
        _s("spec_accepted_per_pos", "pos", "vllm:spec_decode_num_accepted_tokens_per_pos"),
        _s("requests_finished_total", "sum", "vllm:request_success"),
        _s("ttft_buckets", "hist", "vllm:time_to_first_token_seconds"),
        # time_per_output_token_seconds: same quantity and buckets before the 0.11 rename.
        _s("itl_buckets", "hist", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        _s("queue_buckets", "hist", "vllm:request_queue_time_seconds"),
        _s("prefill_buckets", "hist", "vllm:request_prefill_time_seconds"),
        _s("decode_buckets", "hist", "vllm:request_decode_time_seconds"),
        _s("e2e_buckets", "hist", "vllm:e2e_request_latency_seconds"),
        _s("prompt_len_buckets", "hist", "vllm:request_prompt_tokens"),
        _s("prompt_len_sum", "hsum", "vllm:request_prompt_tokens"),
        _s("gen_len_buckets", "hist", "vllm:request_generation_tokens"),
        _s("gen_len_sum", "hsum", "vllm:request_generation_tokens"),
        _s("finish_reasons", "by", "vllm:request_success", label=("finished_reason", "")),
        _s("preemptions_total", "sum", "vllm:num_preemptions"),
        _s("iteration_tokens_sum", "hsum", "vllm:iteration_tokens_total"),
        _s("iteration_steps_total", "hcount", "vllm:iteration_tokens_total"),
    ),
    "sglang": (
        _s("running", "sum", "sglang:num_running_reqs"),
        _s("waiting", "sum", "sglang:num_queue_reqs"),
        _s("kv_cache_usage", "mean", "sglang:token_usage"),
        # prompt_tokens counts the whole prompt, cached part included (both are added per finished
        # request; metrics_collector computes prompt - cached), so it is also the prefix-cache queries.
        _s("prompt_tokens_processed_total", "sum", "sglang:prompt_tokens"),
        _s("prompt_tokens_cached_total", "sum", "sglang:cached_tokens"),
        _s("generation_tokens_total", "sum", "sglang:generation_tokens"),
        _s("spec_drafts_total", "sum", "sglang:spec_verify_calls"),  # verification steps = drafts
        _s("requests_finished_total", "sum", "sglang:num_requests"),  # counted when a request finishes
        _s("cache_hit_rate_gauge", "mean", "sglang:cache_hit_rate"),
        _s("spec_accept_rate_gauge", "mean", "sglang:spec_accept_rate"),
        _s("spec_accept_length_gauge", "mean", "sglang:spec_accept_length"),
        _s("ttft_buckets", "hist", "sglang:time_to_first_token_seconds"),
        _s("itl_buckets", "hist", "sglang:inter_token_latency_seconds"),
        _s("queue_buckets", "hist", "sglang:queue_time_seconds"),
        _s("e2e_buckets", "hist", "sglang:e2e_request_latency_seconds"),
        _s("prompt_len_buckets", "hist", "sglang:prompt_tokens_histogram"),
        _s("prompt_len_sum", "hsum", "sglang:prompt_tokens_histogram"),
        _s("gen_len_buckets", "hist", "sglang:generation_tokens_histogram"),
        _s("gen_len_sum", "hsum", "sglang:generation_tokens_histogram"),
        _s("preemptions_total", "sum", "sglang:num_retracted_requests"),
    ),
}

_FAMILY_TO_SOURCE: dict[str, _Source] = {
    fam: src for sources in _DIALECTS.values() for src in sources for fam in src.families
}
# Every name a line of a wanted family can carry: the family, `_total` (counter samples and their TYPE
# line), and the histogram sample suffixes. `_created` is deliberately absent.
_WANTED_NAMES: frozenset[str] = frozenset(
    fam + suffix for fam in _FAMILY_TO_SOURCE for suffix in ("", "_total", "_bucket", "_sum", "_count")
)


@functools.cache
def names_query(dialect: Dialect) -> str:
    """The query that asks prometheus_client's exposition (`name[]=`, one per sample name) for only the
    series this dialect is read from: the bare name and `_total` of a count or gauge, `_bucket` of a
    histogram (its `_sum`/`_count` are not read)."""
    names = dict.fromkeys(fam + suffix for src in _DIALECTS.get(dialect, ()) for fam in src.families
                          for suffix in _SUFFIXES.get(src.kind, ("", "_total")))
    return urlencode([("name[]", name) for name in names])


def detect_dialect(text: str) -> Dialect:
    """From metric names only: a name starts a line (sample) or follows `# TYPE ` (header)."""
    for dialect in ("llamacpp", "vllm", "sglang"):
        prefix = dialect + ":"
        if text.startswith(prefix) or f"\n{prefix}" in text or f"# TYPE {prefix}" in text:
            return dialect
    return "unknown"


def select_lines(text: str) -> list[str]:
    """The lines of the families we read, in body order (see module docstring)."""
    keep: list[str] = []
    wanted = _WANTED_NAMES
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            if line.startswith(HEADER_PREFIXES):
                parts = line.split(" ", 3)
                if len(parts) > 2 and parts[2] in wanted:
                    keep.append(line)
            continue
        # A sample's name ends at `{` (labels) or at the first blank (value).
        head = line.partition("{")[0].split(None, 1)
        if head and head[0] in wanted:
            keep.append(line)
    return keep


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def _scalar(samples: Iterable, names: tuple[str, str], kind: str,
            label: tuple[str, str] | None = None) -> float | None:
    values = [float(s.value) for s in samples
              if s.name in names and (label is None or s.labels.get(label[0]) == label[1])]
    if not values or not all(_finite(v) for v in values):
        return None  # absent, or a NaN/Inf somewhere: a partial sum would fake a counter reset later
    total = math.fsum(values)
    return total / len(values) if kind == "mean" else total


def _buckets(family: str, samples: Iterable) -> Buckets | None:
    by_bound: dict[float, float] = {}
    bucket_name = family + "_bucket"
    for s in samples:
        if s.name != bucket_name:
            continue
        le = s.labels.get("le")
        try:
            bound = float(le) if le is not None else math.nan
        except ValueError:
            bound = math.nan
        if math.isnan(bound):
            raise MetricsFormatError(f"malformed /metrics: {bucket_name} has a bucket with le={le!r}")
        value = float(s.value)
        if not _finite(value):
            return None
        by_bound[bound] = by_bound.get(bound, 0.0) + value
    if not by_bound:
        return None
    return tuple(sorted(by_bound.items()))


def _positions(samples: Iterable, names: tuple[str, str]) -> tuple[float, ...] | None:
    """A counter per draft position (label `position`, summed over the others), position 0 first; positions
    never reported read 0 (an engine that drafted to depth 4 reports 0..3)."""
    by_pos: dict[int, float] = {}
    for s in samples:
        if s.name not in names:
            continue
        try:
            pos = int(s.labels.get("position", ""))
        except ValueError:
            continue
        value = float(s.value)
        if not _finite(value) or pos < 0 or pos > 64:
            return None
        by_pos[pos] = by_pos.get(pos, 0.0) + value
    if not by_pos:
        return None
    return tuple(by_pos.get(i, 0.0) for i in range(max(by_pos) + 1))


def _by_label(samples: Iterable, names: tuple[str, str], label: str) -> tuple[tuple[str, float], ...] | None:
    """A counter per value of `label` (summed over the others), in the label's order of names."""
    by: dict[str, float] = {}
    for s in samples:
        if s.name in names and label in s.labels:
            value = float(s.value)
            if not _finite(value):
                return None
            by[s.labels[label]] = by.get(s.labels[label], 0.0) + value
    return tuple(sorted(by.items())) if by else None


def parse_reading(text: str) -> EngineReading:
    """Parse a /metrics body (classic Prometheus text). Raises MetricsFormatError for malformed input."""
    return _parse_selected(detect_dialect(text), "\n".join(select_lines(text)) + "\n")


# The same lines always parse to the same (immutable) reading, and an engine that is idle sends the same lines
# poll after poll: the parser is the costly part of a poll, so a few recent texts are remembered, and under
# traffic each family's own lines and shapes too (tui.sources.metrics_pieces).
@functools.lru_cache(maxsize=8)  # an idle engine's text, for each of a few engines
def _parse_selected(dialect: Dialect, selected: str) -> EngineReading:
    sources = {src.field: src for src in _DIALECTS.get(dialect, ())}
    samples: dict[str, list] = {}  # wanted family -> samples (untyped lines can split one family in several)
    histograms: set[str] = set()
    for fam in _families(selected):
        name = fam.name
        if fam.type == "unknown" and name.endswith("_total"):
            name = name[: -len("_total")]  # an untyped counter line: same family as a typed one
        src = _FAMILY_TO_SOURCE.get(name)
        if src is None or sources.get(src.field) is not src:
            continue
        samples.setdefault(name, []).extend(fam.samples)
        if fam.type == "histogram":
            histograms.add(name)

    values: dict[str, Any] = {}  # EngineReading fields by name: float | None, bucket tuples
    for field, src in sources.items():
        for fam_name in src.families:  # preference order: the first family present wins
            if fam_name not in samples:
                continue
            if src.kind == "hist":
                values[field] = _buckets(fam_name, samples[fam_name]) if fam_name in histograms else None
            elif src.kind in ("hsum", "hcount"):
                suffix = _SUFFIXES[src.kind][0]
                values[field] = _scalar(samples[fam_name], (fam_name + suffix, fam_name + suffix), "sum") \
                    if fam_name in histograms else None
            elif src.kind == "by":
                values[field] = _by_label(samples[fam_name], (fam_name, fam_name + "_total"),
                                          src.label[0] if src.label else "")
            elif src.kind == "pos":
                values[field] = _positions(samples[fam_name], (fam_name, fam_name + "_total"))
            else:
                names = (fam_name, fam_name + "_total")
                values[field] = _scalar(samples[fam_name], names, src.kind, src.label)
            break
    return _finish(dialect, values, set(samples))


def _families(selected: str) -> list[Metric]:
    """The families of the selected lines, each family's lines parsed once for as long as they stay the same;
    a malformed body raises MetricsFormatError saying where, as the parser meets it in the whole text."""
    try:
        return [fam for family, piece in by_family(selected) for fam in _parsed(family, piece)]
    except (ValueError, OverflowError):  # OverflowError: a timestamp past a float
        pass  # said below, from the whole text: which family, after which
    families = iter(text_string_to_metric_families(selected))
    out: list[Metric] = []
    last = "the start"
    while True:
        try:
            fam = next(families)
        except StopIteration:
            return out
        except (ValueError, OverflowError) as exc:  # the parser is lazy: it raises mid-iteration
            detail = str(exc) or "unparseable line"
            raise MetricsFormatError(f"malformed /metrics at family {len(out) + 1} (after {last}): "
                                     f"{detail}") from exc
        out.append(fam)
        last = fam.name[: -len("_total")] if fam.type == "unknown" and fam.name.endswith("_total") \
            else fam.name


_parsed = PieceCache()


def _finish(dialect: Dialect, values: dict[str, Any], present: set[str]) -> EngineReading:
    if dialect == "llamacpp":
        # Every prompt token is either computed or reused from the cache: both are the cache lookups.
        computed = values.get("prompt_tokens_computed_total")
        cached = values.get("prompt_tokens_cached_total")
        if computed is not None and cached is not None:
            values["prompt_tokens_processed_total"] = computed + cached
            values["prefix_cache_queries_total"] = values["prompt_tokens_processed_total"]
            values["prefix_cache_hits_total"] = cached
    elif dialect == "vllm":
        if values.get("prompt_tokens_cached_total") is None and "vllm:prefix_cache_hits" in present:
            # Before prompt_tokens_cached (0.1x) the prefix-cache hits, in tokens under this name, are the
            # cached prompt tokens. The 0.8-era gpu_prefix_cache_hits may count blocks: not used.
            values["prompt_tokens_cached_total"] = values.get("prefix_cache_hits_total")
    elif dialect == "sglang":
        prompt = values.get("prompt_tokens_processed_total")
        values["prefix_cache_queries_total"] = prompt
        if values.get("prompt_tokens_cached_total") is None:
            # cached_tokens_total gets a series only at the first cache hit; a declared family with no
            # series yet means zero hits. No family at all (older SGLang) stays None: fall back to the gauge.
            declared = "sglang:cached_tokens" in present
            values["prompt_tokens_cached_total"] = 0.0 if declared and prompt is not None else None
        values["prefix_cache_hits_total"] = values["prompt_tokens_cached_total"]
        if values.get("spec_accept_length_gauge") == 0:
            # SGLang reports 0 for both gauges when speculative decoding is off (length is >= 1 when on).
            values["spec_accept_length_gauge"] = None
            values["spec_accept_rate_gauge"] = None
    return EngineReading(dialect=dialect, **values)


def metric_names(dialect: Dialect) -> dict[str, tuple[str, tuple[str, str] | None]]:
    """The engine's own family name (and label) each EngineReading field was read from: a recording is
    exported under the names the engine exposes (the first family of each, the current name)."""
    return {src.field: (src.families[0], src.label) for src in _DIALECTS.get(dialect, ())}
