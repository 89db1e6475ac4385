"""/metrics parsed family by family (each family's lines parsed once while they stay the same, issue 51) reads
exactly what prometheus_client reads from the whole text: the same families, types and samples, on every
captured body and on the shapes that could tell the two apart."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tui.sources.metrics import MetricsFormatError, _families, _parsed, parse_reading, select_lines

BODIES = sorted((Path(__file__).parent / "data" / "metrics").glob("*.txt"))


def _whole(text: str) -> list[tuple]:
    return [(f.name, f.type, f.samples) for f in text_string_to_metric_families(text)]


def _pieces(text: str) -> list[tuple]:
    return [(f.name, f.type, f.samples) for f in _families(text)]


@pytest.mark.parametrize("body", BODIES, ids=[b.name for b in BODIES])
def test_every_captured_body_reads_the_same_piece_by_piece(body: Path) -> None:
    selected = "\n".join(select_lines(body.read_text())) + "\n"
    assert _pieces(selected) == _whole(selected)


SHAPES = {
    "a family announced again, its HELP without TYPE": (
        "# HELP h_seconds latency\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1.0\"} 1.0\n"
        "# HELP h_seconds latency\nh_seconds_bucket{le=\"+Inf\"} 2.0\n"
        "h_seconds_count 2.0\nh_seconds_sum 1.5\n"),
    "untyped lines after a typed family": (
        "# HELP a_total a\n# TYPE a_total counter\na_total 3.0\nb_total 4.0\nc 5.0\n# TYPE d gauge\nd 1.0\n"),
    "untyped lines before any header": "x_total 1.0\ny 2.0\n# TYPE z gauge\nz 3.0\n",
    "TYPE before HELP": "# TYPE g gauge\n# HELP g a gauge\ng{k=\"v\"} 1.0\n# TYPE g2 gauge\ng2 2.0\n",
}


@pytest.mark.parametrize("text", SHAPES.values(), ids=SHAPES.keys())
def test_shapes_that_could_tell_the_pieces_apart_read_the_same(text: str) -> None:
    assert _pieces(text) == _whole(text)


def test_a_malformed_body_says_where_as_the_whole_text_does() -> None:
    text = ("# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running 1.0\n# HELP vllm:num_requests_waiting w\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{bad 2.0\n")
    with pytest.raises(MetricsFormatError, match=r"at family 2 \(after vllm:num_requests_running\)"):
        parse_reading(text)


def test_a_family_that_moved_is_parsed_again_and_one_that_did_not_is_not() -> None:
    before = ("# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
              "vllm:num_requests_running 1.0\n# HELP vllm:generation_tokens_total g\n"
              "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 10.0\n")
    after = before.replace("vllm:generation_tokens_total 10.0", "vllm:generation_tokens_total 17.0")
    _parsed.cache_clear()
    first = parse_reading(before)
    hits, misses = _parsed.cache_info().hits, _parsed.cache_info().misses
    second = parse_reading(after)
    assert (first.generation_tokens_total, second.generation_tokens_total) == (10.0, 17.0)
    assert second.running == 1.0
    assert (_parsed.cache_info().hits - hits, _parsed.cache_info().misses - misses) == (1, 1)
