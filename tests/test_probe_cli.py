"""`enginetop probe` and `enginetop sweep`, run as a user would (`python -m tui ...`) against loopback SSE."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_server import Scenario, SSEServer, running

ROOT = Path(__file__).resolve().parents[1]
REQUEST_KEYS = {"ttft_s", "decode_tps", "prefill_tps", "prompt_tokens", "completion_tokens", "cached_tokens",
                "chunks", "server_decode_tps", "token_source"}


@pytest.fixture(scope="module")
def sse() -> Iterator[SSEServer]:
    with running({"paced": Scenario(per_token_delay_s=0.005),
                  "no_usage2": Scenario(usage=False, timings=False, tokens_per_chunk=2),
                  # Paced: tokens that arrive in one read have one arrival time and no decode span.
                  "flaky": Scenario(fail_every=2, per_token_delay_s=0.005)}) as server:
        yield server


def enginetop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_probe_json_lines(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("paced"), "--repeat", "3", "--max-tokens", "8",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    *requests, summary = lines(proc.stdout)
    assert [r["type"] for r in requests] == ["request"] * 3 and summary["type"] == "summary"
    for r in requests:
        assert r.keys() >= REQUEST_KEYS
        assert r["ok"] and r["completion_tokens"] == 8 and r["token_source"] == "server"
        assert r["server_decode_tps"] is not None and r["decode_tps"] > 0
    assert (summary["requests"], summary["ok"], summary["failed"]) == (3, 3, 0)
    assert summary["token_source"] == "server" and summary["estimated_from_chunks"] is False
    sent = list(sse.requests)[-3:]
    assert all(req.body["max_tokens"] == 8 and req.body["ignore_eos"] is True for req in sent)


def test_probe_without_usage_is_labelled_estimated(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("no_usage2"), "--repeat", "1", "--max-tokens", "8",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    request, summary = lines(proc.stdout)
    assert request["token_source"] == "chunks" and request["estimated_from_chunks"] is True
    assert request["completion_tokens"] == request["chunks"] == 4
    assert request["server_decode_tps"] is None and request["prompt_tokens"] is None
    assert summary["estimated_from_chunks"] is True
    table = enginetop("probe", "--engine", sse.url_for("no_usage2"), "--repeat", "1", "--max-tokens", "8")
    assert table.returncode == 0
    assert "~4" in table.stdout and "~ = estimated from chunks" in table.stdout


def test_probe_table(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("paced"), "--repeat", "2", "--max-tokens", "6",
                     "--workload", "thinking-off")
    assert proc.returncode == 0, proc.stderr
    assert "TTFT ms" in proc.stdout and "decode t/s" in proc.stdout and "2/2 ok" in proc.stdout
    assert list(sse.requests)[-1].body["chat_template_kwargs"] == {"enable_thinking": False}


def test_probe_all_failed_exits_non_zero(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("http500"), "--repeat", "2", "--json")
    assert proc.returncode == 1
    *requests, summary = lines(proc.stdout)
    assert all(not r["ok"] and r["error"] == "HTTP 500: simulated failure" for r in requests)
    assert summary["ok"] == 0 and summary["errors"] == ["HTTP 500: simulated failure"]
    assert "all 2 request(s) failed: HTTP 500: simulated failure" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_probe_some_failed_exits_zero(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("flaky"), "--repeat", "4", "--max-tokens", "3",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    *requests, summary = lines(proc.stdout)
    assert [r["ok"] for r in requests] == [True, False, True, False]
    assert (summary["ok"], summary["failed"]) == (2, 2)
    assert summary["decode_tps_p50"] is not None


def test_probe_dropped_stream_fails(sse: SSEServer) -> None:
    proc = enginetop("probe", "--engine", sse.url_for("drop"), "--repeat", "1", "--json")
    assert proc.returncode == 1 and "connection dropped after 3 chunks" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "--engine", "localhost:8080"], "expected NAME=http://HOST:PORT"),
        (["probe", "--engine", "http://127.0.0.1:9", "--repeat", "0"], "--repeat must be at least 1"),
        (["probe", "--engine", "http://127.0.0.1:9", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["probe", "--engine", "http://127.0.0.1:9", "--api-key-env", "ENGINETOP_UNSET_VAR_X"], "is not set"),
        (["sweep", "--engine", "http://127.0.0.1:9", "--levels", "1,x"], "comma-separated whole numbers"),
        (["sweep", "--engine", "http://127.0.0.1:9", "--levels", "0"], "stream counts must be 1 or more"),
    ],
)
def test_bad_input_is_a_readable_message(args: list[str], message: str) -> None:
    proc = enginetop(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_sweep_json(sse: SSEServer) -> None:
    proc = enginetop("sweep", "--engine", sse.url_for("paced"), "--levels", "1,2", "--requests", "1",
                     "--max-tokens", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    one, two, summary = lines(proc.stdout)
    assert (one["type"], one["level"], one["requests"]) == ("level", 1, 1)
    assert (two["level"], two["requests"], two["errors"]) == (2, 2, 0)
    for lv in (one, two):
        assert lv["aggregate_tps"] > 0 and lv["ttft_s_p50"] > 0 and lv["token_source"] == "server"
        assert {"cpu_share", "loop_lag_p99_ms", "bottleneck"} <= lv["client"].keys()
    assert summary["type"] == "sweep_summary" and summary["requests"] == 3


def test_sweep_table_and_failure(sse: SSEServer) -> None:
    proc = enginetop("sweep", "--engine", sse.url_for("paced"), "--levels", "1", "--duration", "0.3",
                     "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert "agg tok/s" in proc.stdout and "held 0.3 s" in proc.stdout
    bad = enginetop("sweep", "--engine", sse.url_for("http500"), "--levels", "1,2", "--requests", "1")
    assert bad.returncode == 1 and "all 3 request(s) failed" in bad.stderr
