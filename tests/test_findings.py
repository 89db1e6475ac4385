"""Configuration as engines publish it, and the findings judged from it (no engine here: what they answer, as
read from the real ones, and real processes for the killed start). The real engines are in
test_config_llama.py and test_config_vllm.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path

import pytest
from waiting import until

from tests.shown import show
from tui.compare.analysis import _spec_of, arm_findings
from tui.compare.report import render_html
from tui.exporter.metrics import ProbeMetrics
from tui.findings.facts import refused_for_length, refused_tokens, spec_between, summarize
from tui.findings.judge import DRAFT_COST, MIN_PREFIX_REQUESTS, MIN_SPEC_DRAFTS, judge
from tui.findings.prefix import SharedPrefixes, shared_by_ids
from tui.findings.tracker import Since
from tui.html.config import config_table
from tui.lifecycle.memory import oom_kills
from tui.lifecycle.profiles import Profile
from tui.lifecycle.switch import EngineManager
from tui.model.config import EngineConfig
from tui.model.counters import went_back
from tui.model.findings import Evidence, RequestFacts, SpecFacts, StartMemory
from tui.model.samples import EngineReading, EngineStats
from tui.model.slots import SlotsReading, SlotState
from tui.sources.config import (
    cache_config_labels,
    config_from_json,
    config_json,
    llama_config,
    mask_argv,
    sglang_config,
    vllm_config,
)

DATA = Path(__file__).parent / "data"
GIB = 2**30
LLAMA = "/usr/bin/llama-server"


def slots(n: int, n_ctx: int, speculative: bool = False) -> SlotsReading:
    return SlotsReading(tuple(SlotState(i, n_ctx, False, speculative) for i in range(n)))


PROPS_4x1024 = {
    "default_generation_settings": {"n_ctx": 1024, "params": {"speculative.types": "none"}},
    "total_slots": 4,
    "model_path": "/m/gemma.gguf",
    "build_info": "b0-unknown",
    "modalities": {"vision": False, "audio": False},
}


# ---- llama-server --------------------------------------------------------------------------------------
def test_llama_slots_that_split_the_context_are_read_from_props_and_argv() -> None:
    argv = [LLAMA, "-m", "/m/gemma.gguf", "-c", "4096", "--parallel", "4", "--metrics"]
    c = llama_config(PROPS_4x1024, slots(4, 1024), (argv, {}), [], pid=7)
    assert (c.context_tokens, c.kv_pool_tokens, c.slots, c.kv_unified) == (1024, 4096, 4, False)
    assert c.split_slots and c.spec_type == "off" and c.prefix_caching is True and c.kv_cache_dtype == "f16"
    assert c.summary() == (
        "context 1,024 of a 4,096-token KV pool · prefix cache on (default) · KV f16 (default) · spec off · "
        "4 slots × 1,024 split"
    )
    assert c.sources == ("/props", "/slots", "argv (PID 7)") and c.lacks == ()


@pytest.mark.parametrize(
    ("argv", "env", "unified"),
    [
        ([LLAMA, "-c", "8192"], {}, True),  # -np left at auto: 4 slots sharing one pool
        ([LLAMA, "-c", "8192", "-np", "4", "--kv-unified"], {}, True),
        ([LLAMA, "-c", "8192", "-np", "4"], {}, False),
        ([LLAMA, "-c", "8192", "-np", "4", "-kvu"], {}, True),
        ([LLAMA, "-c", "8192"], {"LLAMA_ARG_N_PARALLEL": "4"}, False),  # the environment twin of -np
        ([LLAMA, "-c", "8192", "-np", "4"], {"LLAMA_ARG_KV_UNIFIED": "1"}, True),
    ],
)
def test_llama_kv_unified_follows_the_servers_own_rule(
    argv: list[str], env: dict[str, str], unified: bool
) -> None:
    assert llama_config(PROPS_4x1024, None, (argv, env), []).kv_unified is unified


def test_llama_speculative_settings_from_the_argv() -> None:
    argv = [
        LLAMA,
        "-md",
        "/m/draft.gguf",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "4",
        "--spec-synth-rates",
        "0.9,0.6,0.3,0.1",
        "--spec-draft-p-min",
        "0",
        "-ctk",
        "q8_0",
        "-ctv",
        "q4_0",
    ]
    c = llama_config(PROPS_4x1024, slots(4, 4096, speculative=True), (argv, {}), [])
    assert (c.spec_type, c.spec_n_max, c.spec_p_min, c.spec_draft_model) == (
        "draft-simple",
        4,
        0.0,
        "draft.gguf",
    )
    assert c.spec_synthetic == "rates 0.9,0.6,0.3,0.1" and c.kv_cache_dtype == "K q8_0 / V q4_0"
    assert "spec draft-simple n=4 p-min 0 (synthetic rates 0.9,0.6,0.3,0.1)" in c.summary()
    # a draft model without --spec-type drafts with draft-simple at the default depth
    c = llama_config(PROPS_4x1024, slots(4, 1024, speculative=True), ([LLAMA, "-md", "d.gguf"], {}), [])
    assert (c.spec_type, c.spec_n_max) == ("draft-simple", 3)


def test_every_secret_on_a_command_line_is_masked_and_a_key_files_path_is_shown() -> None:
    argv = [
        LLAMA,
        "--api-key",
        "sk-SECRET",
        "--api-key=sk-SECRET2",
        "--api_key",
        "sk-3",
        "--hf-token",
        "hf_X",
        "--api-key-file",
        "/etc/keys/llama",
        "--port",
        "8080",
    ]
    masked = mask_argv(argv)
    assert not any("SECRET" in a or a in ("sk-3", "hf_X") for a in masked)
    assert masked[1:5] == ("--api-key", "***", "--api-key=***", "--api_key")
    assert "/etc/keys/llama" in masked and masked[-1] == "8080"


def test_an_older_llama_server_shows_what_it_has_and_says_what_it_lacks() -> None:
    old = {"default_generation_settings": {"temperature": 0.8}, "model_path": "/m/old.gguf"}
    c = llama_config(old, None, "argv: the engine runs on another machine", [])
    assert c.context_tokens is None and c.slots is None and c.kv_unified is None and c.argv == ()
    assert any("n_ctx" in x for x in c.lacks) and any("total_slots" in x for x in c.lacks)
    assert "argv: the engine runs on another machine" in c.lacks
    assert c.summary() == ""  # nothing guessed: no context, no pool, no split
    # /slots alone still gives the slots and their context, named as the source
    c = llama_config(old, slots(2, 2048), "argv: no process", [])
    assert (c.slots, c.context_tokens, c.kv_unified) == (2, 2048, None) and "/slots" in c.sources
    assert c.summary() == "context 2,048 · spec off · 2 slots × 2,048"


# ---- vLLM and SGLang -----------------------------------------------------------------------------------
def test_vllm_cache_config_info_is_read_from_a_real_body() -> None:
    text = (DATA / "metrics" / "vllm_cpu_0.32_cache_config.txt").read_text()
    labels = cache_config_labels(text)
    assert labels is not None and labels["kv_cache_size_tokens"] == "524288"
    models = {"data": [{"id": "enginetop-tiny-llama", "max_model_len": 2048}]}
    c = vllm_config(labels, models, "0.32.0", "argv: no process", [], spec_counters=False)
    assert (c.context_tokens, c.kv_pool_tokens, c.prefix_caching, c.block_size) == (2048, 524288, False, 128)
    assert c.kv_max_concurrency == 256.0 and c.gpu_memory_utilization == 0.92 and c.spec_type == "off"
    assert c.summary().startswith("context 2,048 of a 524,288-token KV pool · prefix cache OFF · KV auto")
    assert dict(c.published)["engine"] == "0"
    # the JSON a result keeps, and back
    assert config_from_json(json.loads(json.dumps(config_json(c)))) == c


def test_a_vllm_without_cache_config_info_says_so() -> None:
    text = (DATA / "metrics" / "vllm_old.txt").read_text()
    assert cache_config_labels(text) is None
    c = vllm_config(None, {"data": [{"id": "m"}]}, None, "argv: the engine runs on another machine", [])
    assert c.kv_pool_tokens is None and c.prefix_caching is None and c.context_tokens is None
    assert any("cache_config_info" in x for x in c.lacks) and any("max_model_len" in x for x in c.lacks)


def test_vllm_speculative_config_from_its_argv() -> None:
    argv = [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3}',
        "--max-num-seqs",
        "8",
    ]
    c = vllm_config({}, None, None, (argv, {}), [], spec_counters=True)
    assert (c.spec_type, c.spec_n_max, c.slots) == ("ngram", 3, 8)


def test_sglang_server_info_is_read_field_by_field_and_its_keys_never_kept() -> None:
    # What SGLang answers (its server args and the scheduler's state): its own keys in clear among them
    info = {
        "api_key": "engine-K",
        "admin_api_key": "admin-K",
        "context_length": 32768,
        "disable_radix_cache": True,
        "kv_cache_dtype": "fp8_e5m2",
        "max_running_requests": 16,
        "speculative_algorithm": "EAGLE",
        "speculative_num_draft_tokens": 4,
        "version": "0.5.23",
        "internal_states": [{"api_key": "engine-K", "max_total_num_tokens": 94208}],
    }
    c = sglang_config(info, "argv: the engine runs on another machine", [])
    assert (c.context_tokens, c.kv_pool_tokens, c.prefix_caching, c.spec_type, c.spec_n_max) == (
        32768,
        94208,
        False,
        "EAGLE",
        4,
    )
    assert "engine-K" not in json.dumps(config_json(c)) and "admin-K" not in json.dumps(config_json(c))


# ---- the judges -------------------------------------------------------------------------------------------
VLLM_OFF = EngineConfig(
    "vLLM",
    0.0,
    context_tokens=32768,
    kv_pool_tokens=94208,
    prefix_caching=False,
    block_size=16,
    sources=("cache_config_info",),
)


def agent_turns(n: int, cached: int = 0) -> list[RequestFacts]:
    """An agent's turns: each prompt is the last one plus 555 tokens, all of them computed by the engine."""
    return [
        RequestFacts(
            True,
            555 * (i + 1),
            32,
            cached if i else 0,
            shared_tokens=555 * i,
            ttft_s=0.3 * (i + 1),
            engine_prompt_s=0.25 * (i + 1),
        )
        for i in range(n)
    ]


