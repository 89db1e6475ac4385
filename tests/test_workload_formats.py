"""Every workload format enginetop reads, from small samples shaped like the originals (tests/data/workloads),
recognised from their content; and the messages a malformed file gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.workload.formats import KINDS, WorkloadError, load_workload

DATA = Path(__file__).parent / "data" / "workloads"


def test_each_sample_is_recognised_from_its_content_and_read():
    found = {}
    for path in sorted(DATA.iterdir()):
        if path.name.endswith(".meta.json"):
            continue
        found[path.name] = load_workload(path)
    assert {w.kind for w in found.values()} == set(KINDS)

    mooncake = found["mooncake_trace.jsonl"]
    assert mooncake.kind == "mooncake" and mooncake.block_size == 512 and len(mooncake.requests) == 5
    first = mooncake.requests[0]
    assert (first.timestamp_ms, first.input_length, first.output_length, first.hash_ids[:2]) == (0, 6755, 500,
                                                                                                  (0, 1))
    assert all(r.hash_ids[0] == 0 for r in mooncake.requests[:4])  # the shared system prompt

    trace = found["agent_trace.jsonl"]  # enginetop's own: the block size and tokenizer from its metadata
    assert trace.kind == "enginetop" and trace.block_size == 16 and "tokenize" in trace.tokenizer
    assert trace.sessions == 1 and [r.delay_ms for r in trace.requests] == [None, 312, 305]

    aiperf = found["aiperf_mooncake.jsonl"]
    assert aiperf.kind == "mooncake" and aiperf.sessions == 1
    assert aiperf.requests[2].prompt.startswith("Summarise") and aiperf.requests[2].input_length is None
    assert aiperf.requests[3].messages[0]["role"] == "system"
    assert aiperf.requests[3].extra == {"temperature": 0}

    single = found["aiperf_single_turn.jsonl"]
    assert single.kind == "aiperf-single" and len(single.requests) == 5  # `texts` gives one request each
    assert single.requests[4].session_id == "chat-7" and single.requests[4].delay_ms == 2000

    multi = found["aiperf_multi_turn.jsonl"]
    assert multi.kind == "aiperf-multi" and multi.sessions == 2 and len(multi.requests) == 5
    assert [r.delay_ms for r in multi.requests[:3]] == [None, 3000, 5000]
    assert multi.requests[3].session_id == "line-2"  # a conversation without an id gets its line's

    azure = found["AzureLLMInferenceTrace_code.csv"]
    assert azure.kind == "azure" and [r.input_length for r in azure.requests][:2] == [4808, 3180]
    assert azure.requests[1].timestamp_ms == pytest.approx(4314.579, abs=0.01)  # seven-digit fractions

    burst = found["BurstGPT_1.csv"]
    assert burst.kind == "burstgpt" and burst.skipped == 1 and len(burst.requests) == 3  # 0 tokens: failed
    assert [r.timestamp_ms for r in burst.requests] == [0.0, 113000.0, 120000.0]

    share = found["sharegpt.json"]
    assert share.kind == "sharegpt" and share.sessions == 2 and len(share.requests) == 3
    assert share.requests[1].session_id == "QWJhYvA_0" and "Experts Academy" in share.requests[1].prompt

    custom = found["vllm_custom.jsonl"]
    assert custom.kind == "vllm-custom" and [r.output_length for r in custom.requests] == [10, 1520, 819]


def test_a_kind_can_be_named_and_the_meta_less_trace_reads_as_mooncake(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes((DATA / "agent_trace.jsonl").read_bytes())
    with pytest.raises(WorkloadError, match="block size"):  # hash ids of 16-token blocks are not 512's...
        load_workload(f"enginetop:{trace}")
    with pytest.raises(WorkloadError, match=r"t.jsonl:1: field 'hash_ids': 4 ids of 512-token blocks cannot "
                       r"hold 52 tokens \(need ceil\(52/512\) = 1\)"):
        load_workload(trace)  # ...and read as 512-token Mooncake ids, they cannot fit


@pytest.mark.parametrize(("name", "content", "words"), [
    ("bad.jsonl", '{"input_length": 10, "output_length": 2}\n{"input_length": "ten"}\n',
     r"bad.jsonl:2: field 'input_length': expected a whole number, got 'ten'"),
    ("bad.jsonl", '{"input_length": 10}\nnot json\n', r"bad.jsonl:2: not JSON"),
    ("bad.jsonl", '{"input_length": 10, "text_input": "x"}\n',
     r"bad.jsonl:1: field 'input_length': exactly one"),
    ("bad.jsonl", '{"input_length": 600, "hash_ids": [1]}\n', r"bad.jsonl:1: field 'hash_ids': 1 ids"),
    ("bad.jsonl", '{"text": "hi", "timestamp": 1, "delay": 2}\n',
     r"bad.jsonl:1: field 'delay': timestamp and"),
    ("bad.jsonl", '{"turns": [{"output_length": 3}]}\n', r"bad.jsonl:1: field 'text': missing"),
    ("bad.jsonl", '{"prompt": "x"}\n{"prompt": "y", "output_tokens": 0}\n',
     r"bad.jsonl:1: field 'output_tokens': missing"),
    ("bad.jsonl", '{"foo": 1}\n', r"bad.jsonl:1: a JSON line with fields \['foo'\]"),
    ("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", r"bad.csv:2: field 'TIMESTAMP'"),
    ("bad.csv", "Timestamp,Model,Request tokens,Response tokens\n1,x,-4,2\n",
     r"bad.csv:2: field 'Request tokens': expected a whole number >= 0"),
    ("bad.csv", "a,b\n1,2\n", r"bad.csv: not a workload format"),
    ("bad.json", '[{"id": 1, "conversations": [{"from": "robot", "value": "x"}]}]',
     r"conversation 0: field 'conversations\[0\].from'"),
    ("empty.jsonl", "", r"empty.jsonl: not a workload format"),
])
def test_malformed_files_name_the_file_line_and_field(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(WorkloadError, match=words):
        load_workload(path)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read the workload: No such file"):
        load_workload(tmp_path / "nope.jsonl")
