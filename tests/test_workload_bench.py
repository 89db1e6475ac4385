"""`enginetop bench`: plans, SLOs, and whole runs against a loopback engine whose every request the test
sees."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import psutil
import pytest

from tests.sse_server import Scenario, SSEServer
from tests.waiting import until
from tui.cli.main import main
from tui.model.slo import Slo, SloError
from tui.model.workload import Workload, WorkloadRequest
from tui.probe.results import ProbeResult
from tui.workload.formats import load_workload
from tui.workload.schedule import ScheduleError, gaps, plan
from tui.workload.slo import met

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "workloads"


def test_trace_plans_follow_times_speed_and_sessions():
    multi = load_workload(DATA / "aiperf_multi_turn.jsonl")
    planned = plan(multi, "trace")  # no timestamps, delays only: first turns at 0, the rest after their turn
    assert [(p.at_s, p.after, p.delay_s) for p in planned[:3]] == [(0.0, None, 0.0), (None, 0, 3.0),
                                                                   (None, 1, 5.0)]
    mooncake = plan(load_workload(DATA / "mooncake_trace.jsonl"), "trace", speed=2.0)
    assert [p.at_s for p in mooncake] == [0.0, 0.0, 1.526, 1.526, 1.7095]
    trace = load_workload(DATA / "agent_trace.jsonl")
    by_time = plan(trace, "trace", turns="timestamp")  # at the recorded time, held while the previous runs
    assert [(p.at_s, p.after) for p in by_time] == [(0.0, None), (2.711, 0), (4.96, 1)]
    with pytest.raises(ScheduleError, match="no request times"):
        plan(load_workload(DATA / "vllm_custom.jsonl"), "trace")


def test_rate_plans_have_the_asked_rate_and_burstiness():
    many = Workload("x", "vllm-custom", tuple(WorkloadRequest(line=i, prompt="p") for i in range(4000)))
    for kind, cv in (("constant", 0.0), ("poisson", 1.0), ("gamma", 3.0)):
        drawn = gaps(50.0, kind, cv, 4000, seed=1)
        mean = sum(drawn) / len(drawn)
        sd = (sum((g - mean) ** 2 for g in drawn) / len(drawn)) ** 0.5
        assert mean == pytest.approx(0.02, rel=0.1) and sd / mean == pytest.approx(cv, abs=0.15), kind
    planned = plan(many, "rate", rate=50.0, arrival="constant")
    assert planned[-1].at_s == pytest.approx(3999 / 50.0)


def result(ttft: float, e2e: float, tokens: int, ok: bool = True) -> ProbeResult:
    return ProbeResult(engine="e", url="u", workload="bench", index=0, wall_start=0.0, sent_at=0.0,
                       first_token_at=ttft, last_token_at=e2e, ended_at=e2e, completion_tokens=tokens,
                       error=None if ok else "boom", gaps_s=(0.01, 0.02))


def test_slo_terms_must_all_hold_and_bad_terms_are_refused():
    slo = Slo.parse("ttft:500 tpot:50 e2el:4000")
    assert met(slo, result(0.4, 1.4, 21))  # TPOT (1.4 - 0.4) / 20 = 50 ms: on the line holds
    assert not met(slo, result(0.6, 1.6, 21))  # TTFT over
    assert not met(slo, result(0.1, 3.1, 21))  # TPOT 150 ms over
    assert not met(slo, result(0.1, 0.2, 2, ok=False))  # a failed request is never good
    for bad, words in (("ttfb:500", "unknown name 'ttfb'"), ("ttft:fast", "not a number"),
                       ("ttft", "NAME:MILLISECONDS"),
                       ("ttft:-1", "positive"), ("", "empty")):
        with pytest.raises(SloError, match=words):
            Slo.parse(bad)


def test_bench_sends_every_request_at_its_rate_with_its_length_and_sessions_carry_their_history(
        tmp_path, capsys):
    with SSEServer(default=Scenario(per_token_delay_s=0.002)) as upstream:
        out = tmp_path / "r.json"
        code = main(["bench", str(DATA / "aiperf_multi_turn.jsonl"), "--engine", f"a={upstream.url}",
                     "--engine", f"b={upstream.url}", "--speed", "20", "--slo", "ttft:2000 e2el:10000",
                     "-o", str(out)])
        bodies = [r.body for r in upstream.requests if r.path.endswith("/chat/completions")]
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = orjson.loads(out.read_bytes())
    assert [e["engine"] for e in result["engines"]] == ["a", "b"]
    for engine in result["engines"]:
        assert engine["ok"] == 5 and engine["errors"] == 0 and engine["wrong_length"] == 0
        assert engine["attainment"] == 1.0 and engine["ttft_s"]["p50"] > 0
    assert len(bodies) == 10
    first_engine = bodies[:5]  # in the order they were sent: the two sessions interleave
    assert sorted(b["max_tokens"] for b in first_engine) == [24, 32, 48, 120, 200]
    assert all(b["ignore_eos"] is True and b["min_tokens"] == b["max_tokens"] for b in first_engine)
    third = next(b for b in first_engine if b["max_tokens"] == 24)["messages"]
    # the third turn carries the two before it and the replies this engine gave to them
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[0]["content"] == "My order has not arrived." and third[1]["content"]
    assert "TTFT ms p50/p90/p99" in printed and "SLO ttft:2000 e2el:10000 met" in printed
    # every request is kept, and `enginetop report` draws their CDFs with the SLO's limit on them
    kept = result["engines"][0]["per_request"]
    assert len(kept) == 5 and all(r["ok"] and r["ttft_ms"] > 0 and r["itl_ms"] for r in kept)
    assert sorted(r["completion_tokens"] for r in kept) == sorted(r["asked_tokens"] for r in kept)
    html = tmp_path / "r.html"
    assert main(["report", str(out), "-o", str(html)]) == 0
    page = html.read_text()
    assert "TTFT, share of requests at or under" in page and "SLO ttft 2000 ms" in page
    assert page.count("<polyline") == 4  # TTFT and ITL, one line per engine


def test_bench_refuses_bad_input_before_sending_anything(tmp_path, capsys):
    for argv, words in (
            (["bench", str(DATA / "vllm_custom.jsonl"), "--engine", "http://127.0.0.1:9"],
             "no request times"),
            (["bench", str(DATA / "vllm_custom.jsonl"), "--engine", "http://127.0.0.1:9", "--rate", "5",
              "--slo", "speed:3"], "unknown name 'speed'"),
            (["bench", str(tmp_path / "none.jsonl"), "--engine", "http://127.0.0.1:9"], "cannot read"),
            (["bench", str(DATA / "vllm_custom.jsonl"), "--engine", "http://127.0.0.1:9", "--rate", "5",
              "--arrival", "gamma"], "coefficient of variation"),
            (["bench", str(DATA / "vllm_custom.jsonl"), "--rate", "5"], "at least one --engine")):
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv


def test_an_engine_that_is_down_ends_its_part_with_errors_and_the_other_goes_on(tmp_path, capsys):
    with SSEServer() as upstream:
        code = main(["bench", str(DATA / "vllm_custom.jsonl"), "--engine", "down=http://127.0.0.1:9",
                     "--engine", f"up={upstream.url}", "--rate", "50", "--json"])
    result = orjson.loads(capsys.readouterr().out)
    down, up = result["engines"]
    assert code == 1 and down["errors"] == 3 and down["ok"] == 0
    assert "cannot connect" in down["first_errors"][0]
    assert up["ok"] == 3 and up["wrong_length"] == 0


def test_ab_with_a_workload_gives_the_block_at_one_place_the_same_requests_on_every_arm(tmp_path, capsys):
    out, html = tmp_path / "ab.json", tmp_path / "ab.html"
    with SSEServer(default=Scenario(per_token_delay_s=0.001)) as a, \
            SSEServer(default=Scenario(per_token_delay_s=0.002)) as b:
        code = main(["ab", f"a={a.url}", f"b={b.url}", "--workload", str(DATA / "aiperf_multi_turn.jsonl"),
                     "--instances", "2", "--blocks", "2", "--requests", "2", "--warmup", "0", "-o", str(out),
                     "--report", str(html)])
        sent = [[r.body for r in server.requests if r.body] for server in (a, b)]
    assert code == 0, capsys.readouterr().err
    assert len(sent[0]) == len(sent[1]) == 2 * 2 * 2
    # what each arm's n-th request asked for, less the replies (each engine's own) carried in the history
    def asked(body):
        return (body["max_tokens"], [m["content"] for m in body["messages"] if m["role"] == "user"])
    assert [asked(x) for x in sent[0]] == [asked(x) for x in sent[1]]
    assert all(x["ignore_eos"] and x["min_tokens"] == x["max_tokens"] for x in sent[0])
    result = orjson.loads(out.read_bytes())
    assert result["config"]["workload_file"] == str(DATA / "aiperf_multi_turn.jsonl")
    blocks = result["blocks"]
    assert len(blocks) == 8 and all(b["ok"] == 2 for b in blocks)
    assert result["method"]["requests"]["replay"] is True
    assert "requests of the workload" in html.read_text()
    assert main(["ab", f"a={a.url}", f"b={b.url}", "--workload", str(tmp_path / "none.jsonl")]) == 2
    assert "--workload" in capsys.readouterr().err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_engine_that_dies_mid_run_ends_its_part_and_the_other_goes_on(tmp_path, capsys, workers):
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(orjson.dumps({"prompt": f"q {i}", "output_tokens": 8}).decode() + "\n"
                                for i in range(40)))
    dying, living = SSEServer(default=Scenario(per_token_delay_s=0.005)).start(), SSEServer().start()
    def die() -> None:  # after 8 requests (of a 4 s plan), however long the workers took to start
        until(lambda: sum(r.path.endswith("/completions") for r in list(dying.requests)) >= 8,
              "8 requests at the dying engine", 60, every=0.01)
        dying.stop()

    threading.Thread(target=die, daemon=True).start()
    try:
        code = main(["bench", f"vllm-custom:{workload}", "--engine", f"dies={dying.url}", "--engine",
                     f"lives={living.url}", "--rate", "10", "--arrival", "constant", "--parallel-engines",
                     "--workers", workers, "--json"])
    finally:
        living.stop()
    dies, lives = orjson.loads(capsys.readouterr().out)["engines"]
    assert code == 1
    assert "the engine stopped answering (3 requests in a row: cannot connect" in dies["error"]
    assert 5 <= dies["ok"] < 15 and dies["errors"] >= 3 and dies["requests"] < 30  # the rest never sent
    assert lives["ok"] == 40 and lives["error"] is None
    assert len(lives.get("workers") or [None]) == int(workers)


def sigint_default() -> None:
    """The bench with SIGINT's default action, whatever the suite inherited: started with `&` where job
    control is off (a script, `sh -c 'make test &'`), the suite and every process it starts ignore SIGINT,
    and Python then leaves it ignored (as it should: so a shell keeps Ctrl-C from its background jobs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_keeps_what_was_measured_and_writes_it(tmp_path, workers):
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(orjson.dumps({"prompt": f"q {i}", "output_tokens": 8}).decode() + "\n"
                                for i in range(100)))
    out = tmp_path / "r.json"
    with SSEServer() as engine:
        run = subprocess.Popen([sys.executable, "-m", "tui", "bench", f"vllm-custom:{workload}", "--engine",
                                f"e={engine.url}", "--rate", "10", "--workers", workers, "-o", str(out)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_default)
        until(lambda: sum(1 for r in engine.requests if r.body) >= 10, "ten requests sent", timeout=30)
        children = psutil.Process(run.pid).children(recursive=True)  # the workers, if any
        assert len(children) >= int(workers) - 1
        run.send_signal(signal.SIGINT)
        printed, _ = run.communicate(timeout=30)
        until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
              "every worker gone", timeout=10)
    assert run.returncode == 130
    result = orjson.loads(out.read_bytes())
    assert result["interrupted"] is True
    kept = result["engines"][0]
    # ten were sent before the signal; one may still have been in flight, and is not counted as done
    assert 9 <= kept["ok"] < 100 and len(kept["per_request"]) == kept["requests"]
    assert "requests ok / sent" in printed