def test_prefix_cache_off_fires_with_the_shared_tokens_and_the_prefill_they_cost() -> None:
    facts = summarize(agent_turns(8))
    [f] = [f for f in judge(Evidence("vllm", VLLM_OFF, facts)) if f.id.startswith("prefix")]
    shared = sum(555 * i for i in range(8))
    assert f.id == "prefix-cache-off" and dict(f.figures)["shared_tokens"] == shared
    assert f"shared {shared:,} of {555 * 36:,} prompt tokens" in f.title and "0 served from cache" in f.title
    # the prefill those tokens cost: computed at the rate the engine prefilled them (555*36 tokens in 9 s)
    assert dict(f.figures)["prefill_s_lost"] == pytest.approx(shared / (555 * 36 / 9.0))
    assert "--enable-prefix-caching" in f.suggestion


def test_prefix_findings_never_fire_on_too_little_data_or_a_cache_that_serves() -> None:
    few = summarize(agent_turns(MIN_PREFIX_REQUESTS - 1))
    assert not [f for f in judge(Evidence("vllm", VLLM_OFF, few)) if f.id.startswith("prefix")]
    unknown = summarize([RequestFacts(True, 500, 10, 0) for _ in range(10)])  # sharing never learnt
    assert not [f for f in judge(Evidence("vllm", VLLM_OFF, unknown)) if f.id.startswith("prefix")]
    on = EngineConfig("vLLM", 0.0, prefix_caching=True)
    serving = summarize([RequestFacts(True, 555 * (i + 1), 32, 540 * i, 555 * i) for i in range(8)])
    assert not [f for f in judge(Evidence("vllm", on, serving)) if f.id.startswith("prefix")]
    evicting = summarize(agent_turns(8, cached=16))
    [f] = [f for f in judge(Evidence("vllm", on, evicting)) if f.id.startswith("prefix")]
    show("finding", f)
    assert f.id == "prefix-cache-missing"


