"""A replay on an engine that cannot give token pieces: prompts from words (approximate, and said so in the
result, the live view and the report), or in a local Hugging Face tokenizer's tokens with --tokenizer (exact,
the engine's /tokenize never asked); and --tokenizer on the real engines."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.sse_server import SSEServer
from tui.cli.main import main
from tui.engines.models import gemma_dir, tiny_dir
from tui.workload.live import progress_of
from tui.workload.prompts import WORDS
from tui.workload.report import write_workload_report

LINES = [  # one session whose turns extend the last by whole 16-token blocks, and a stranger
    {"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [0, 1], "session_id": "s"},
    {"input_length": 48, "output_length": 4, "hash_ids": [0, 1, 2], "session_id": "s", "delay": 20},
    {"input_length": 64, "output_length": 4, "hash_ids": [0, 1, 2, 3], "session_id": "s", "delay": 20},
    {"timestamp": 30, "input_length": 40, "output_length": 4, "hash_ids": [7, 8, 9]},
]


def trace(tmp_path: Path) -> Path:
    path = tmp_path / "agent.jsonl"
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in LINES))
    (path.parent / "agent.jsonl.meta.json").write_bytes(orjson.dumps({"block_size": 16, "tokenizer": "x"}))
    return path


def word_tokenizer(tmp_path: Path) -> Path:
    """A real tokenizer.json (the tokenizers library's WordLevel model): a token per word and a BOS, as the
    loopback engine counts them."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", "[BOS]", *sorted(set(WORDS))])},
                                    unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tokenizer.save(str(path))
    return path.parent


def run(tmp_path: Path, url: str, *extra: str) -> dict:
    out = tmp_path / "r.json"
    assert main(["bench", str(trace(tmp_path)), "--engine", f"e={url}", "--speed", "20", "-o", str(out),
                 *extra]) == 0
    return orjson.loads(out.read_bytes())


def test_without_tokenize_prompts_are_made_of_words_and_every_output_says_they_are_approximate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SSEServer(tokenize=False) as server:
        result = run(tmp_path, server.url)
    [engine] = result["engines"]
    assert engine["ok"] == len(LINES)
    note = engine["prompt_note"]
    assert note.startswith("prompt lengths and block sharing are approximate") and "--tokenizer" in note
    assert "did not tokenize" in note
    assert note in capsys.readouterr().out  # the table says it
    # equal ids still make equal text: each turn's prompt begins with the last one's, the stranger's does not
    sent = {len(r.body["prompt"].split()): r.body["prompt"] for r in server.requests
            if r.path == "/v1/completions"}
    assert sorted(sent) == [32, 40, 48, 64]  # a word a token, no BOS counted: the lengths, roughly
    assert sent[64].startswith(sent[48]) and sent[48].startswith(sent[32])
    assert not sent[40].startswith(sent[32][:40])
    html = write_workload_report(result, tmp_path / "r.html", "r.json").read_text()
    assert "approximate" in html


def test_a_local_tokenizer_makes_exact_prompts_and_the_engine_is_never_asked_to_tokenize(
        tmp_path: Path) -> None:
    with SSEServer(tokenize=False) as server:
        result = run(tmp_path, server.url, "--tokenizer", str(word_tokenizer(tmp_path)))
    [engine] = result["engines"]
    assert engine["ok"] == len(LINES) and engine["prompt_note"] is None
    assert not [r for r in server.requests if "tokenize" in r.path]
    # the loopback engine counts a token a word, as the WordLevel tokenizer does: lengths exact
    assert [r["prompt_tokens"] for r in engine["per_request"]] == [line["input_length"] for line in LINES]


def test_a_tokenizer_that_cannot_be_found_is_refused_before_anything_is_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SSEServer() as server:
        code = main(["bench", str(trace(tmp_path)), "--engine", f"e={server.url}", "--tokenizer",
                     str(tmp_path / "nowhere")])
    assert code == 2 and not server.requests
    assert "--tokenizer" in capsys.readouterr().err


def test_the_live_view_carries_the_note() -> None:
    class Run:
        results: list = []
        prompt_note = "prompt lengths and block sharing are approximate (...)"

    class Bench:
        run = Run()
        sent = 0
        in_flight = 0

    progress = progress_of(Bench(), "bench", "w.jsonl", None, "running", 4, 0.0)  # type: ignore[arg-type]
    assert progress.note == Run.prompt_note


@pytest.mark.engine
def test_a_local_tokenizer_on_the_real_engines_gives_their_exact_lengths(llama_server, vllm_server,
                                                                         tmp_path: Path) -> None:
    """The demo Gemma's own tokenizer.json on llama-server, the tiny Llama's on vLLM: every prompt exactly
    its recorded length as each engine counts it, and the cache following the ids."""
    engines = (("llama", llama_server.url, gemma_dir()), ("vllm", vllm_server.url, tiny_dir()))
    for name, url, folder in engines:
        where = tmp_path / name
        where.mkdir()
        [engine] = run(where, url, "--tokenizer", str(folder))["engines"]
        assert engine["ok"] == len(LINES) and engine["prompt_note"] is None, engine["first_errors"]
        assert [r["prompt_tokens"] for r in engine["per_request"]] == [line["input_length"] for line in LINES]
        if name == "llama":  # llama.cpp caches token by token: each turn reuses the one before it
            cached = [r["cached_tokens"] for r in engine["per_request"]]
            assert cached[1] >= 24 and cached[2] >= 40, cached
