"""Every workload format, replayed by `enginetop bench` on a loopback engine that speaks llama.cpp's
/tokenize (a token a word) and both OpenAI streams: text formats go as chat, formats of lengths and hash ids
as raw prompts made in the engine's tokens, each request with exactly its recorded output length."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.sse_server import SSEServer
from tui.cli.main import main
from tui.workload.formats import load_workload

DATA = Path(__file__).parent / "data" / "workloads"
FILES = sorted(p.name for p in DATA.iterdir() if not p.name.endswith(".meta.json"))


@pytest.fixture(scope="module")
def engine():
    with SSEServer() as server:
        yield server


@pytest.mark.parametrize("name", FILES)
def test_every_format_replays_with_its_lengths(engine, name, capsys):
    workload = load_workload(DATA / name)
    first = workload.requests[:3]
    start = len(engine.requests)
    code = main(["bench", str(DATA / name), "--engine", f"e={engine.url}", "--rate", "50", "--limit", "3",
                 "--json"])
    result = orjson.loads(capsys.readouterr().out)["engines"][0]
    assert code == 0 and result["ok"] == 3 and result["wrong_length"] == 0, result
    sent = [r.body for r in list(engine.requests)[start:] if r.body and "max_tokens" in r.body]
    assert sorted(b["max_tokens"] for b in sent) == sorted(r.output_length or 128 for r in first)
    synthetic = sorted(r.input_length for r in first if r.prompt is None and r.messages is None)
    made = sorted(len(b["prompt"].split()) + 1 for b in sent if "prompt" in b)  # + the engine's BOS
    assert made == synthetic  # lengths (and ids): a raw prompt exactly that long, in the engine's tokens
    counted = sorted(r["prompt_tokens"] for r in result["per_request"])
    assert all(n > 0 for n in counted) and all(n in counted for n in synthetic)  # as the engine counted