def test_slots_that_split_the_context_are_explained_with_the_refusals() -> None:
    config = EngineConfig(
        "llama.cpp",
        0.0,
        context_tokens=1024,
        kv_pool_tokens=4096,
        slots=4,
        kv_unified=False,
        sources=("/props", "argv (PID 1)"),
    )
    words = "request (1524 tokens) exceeds the available context size (1024 tokens), try increasing it"
    refused = [
        RequestFacts(
            False,
            refused_for_length=refused_for_length(400, words),
            refused_prompt_tokens=refused_tokens(words),
        )
        for _ in range(3)
    ]
    facts = summarize([RequestFacts(True, 200, 20), *refused], max_in_flight=1)
    [f] = judge(Evidence("llama", config, facts))
    assert f.id == "slots-split" and f.severity == "error"
    assert f.title == (
        "4 slots of 1,024 tokens each; at most 1 request ran at a time; 3 requests were refused "
        "for length: one slot of 4,096, or --kv-unified, would have held them"
    )
    assert dict(f.figures)["needed_tokens"] == 1524 and "-np 1 -c 4096" in f.suggestion
    # split slots with traffic that used them all is not a finding
    busy = summarize([RequestFacts(True, 200, 20)] * 10, max_in_flight=4)
    assert judge(Evidence("llama", config, busy, concurrency_max=4, watched_s=600)) == []


