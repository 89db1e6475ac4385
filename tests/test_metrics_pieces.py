"""/metrics parsed family by family (each family's lines parsed once while they stay the same, and once per
shape while only their values move, issue 51: tui.sources.metrics_pieces) reads exactly what
prometheus_client reads from the whole text: the same families, types and samples, on every captured body,
on the same bodies growing poll after poll, and on the shapes that could tell the two apart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tui.sources.metrics import MetricsFormatError, _families, _parsed, parse_reading, select_lines
from tui.sources.metrics_pieces import by_family

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
    hits, reshaped, misses = _parsed.hits, _parsed.reshaped, _parsed.misses
    second = parse_reading(after)
    assert (first.generation_tokens_total, second.generation_tokens_total) == (10.0, 17.0)
    assert second.running == 1.0
    # the running family's piece is the same; the generation counter's has the same shape, a new value
    assert (_parsed.hits - hits, _parsed.reshaped - reshaped, _parsed.misses - misses) == (1, 1, 0)
    # a new series (another label set) is a new shape: the library parses it
    moved = after.replace("vllm:num_requests_running 1.0", 'vllm:num_requests_running{engine="1"} 2.0')
    assert parse_reading(moved).running == 2.0 and _parsed.misses - misses == 1


def _grown(text: str, poll: int) -> str:
    """The text as a later poll reads it: every sample's value moved (integers stay integers)."""
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            number = float(value)
            if math.isfinite(number):
                value = str(int(number) + poll) if value.lstrip("-").isdigit() else repr(number + poll * 0.25)
            line = f"{head} {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("body", BODIES, ids=[b.name for b in BODIES])
def test_every_captured_body_growing_poll_after_poll_reads_as_the_library_reads_it(body: Path) -> None:
    selected = "\n".join(select_lines(body.read_text())) + "\n"
    _parsed.cache_clear()
    for poll in range(4):
        grown = _grown(selected, poll)
        assert _pieces(grown) == _whole(grown), poll
    samples = sum(1 for line in selected.splitlines() if line and not line.startswith("#"))
    if samples:  # after the first poll, no family needed the library again: only their values moved
        assert _parsed.reshaped > 0 and _parsed.misses == len(by_family(selected))


# Lines whose split into series and value is not plain, each read at five polls with other values ({v}) and
# timestamps ({t}): the shape path must give what the library gives (True: it is taken after the first poll),
# or leave the piece to the library (False).
TRICKY = {
    "label values holding braces, spaces and quotes": (
        '# TYPE g gauge\ng{a="x} 1",b="say \\"hi\\""} {v}\n', True),
    "a label value holding a hash": ('# TYPE g gauge\ng{a="x # y"} {v}\n', False),
    "a timestamp": ("# TYPE g gauge\ng{a=\"1\"} {v} 170000000000{t}\ng2 {v} 17000000001{t}\n", True),
    "tabs": ("# TYPE g gauge\ng\t{v}\ng{a=\"1\"}\t{v}\n", False),
    "an integer, then a float": ("# TYPE c counter\nc_total {v}\n", True),
    "special values": ("# TYPE g gauge\ng{a=\"1\"} {v}\ng{a=\"2\"} +Inf\ng{a=\"3\"} -Inf\n", True),
    "not a number": ("# TYPE g gauge\ng{a=\"1\"} {v}\ng{a=\"3\"} NaN\n", False),
    "three fields": ("# TYPE g gauge\ng {v} 1 2\n", False),
    "leading blanks and a blank line": ("# TYPE g gauge\n  g{a=\"1\"}   {v}  \n\ng{a=\"2\"} {v}\n", True),
    "untyped lines between typed ones": ("# TYPE a gauge\na {v}\nb_total {v}\n# TYPE c gauge\nc {v}\n", True),
    # the library ends a label set at its first unquoted `}` and reads the first and last fields after it
    "a brace after the label set": ("# TYPE g gauge\ng{} 3 } {v} 100{t}\n", False),
    "a quoted brace with no label set": ('# TYPE g gauge\ng 1 "{"} {v} 1{t}\n', False),
}


@pytest.mark.parametrize(("text", "reshaped"), TRICKY.values(), ids=TRICKY.keys())
def test_tricky_lines_read_as_the_library_reads_them_at_every_poll(text: str, reshaped: bool) -> None:
    _parsed.cache_clear()
    for poll, value in enumerate(("3", "4.5", "7", "-0.0", "1e3")):
        body = text.replace("{v}", value).replace("{t}", str(poll))
        assert repr(_pieces(body)) == repr(_whole(body)), value  # repr: NaN reads the same, 3 is not 3.0
    assert (_parsed.reshaped > 0) == reshaped


@pytest.mark.parametrize("value", ["1_0", "abc", "0x10", "1 2 3 x", "\u00a02",
                                   pytest.param("1 " + "9" * 400, id="a timestamp past a float")])
def test_a_bad_value_in_a_known_shape_is_refused_as_the_whole_text_refuses_it(value: str) -> None:
    good = ("# HELP vllm:num_requests_running r\n# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 1.0\n')
    _parsed.cache_clear()
    assert parse_reading(good).running == 1.0
    bad = good.replace("1.0", value)
    try:
        whole = _whole(bad)
    except (ValueError, OverflowError):
        with pytest.raises(MetricsFormatError):
            parse_reading(bad)
    else:
        assert _pieces(bad) == whole
