"""Real engines started with secrets on their command lines, in several of the spellings each accepts: none of
the secrets reaches any output (snapshot JSON and text, the engine column as drawn, a recording decoded row by
row and exported, its HTML report, a bench result, enginetop's log). The vLLM one is in test_config_vllm.py
(its Gemma engine is started once for that module, with secrets)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import start_llama
from tests.shown import show
from tui.base.process import stop_group
from tui.live.store import Store
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.record.reader import Recording
from tui.sources.engine_source import EngineSource
from widgets.engine_panel import render_engine

pytestmark = pytest.mark.engine

ENGINETOP = [sys.executable, "-m", "tui"]
# llama-server reads each of these; the last --api-key wins (K1 and K2 are its keys, K0 is overridden but
# still on the command line), and both Hugging Face token spellings are given
SECRETS = {"K0": "sk-llama-zero-7c1d", "K1": "sk-llama-one-93ab", "K2": "sk-llama-two-e5f0",
           "HF1": "hf_first_token_41aa", "HF2": "hf_second_token_b07c"}


def everything_under(path: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in path.rglob("*") if p.is_file())


def assert_no_secret(text: str, where: str) -> None:
    leaked = [name for name, value in SECRETS.items() if value in text]
    assert not leaked, f"{', '.join(leaked)} in {where}"


def test_a_llama_server_started_with_secrets_in_every_spelling_leaks_none(tmp_path: Path) -> None:
    s = SECRETS
    engine = start_llama("secret", "--api-key", s["K0"], "--api_key", f"{s['K1']},{s['K2']}",
                         "-hft", s["HF1"], "--hf_token", s["HF2"], api_key=s["K1"])
    key_file = tmp_path / "key"
    key_file.write_text(s["K1"] + "\n")
    # the CLI's own cache (its log) in the test's folder, to be searched afterwards
    env = {**os.environ, "ENGINETOP_CACHE": str(tmp_path / "cache")}
    target = ["--engine", f"sec={engine.url}", "--api-key-file", f"sec={key_file}"]
    try:
        outputs: dict[str, str] = {}
        snapshot: dict = {}
        for form in (["--json"], []):
            out = subprocess.run([*ENGINETOP, "snapshot", *target, "--interval", "0.5", *form],
                                 capture_output=True, text=True, timeout=60, env=env)
            assert out.returncode == 0, out.stderr
            outputs[f"snapshot {' '.join(form)}"] = out.stdout + out.stderr
            snapshot = snapshot or orjson.loads(out.stdout)
        config = snapshot["engines"]["sec"]["config"]
        show("argv as shown", config["argv"])
        assert config["argv"][0].endswith("llama-server") and "***" in config["argv"]
        assert config["sources"][-1].startswith("argv (PID ")

        rec = tmp_path / "rec.enginetop"
        out = subprocess.run([*ENGINETOP, "record", *target, "--duration", "3", "--interval", "0.5", "-o",
                              str(rec)], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        outputs["record"] = out.stdout + out.stderr
        recording = Recording(rec)
        rows = [repr(row.item) for row in recording.rows()]
        recording.close()
        assert any("argv=(" in r and "llama-server" in r for r in rows), "the recording keeps the argv"
        outputs["recording rows"] = "\n".join(rows)
        for fmt in ("csv", "openmetrics"):
            out = subprocess.run([*ENGINETOP, "export", str(rec), "--format", fmt], capture_output=True,
                                 text=True, timeout=60, env=env)
            assert out.returncode == 0, out.stderr
            outputs[f"export {fmt}"] = out.stdout + out.stderr
        report = tmp_path / "report.html"
        out = subprocess.run([*ENGINETOP, "report", str(rec), "-o", str(report)], capture_output=True,
                             text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        outputs["report"] = report.read_text() + out.stdout + out.stderr

        trace = tmp_path / "trace.jsonl"
        trace.write_bytes(b"".join(orjson.dumps({"timestamp": i * 100, "input_length": 24, "output_length": 4,
                                                 "hash_ids": [i]}) + b"\n" for i in range(3)))
        result = tmp_path / "bench.json"
        out = subprocess.run([*ENGINETOP, "bench", str(trace), *target, "--speed", "10", "-o", str(result)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        bench = result.read_text()
        assert '"argv"' in bench
        outputs["bench"] = bench + out.stdout + out.stderr

        store = Store()

        async def poll() -> None:
            transports = Transports()
            source = EngineSource(EngineTarget("sec", engine.url, api_key=s["K1"]), transports)
            try:
                for sample in await source.read():
                    store.add(sample)
            finally:
                await transports.aclose()

        asyncio.run(poll())
        panel = render_engine(store.engines["sec"], width=200).plain
        assert "config" in panel
        outputs["the engine column"] = panel
        outputs["enginetop's cache (logs)"] = everything_under(tmp_path / "cache")
        for where, text in outputs.items():
            assert_no_secret(text, where)
    finally:
        stop_group(engine.launched)