def test_context_below_the_pool_and_below_the_traffic() -> None:
    config = EngineConfig(
        "vLLM",
        0.0,
        context_tokens=32768,
        kv_pool_tokens=94208,
        prefix_caching=True,
        sources=("cache_config_info", "/v1/models"),
    )
    # a pool larger than one request's context is how vLLM is built: an idle one is no finding
    assert judge(Evidence("vllm", config)) == []
    near = summarize([RequestFacts(True, 30000, 500)])
    [f, g] = judge(Evidence("vllm", config, near))
    assert (f.id, g.id) == ("context-below-pool", "context-below-traffic")
    assert f.severity == "warning" and "35%" in f.title and "30,500 tokens (93% of the context)" in f.title
    assert "--max-model-len" in f.suggestion and "94,208" in f.suggestion
    assert judge(Evidence("vllm", config, summarize([RequestFacts(True, 2000, 500)]))) == []
    words = (
        "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens in the "
        "messages, Please reduce the length of the messages."
    )
    facts = summarize(
        [
            RequestFacts(True, 30000, 500),
            RequestFacts(
                False,
                refused_for_length=refused_for_length(400, words),
                refused_prompt_tokens=refused_tokens(words),
            ),
        ]
    )
    found = {f.id: f for f in judge(Evidence("vllm", config, facts))}
    show("finding", found["context-below-pool"])
    show("finding", found["context-below-traffic"])
    assert found["context-below-pool"].severity == "warning"
    assert (
        found["context-below-traffic"].severity == "error"
        and "40,000 tokens" in found["context-below-traffic"].title
    )
    assert refused_for_length(400, "invalid temperature") is None and refused_for_length(200, words) is None
    # vLLM 0.32's own words (tests/test_config_vllm.py asks it): it stops counting at the limit, a lower bound
    vllm = ("This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 "
            "input tokens, which exceeds this limit even without any output tokens.")
    assert refused_for_length(400, vllm) is not None and refused_tokens(vllm) == 2049


def test_queueing_needs_waiting_requests_and_enough_of_them() -> None:
    slow = [RequestFacts(True, 100, 10, ttft_s=2.0, engine_prompt_s=0.1)] * 10
    config = EngineConfig("llama.cpp", 0.0, slots=1)
    [f] = judge(Evidence("llama", config, summarize(slow), waiting_max=3))
    show("finding", f)
    assert f.id == "queueing" and "2000 ms" in f.title and "100 ms" in f.title
    assert judge(Evidence("llama", config, summarize(slow), waiting_max=0)) == []  # nothing waited
    assert judge(Evidence("llama", config, summarize(slow[:9]), waiting_max=3)) == []


def test_spec_depth_names_the_depth_past_which_drafts_are_wasted() -> None:
    drafts = 100.0
    rates = (0.9, 0.6, 0.3, 0.1)
    spec = SpecFacts(drafts, 4 * drafts, sum(rates) * drafts, tuple(r * drafts for r in rates))
    config = EngineConfig("llama.cpp", 0.0, spec_type="draft-simple", spec_n_max=4)
    [f] = judge(Evidence("llama", config, spec=spec))
    assert f.id == "spec-depth" and "past depth 3" in f.title and "position 4" in f.title
    assert dict(f.figures)["accept_pos_4"] == 0.1 and "--spec-draft-n-max 3" in f.suggestion
    assert rates[3] < DRAFT_COST <= rates[2]
    few = SpecFacts(MIN_SPEC_DRAFTS - 1, 0, 0, (0.0,) * 4)
    assert judge(Evidence("llama", config, spec=few)) == []


DRAFT_4 = EngineConfig("llama.cpp", 0.0, spec_type="draft-simple", spec_n_max=4, sources=("argv (PID 1)",))


def test_a_short_draft_is_no_rejection_at_the_positions_it_never_drafted() -> None:
    """p-min cut most drafts short: 100 drafts drafted 250 tokens at depth 4. Over all drafts position 3 reads
    12%, under a draft model's 20%; but at least 25 drafts reached it (positions 1 and 2 full, 3 and 4 as long
    as it), so its acceptance may be 48%: nothing is called wasted."""
    spec = SpecFacts(100, 250, 126, (80, 30, 12, 4))
    assert judge(Evidence("llama", DRAFT_4, spec=spec)) == []
    [p1, p2, p3, p4] = spec.positions(4) or ()
    assert (p1.reached, p2.reached, p3.reached, p4.reached) == (80, 50, 25, 4) and not p1.exact
    assert p3.rate == pytest.approx(0.48) and spec.position_rates[2] == pytest.approx(0.12)
    # Where even the highest acceptance it can have had is under the cost, it is wasted, said as a bound
    spec = SpecFacts(400, 1400, 850, (380, 300, 150, 20))
    [f] = judge(Evidence("llama", DRAFT_4, spec=spec))
    show("finding", f)
    assert f.id == "spec-depth"
    assert "position 4 is accepted in at most 10% of the at least 200 drafts" in f.title
    assert "(per position: ≤100%, ≤90%, ≤50%, ≤10%)" in f.title and dict(f.figures)["exact"] is False
    assert f.suggestion.startswith("--spec-draft-n-max 3 (now 4)")
    assert any("fewest drafts that can have reached it" in e for e in f.evidence)
    # Every draft full (drafted = drafts x depth): exact, and said without a bound
    [f] = judge(Evidence("llama", DRAFT_4, spec=SpecFacts(400, 1600, 850, (380, 300, 150, 20))))
    assert "position 4 is accepted in 5% of the 400 drafts" in f.title and dict(f.figures)["exact"] is True


def test_the_depth_is_the_configured_one_not_the_positions_reported() -> None:
    # the engine published two positions; the configuration says 4: positions 3 and 4 accepted nothing
    spec = SpecFacts(100, 400, 140, (90, 50))
    [f] = judge(Evidence("llama", DRAFT_4, spec=spec))
    assert "past depth 2" in f.title and dict(f.figures)["depth"] == 4
    assert f.suggestion.startswith("--spec-draft-n-max 2 (now 4)")
    # no depth in the configuration (or none read): nothing is judged
    assert judge(Evidence("llama", spec=SpecFacts(100, 400, 190, (90, 60, 30, 10)))) == []
    # counters that contradict the depth (more drafted tokens than drafts x depth) are not judged either
    assert judge(Evidence("llama", DRAFT_4, spec=SpecFacts(100, 600, 190, (90, 60, 30, 10)))) == []


def test_the_cost_of_a_drafted_token_depends_on_what_drafts_it_and_the_knob_is_the_engines_own() -> None:
    ngram = EngineConfig("vLLM", 0.0, spec_type="ngram", spec_n_max=3, sources=("argv (PID 2)",))
    # 12% at position 3: wasted for a draft model (20%), not for an n-gram lookup (5%)
    spec = SpecFacts(100, 300, 162, (90, 60, 12))
    assert judge(Evidence("vllm", ngram, spec=spec)) == []
    [f] = judge(Evidence("llama", dataclasses.replace(DRAFT_4, spec_n_max=3), spec=spec))
    assert dict(f.figures)["draft_kind"] == "draft model" and dict(f.figures)["draft_cost"] == 0.2
    # 3% at position 3: wasted even for n-grams; vLLM's own knob, its --speculative-config JSON
    [f] = judge(Evidence("vllm", ngram, spec=SpecFacts(100, 300, 153, (90, 60, 3))))
    show("finding", f)
    assert dict(f.figures)["draft_kind"] == "n-gram" and dict(f.figures)["draft_cost"] == 0.05
    knob = """--speculative-config '{"method": "ngram", "num_speculative_tokens": 2}'"""
    assert f.suggestion.startswith(knob + " (num_speculative_tokens now 3)")
    assert any("a rejected n-gram token costs only its share of the verification" in e for e in f.evidence)
    # SGLang's EAGLE heads: 10%; position 1 under it: speculation off, in SGLang's words
    eagle = EngineConfig("SGLang", 0.0, spec_type="EAGLE", spec_n_max=3, sources=("/get_server_info",))
    [f] = judge(Evidence("sglang", eagle, spec=SpecFacts(100, 300, 7, (6, 1, 0))))
    show("finding", f)
    assert f.title.startswith("speculative decoding does not pay on sglang: position 1 is accepted in 6%")
    assert f.suggestion.startswith("restart SGLang without --speculative-algorithm")
    assert dict(f.figures)["wasted_from_position"] == 1 and dict(f.figures)["draft_cost"] == 0.1
    [f] = judge(Evidence("sglang", eagle, spec=SpecFacts(100, 300, 105, (80, 20, 5))))
    assert f.suggestion.startswith("--speculative-num-steps 2 --speculative-num-draft-tokens 3")


def test_a_restart_between_two_readings_leaves_the_window_unknown_not_zero() -> None:
    before = EngineReading("vllm", generation_tokens_total=5000.0, spec_drafts_total=100.0,
                           spec_draft_tokens_total=300.0, spec_accepted_tokens_total=150.0,
                           spec_accepted_per_pos=(90.0, 50.0, 10.0))
    # restarted: more drafts since than before it, but the positions' counts went back
    after = EngineReading("vllm", generation_tokens_total=9000.0, spec_drafts_total=160.0,
                          spec_draft_tokens_total=480.0, spec_accepted_tokens_total=170.0,
                          spec_accepted_per_pos=(80.0, 60.0, 30.0))
    assert spec_between(before, after) is None
    assert went_back(before, after)
    later = dataclasses.replace(after, spec_drafts_total=200.0, spec_accepted_per_pos=(100.0, 80.0, 40.0))
    assert spec_between(after, later) == SpecFacts(40.0, 0.0, 0.0, (20.0, 20.0, 10.0))
    # a position that appeared meanwhile counts from 0
    grown = dataclasses.replace(later, spec_accepted_per_pos=(100.0, 80.0, 40.0, 5.0))
    assert spec_between(later, grown) == SpecFacts(0.0, 0.0, 0.0, (0.0, 0.0, 0.0, 5.0))


def test_an_arms_findings_rest_on_its_accepted_tokens_per_position() -> None:
    result = {"instances": [{"arm": "a", "spec": {"drafts": 60.0, "draft_tokens": 240.0, "accepted": 114.0,
                                                  "per_position": [54.0, 36.0, 18.0, 6.0]}},
                            {"arm": "a", "spec": {"drafts": 40.0, "draft_tokens": 160.0, "accepted": 76.0,
                                                  "per_position": [36.0, 24.0, 12.0, 4.0]}}]}
    spec = _spec_of(result, "a", [])
    assert spec is not None and spec["accepted_per_position"] == [90.0, 60.0, 30.0, 10.0]
    assert spec["per_position"] == [0.9, 0.6, 0.3, 0.1]
    [f] = arm_findings("a", config_json(DRAFT_4), spec)
    assert f["id"] == "spec-depth" and f["figures"]["accept_pos_4"] == 0.1


def test_since_holds_while_a_finding_holds_and_clears_when_it_stops() -> None:
    since = Since()
    spec = SpecFacts(100, 400, 190, (90, 60, 30, 10))
    [f] = since.update(judge(Evidence("e", DRAFT_4, spec=spec)), wall=100.0)
    [g] = since.update(judge(Evidence("e", DRAFT_4, spec=spec)), wall=160.0)
    assert f.since_wall == g.since_wall == 100.0
    assert since.update(judge(Evidence("e", DRAFT_4, spec=SpecFacts(100, 400, 300, (90, 80, 70, 60)))),
                        wall=170.0) == ()
    [h] = since.update(judge(Evidence("e", DRAFT_4, spec=spec)), wall=200.0)
    assert h.since_wall == 200.0


def test_shared_prefixes_by_tokens_and_by_workload_ids() -> None:
    prefixes = SharedPrefixes(block=4)
    assert prefixes.tokens(list(range(10))) == 0  # first sight: nothing shared
    assert prefixes.tokens([*range(8), 99, 98]) == 8  # two whole blocks in common
    assert prefixes.tokens([1, *range(1, 12)]) == 0  # same tokens after the start: no prefix
    seen: set[int] = set()
    assert shared_by_ids(seen, [1, 2, 3], 64, 180) == 0
    assert shared_by_ids(seen, [1, 2, 4, 5], 64, 250) == 128
    assert shared_by_ids(seen, [1, 2, 4], 64, 150) == 150  # capped at its length
    assert shared_by_ids(seen, [9, 2, 4], 64, 150) == 0  # a prefix is shared from the start or not at all


# ---- a start killed, the exporter, reports -------------------------------------------------------------
ALLOCATOR = """\
import time
hog = bytearray(300 * 2**20)
for i in range(0, len(hog), 4096):
    hog[i] = 1
print("allocated", flush=True)
while True:
    time.sleep(1)
"""


def test_an_engine_killed_while_starting_is_named_killed_with_its_peak_memory(tmp_path: Path) -> None:
    """A real process that takes 300 MiB while it starts, killed by SIGKILL (as the OOM killer kills): the
    switch names the kill and the peak, and the finding says it."""
    profile = Profile(
        name="hungry",
        engine="other",
        port=18099,
        path=tmp_path / "hungry.toml",
        argv=(sys.executable, "-c", ALLOCATOR),
        start_timeout_s=60,
        stop_timeout_s=5,
    )
    manager = EngineManager(gpu=None, log_dir=tmp_path, record_state=False)
    results = []
    worker = threading.Thread(target=lambda: results.append(manager.switch(profile)))
    worker.start()
    until(
        lambda: (
            manager._starting is not None
            and manager._starting.watch is not None
            and manager._starting.watch.peak_rss > 300 * 2**20
        ),
        "the engine to take its memory",
        30,
    )
    manager._starting.launched.proc.send_signal(signal.SIGKILL)  # what the OOM killer sends
    worker.join(30)
    [result] = results
    assert not result.ok and result.failed_step == "ready"
    assert "killed by SIGKILL" in result.message and "peaked at RSS 0.3" in result.message
    status = manager.poll_status()
    memory = status.start_memory
    assert status.state == "crashed" and memory is not None
    assert memory.ended == "killed by SIGKILL while starting" and memory.peak_rss_bytes > 300 * 2**20
    assert memory.oom_evidence  # the cgroup's counter or the kernel log, or why neither can be read
    counter, _ = oom_kills()
    if counter is not None:
        assert memory.oom is False  # the test's own kill: no OOM kill was counted
    [f] = judge(Evidence("hungry", start=memory))
    show("finding", f)
    assert f.id == "engine-killed" and f.severity == "error"
    assert f.title.startswith("hungry was killed by SIGKILL while starting, at peak ")
    assert "RSS 0.3 GiB" in f.title  # and its PSS before it, where smaps could be read


def test_a_heavy_start_is_a_warning_and_a_light_one_nothing() -> None:
    heavy = StartMemory(int(20 * GIB), int(2 * GIB), 30.0, int(24 * GIB), int(23 * GIB), int(2 * GIB))
    [f] = judge(Evidence("vllm", start=heavy))
    show("finding", f)
    assert f.id == "start-memory" and "+ 2.0 GiB in swap" in f.title
    assert judge(Evidence("vllm", start=StartMemory(GIB, 0, 3.0, 24 * GIB, 4 * GIB, 0))) == []


def test_a_few_pages_of_swap_are_no_warning_and_pss_counts_shared_pages_once() -> None:
    pages = StartMemory(GIB, 4 * 2**20, 3.0, 24 * GIB, 4 * GIB, 4 * 2**20)  # 4 MiB of the tree in swap
    assert judge(Evidence("vllm", start=pages)) == []
    # 20 GiB of RSS summed over a tree whose processes share 10 GiB: PSS says 10 GiB of a 24 GiB machine
    shared = StartMemory(int(20 * GIB), 0, 30.0, int(24 * GIB), int(12 * GIB), 0,
                         peak_pss_bytes=int(10 * GIB))
    assert judge(Evidence("vllm", start=shared)) == []
    [f] = judge(Evidence("vllm", start=dataclasses.replace(shared, peak_pss_bytes=int(20 * GIB))))
    assert "peak PSS 20.0 GiB (RSS 20.0 GiB)" in f.title and dict(f.figures)["peak_pss_bytes"] == 20 * GIB


def test_an_oom_kill_names_its_signal_once() -> None:
    killed = StartMemory(int(20 * GIB), 0, 30.0, int(24 * GIB), int(23 * GIB), 0,
                         ended="killed by SIGKILL while starting", oom=True,
                         oom_evidence="/sys/fs/cgroup/memory.events: oom_kill 0 -> 1 while it started")
    [f] = judge(Evidence("vllm", start=killed))
    show("finding", f)
    assert f.title.startswith("vllm was killed by the out-of-memory killer (SIGKILL) while starting, at peak")
    assert f.title.count("SIGKILL") == 1


def test_served_from_cache_is_zero_only_when_the_engine_said_zero() -> None:
    unknown = summarize([dataclasses.replace(r, cached_tokens=None) for r in agent_turns(8)])
    [f] = [f for f in judge(Evidence("vllm", VLLM_OFF, unknown)) if f.id == "prefix-cache-off"]
    assert "0 served" not in f.title and "served from cache: unknown (the engine did not say)" in f.title
    assert dict(f.figures)["cached_tokens"] is None


def test_context_below_traffic_never_suggests_a_context_below_the_current_one() -> None:
    config = EngineConfig("vLLM", 0.0, context_tokens=32768, kv_pool_tokens=40000, sources=("/v1/models",))
    [f] = judge(Evidence("vllm", config, summarize([RequestFacts(True, 30000, 500)])))
    show("finding", f)
    assert f.id == "context-below-traffic"
    assert f.suggestion == "raise --max-model-len above the current 32,768"
    # refused, and the engine said how long the prompt was: at least that
    words = "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens"
    refused = RequestFacts(False, refused_for_length=refused_for_length(400, words),
                           refused_prompt_tokens=refused_tokens(words))
    [f] = judge(Evidence("vllm", config, summarize([refused])))
    assert f.suggestion == "raise --max-model-len to at least 40,000 (now 32,768)"


def test_the_exporter_serves_each_finding_while_it_holds() -> None:
    metrics = ProbeMetrics(process=False)
    spec = SpecFacts(100, 400, 190, (90, 60, 30, 10))
    stats = EngineStats(
        spec_accept_rate_total=0.475,
        spec_accept_length_total=2.9,
        spec_accept_per_pos_total=(0.9, 0.6, 0.3, 0.1),
    )
    metrics.engine("llama", judge(Evidence("llama", DRAFT_4, spec=spec)), stats)
    body = metrics.exposition().decode()
    assert 'enginetop_finding{engine="llama",id="spec-depth",severity="warning"} 1.0' in body
    assert 'enginetop_spec_acceptance_per_position{engine="llama",position="4"} 0.1' in body
    assert 'enginetop_spec_mean_accepted_length{engine="llama"} 2.9' in body
    metrics.engine("llama", [], stats)
    assert "enginetop_finding{" not in metrics.exposition().decode()


async def test_the_exporter_serves_nothing_of_an_engine_while_it_is_down_or_unread(monkeypatch) -> None:
    """The exporter's watcher, reading an engine that drafts (a finding, its positions), then down, then up
    again, then failing: its findings and per-position gauges go while it is down or unread."""
    from tui.exporter import watch
    from tui.model.samples import EngineSample
    from tui.model.targets import EngineTarget

    reading = EngineReading("llamacpp", spec_drafts_total=100.0, spec_draft_tokens_total=400.0,
                            spec_accepted_tokens_total=190.0, spec_accepted_per_pos=(90.0, 60.0, 30.0, 10.0))
    up = EngineSample("llama", "http://x", 1.0, 1.0, "up", reading=reading, config=DRAFT_4)
    down = EngineSample("llama", "http://x", 2.0, 2.0, "down", health_reason="connection refused",
                        config=DRAFT_4)
    script: list[object] = [up, down, dataclasses.replace(up, t=3.0, wall=3.0), OSError("unreadable")]
    bodies: list[str] = []

    class Source:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        async def read(self) -> list[EngineSample]:
            item = script.pop(0)
            if isinstance(item, BaseException):
                raise item
            return [item]  # type: ignore[list-item]

        async def aclose(self) -> None:  # EngineSource's: the watcher closes its sources as it ends
            pass

    metrics = ProbeMetrics(process=False)

    async def sleep(_: float) -> None:
        bodies.append(metrics.exposition().decode())
        if not script:
            raise asyncio.CancelledError

    monkeypatch.setattr(watch, "EngineSource", Source)
    monkeypatch.setattr(watch.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        await watch.watch_engines([EngineTarget("llama", "http://x")], metrics, 1.0)
    finding = 'enginetop_finding{engine="llama",id="spec-depth",severity="warning"} 1.0'
    position = 'enginetop_spec_acceptance_per_position{engine="llama",position="4"} 0.1'
    rate = "enginetop_spec_acceptance_rate{"
    served = [(finding in body, position in body, rate in body) for body in bodies]
    assert served == [(True, True, True), (False, False, False), (True, True, True), (False, False, False)]


def test_the_configuration_table_marks_what_differs_between_arms() -> None:
    a = config_json(
        EngineConfig("llama.cpp", 0.0, context_tokens=4096, spec_type="draft-simple", spec_n_max=2)
    )
    b = config_json(
        EngineConfig("llama.cpp", 0.0, context_tokens=4096, spec_type="draft-simple", spec_n_max=6)
    )
    html = config_table([("n=2 · instance 1", a), ("n=6 · instance 1", b)])
    assert "<tr class=diff><td>draft depth (n-max) ≠</td><td>2</td><td>6</td></tr>" in html
    assert "<tr><td>context (tokens)</td><td>4,096</td><td>4,096</td></tr>" in html


def test_an_ab_report_lists_the_configuration_and_each_arms_findings() -> None:
    result = json.loads((DATA / "ab_result.json").read_text())
    config = config_json(
        EngineConfig(
            "llama.cpp",
            0.0,
            context_tokens=4096,
            spec_type="draft-simple",
            spec_n_max=4,
            sources=("/props", "argv (PID 9)"),
        )
    )
    for instance in result["instances"]:
        instance["config"] = config
    arm = result["arms"][0]["name"]
    result["analysis"]["arms"][arm]["spec"] = {
        "drafts": 100.0,
        "draft_tokens": 400.0,
        "accepted": 190.0,
        "per_position": [0.9, 0.6, 0.3, 0.1],
    }
    html = render_html(result)
    assert "Configuration captured from the running engines" in html and "argv (PID 9)" in html
    assert "spec-depth" in html and "past depth 3" in html


def test_a_recording_keeps_the_configuration_and_the_traffics_evidence(tmp_path: Path) -> None:
    from tui.model.findings import TrafficFacts
    from tui.model.samples import EngineReading, EngineSample
    from tui.model.traffic import TrafficSample, TrafficStats
    from tui.record.codec import decode, encode

    config = EngineConfig("vLLM", 1.7e9, context_tokens=2048, kv_pool_tokens=524288, prefix_caching=False,
                          argv=("vllm", "--api-key", "***"), published=(("block_size", "128"),),
                          lacks=("argv: remote",))
    sample = EngineSample("vllm", "http://x", 1.0, 1.7e9, "up", config=config, reading=EngineReading(
        "vllm", spec_drafts_total=10.0, spec_accepted_per_pos=(9.0, 6.0, 3.0)))
    assert decode(EngineSample, json.loads(json.dumps(encode(sample)))) == sample
    facts = TrafficFacts(requests=20, shared_known=20, prompt_tokens=11100, shared_tokens=5632,
                         cached_tokens=0)
    traffic = TrafficSample("vllm", "http://p", 1.0, 1.7e9, TrafficStats(window_s=60.0, facts=facts))
    assert decode(TrafficSample, json.loads(json.dumps(encode(traffic)))) == traffic
