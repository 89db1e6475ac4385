"""enginetop's probe client beside aiperf (NVIDIA, PyPI) on one llama-server and one workload. Prints figures.

    .venv/bin/python bench/bench_vs_aiperf.py [--requests 20] [--max-tokens 64] [--rounds 2]

One llama-server (--parallel 1) serves both clients, one request at a time. Both send the same kind of
request: enginetop's "short" workload body (a first word hashed from a per-run nonce and the request's
number, so llama.cpp's prompt cache reuses only the chat-template prefix), max_tokens fixed, ignore_eos,
temperature 0; each enginetop block draws its own nonce and the clients get different prompt indices, so
neither is served the other's cached prompt. enginetop's TTFT starts when the request is sent (its
connect is timed apart). The clients take turns in blocks (ABBA order over --rounds), so drift on a
shared machine hits both.

Per client: requests ok / failed, the client's own TTFT and decode tok/s medians, and the server's own
figures for the same requests: llama.cpp's per-request `timings` (enginetop reads them from each
response; for aiperf they come from llama-server's log, whose per-task "eval time" line carries the same
numbers), plus the /metrics counter deltas over each client's blocks as a cross-check. CPU seconds are
the rusage of each client's whole process tree (interpreter start, imports and, for aiperf, its
tokenizer and service processes included); enginetop's probe loop alone is shown beside it.

On a small CPU-only machine the client's own CPU use competes with llama-server, so the server's figures
differ between the two clients' blocks (aiperf 0.13.0's timing_manager process was seen keeping a core
busy for its whole run). The diff columns compare each client with the server on the same requests.

aiperf is installed on first use into its own venv (cache_dir()/bench-venv), never into enginetop's.
It runs offline: HF_HUB_OFFLINE=1 with a local Gemma 3 tokenizer folder (the same model as the demo
.gguf), presented as a Hugging Face cache entry because aiperf 0.13.0 in offline mode resolves every
tokenizer name through `snapshot_download(local_files_only=True)`, which refuses a plain folder path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.meter import run_child  # noqa: E402
from bench.tools import ensure_tool  # noqa: E402
from tui.base.paths import cache_dir  # noqa: E402
from tui.base.process import free_port, launch, stop_group  # noqa: E402
from tui.base.stats import median  # noqa: E402
from tui.engines.install_llamacpp import demo_argv  # noqa: E402
from tui.probe.workloads import WorkloadParams, short_body  # noqa: E402

AIPERF_VERSION = "0.13.0"
TOKENIZER_SRC = cache_dir() / "models" / "gemma-3-270m-hf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja",
                   "generation_config.json")
# The Hugging Face cache entry that stands for TOKENIZER_SRC; the commit name is arbitrary but must look real.
TOKENIZER_REPO = "enginetop/gemma-3-270m-tokenizer"
TOKENIZER_COMMIT = "0" * 40
# One per-task line of llama-server's log: "... | task 67 |        eval time =  755.61 ms /  16 tokens (...)".
_EVAL_RE = re.compile(
    r"\| task (\d+) \|\s+eval time =\s+([\d.]+) ms /\s+(\d+) tokens .*?([\d.]+) tokens per second"
)
TOKENS, SECONDS = "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total"
_PROMPT_RE = re.compile(r"\| task (\d+) \| prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")


# ---------------------------------------------------------------- setup of the other client

def bench_venv() -> Path:
    return cache_dir() / "bench-venv"


def ensure_aiperf() -> Path:
    """The aiperf executable, installing it into its own venv the first time (idempotent)."""
    return ensure_tool(bench_venv(), f"aiperf=={AIPERF_VERSION}", "aiperf")


def ensure_tokenizer_cache() -> Path:
    """A Hugging Face hub cache holding TOKENIZER_SRC as repo TOKENIZER_REPO (symlinks, idempotent)."""
    missing = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (TOKENIZER_SRC / f).exists()]
    if missing:
        raise SystemExit(f"the local tokenizer folder {TOKENIZER_SRC} lacks {', '.join(missing)}: "
                         "aiperf needs it to count tokens offline")
    hub = cache_dir() / "bench-hf-cache"
    repo = hub / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snap = repo / "snapshots" / TOKENIZER_COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(TOKENIZER_COMMIT)
    for name in TOKENIZER_FILES:
        src, link = TOKENIZER_SRC / name, snap / name
        if src.exists() and not link.exists():
            link.symlink_to(src)
    return hub


# ---------------------------------------------------------------- the server's own numbers

@dataclass(frozen=True)
class ServerTask:
    task: int
    prompt_ms: float | None
    eval_ms: float
    predicted_n: int
    predicted_per_second: float  # llama.cpp: (n - 1) / eval time


def server_tasks(log_text: str) -> list[ServerTask]:
    """Per-request timings llama-server printed, in completion order."""
    prompts = {int(m[1]): float(m[2]) for m in _PROMPT_RE.finditer(log_text)}
    return [ServerTask(int(m[1]), prompts.get(int(m[1])), float(m[2]), int(m[3]), float(m[4]))
            for m in _EVAL_RE.finditer(log_text)]


def read_from(path: Path, offset: int) -> tuple[str, int]:
    with path.open("rb") as fh:
        fh.seek(offset)
        data = fh.read()
    return data.decode("utf-8", "replace"), offset + len(data)


def log_size(path: Path) -> int:
    return path.stat().st_size


def settled_tasks(log: Path, offset: int) -> list[ServerTask]:
    # The server prints a task's timings and adds it to the counters just after the response ends.
    time.sleep(0.5)
    return server_tasks(read_from(log, offset)[0])


def scrape_counters(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    wanted = (TOKENS, SECONDS)
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name in wanted}


# ---------------------------------------------------------------- one block of each client

@dataclass
class Tally:
    """Everything one client produced over all its blocks."""

    name: str
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    server_tps: list[float] = field(default_factory=list)  # same requests as decode_tps, same order
    server_prompt_ms: list[float] = field(default_factory=list)
    ttft_over_prefill_ms: list[float] = field(default_factory=list)  # per request: client TTFT - prompt_ms
    decode_ratio: list[float] = field(default_factory=list)  # per request: client decode / server decode - 1
    block_cpu_s: list[float] = field(default_factory=list)
    server_tasks: int = 0  # requests the server finished during this client's blocks
    cpu_s: float = 0.0
    loop_cpu_s: float | None = None
    wall_s: float = 0.0
    metric_tokens: float = 0.0
    metric_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def bodies(params: WorkloadParams, first: int, count: int) -> list[dict[str, Any]]:
    return [short_body(params, i) for i in range(first, first + count)]


def enginetop_block(base: str, params: WorkloadParams, first: int, count: int, work: Path, log: Path,
                    offset: int, t: Tally) -> list[ServerTask]:
    out = work / f"enginetop-{first}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", base, str(first), str(count),
            str(params.max_tokens), str(out)]
    child = run_child(argv, None, work / f"enginetop-{first}.log")
    t.cpu_s += child.cpu_s
    t.block_cpu_s.append(child.cpu_s)
    t.wall_s += child.wall_s
    if (rc := child.rc) != 0:
        raise SystemExit(f"the enginetop probe worker failed (exit {rc}); see {work}/enginetop-{first}.log")
    data = json.loads(out.read_text())
    t.loop_cpu_s = (t.loop_cpu_s or 0.0) + data["loop_cpu_s"]
    tasks = settled_tasks(log, offset)
    for r in data["results"]:
        if not r["ok"]:
            t.failed += 1
            t.errors.append(r["error"] or "failed")
            continue
        t.ok += 1
        t.ttft_ms.append(r["ttft_s"] * 1000)
        timings = r["server_timings"] or {}
        if r["decode_tps"] is not None and r["server_decode_tps"] is not None:
            t.decode_tps.append(r["decode_tps"])
            t.server_tps.append(r["server_decode_tps"])
            t.decode_ratio.append(r["decode_tps"] / r["server_decode_tps"] - 1)
        if timings.get("prompt_ms") is not None:
            t.server_prompt_ms.append(timings["prompt_ms"])
            t.ttft_over_prefill_ms.append(r["ttft_s"] * 1000 - timings["prompt_ms"])
    return tasks


def aiperf_block(exe: Path, hub: Path, base: str, params: WorkloadParams, first: int, count: int,
                 work: Path, log: Path, offset: int, t: Tally) -> list[ServerTask]:
    run_dir = work / f"aiperf-{first}"
    run_dir.mkdir()
    dataset = run_dir / "input.jsonl"
    with dataset.open("w") as fh:
        for body in bodies(params, first, count):
            fh.write(json.dumps({"text": body["messages"][0]["content"]}) + "\n")
    argv = [
        str(exe), "profile", "--model", "gemma", "--tokenizer", TOKENIZER_REPO, "--url", base,
        "--endpoint-type", "chat", "--streaming", "--input-file", str(dataset),
        "--custom-dataset-type", "single_turn", "--request-count", str(count), "--concurrency", "1",
        # The same body fields as enginetop's short workload; aiperf adds model and stream_options.
        "--extra-inputs", f"max_tokens:{params.max_tokens}", "ignore_eos:true", "temperature:0",
        "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--workers-max", "1",
        "--artifact-dir", str(run_dir / "artifacts"),
    ]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    child = run_child(argv, env, run_dir / "aiperf.log")
    rc = child.rc
    t.cpu_s += child.cpu_s
    t.block_cpu_s.append(child.cpu_s)
    t.wall_s += child.wall_s
    records_path = run_dir / "artifacts" / "profile_export.jsonl"
    if rc != 0 or not records_path.exists():
        raise SystemExit(f"aiperf failed (exit {rc}); see {run_dir}/aiperf.log")
    tasks = settled_tasks(log, offset)
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    records.sort(key=lambda r: r["metadata"]["request_start_ns"])
    good = [r for r in records if r.get("error") is None]
    t.ok += len(good)
    for r in records:
        if r.get("error") is not None:
            t.failed += 1
            err = r["error"]
            t.errors.append(f"{err.get('type')}: {err.get('message')}" if isinstance(err, dict) else str(err))
    if len(records) < count:
        t.failed += count - len(records)
        t.errors.append(f"{count - len(records)} request(s) missing from aiperf's records")
    reused = sum(1 for r in good if r["metrics"].get("http_req_connection_reused", {}).get("value"))
    if reused:
        t.notes.append(f"{reused} aiperf request(s) reused a pooled connection")
    # One stream at a time: the server finished the requests in the order aiperf started them. A failed
    # request that never reached the server leaves no task, so pairing needs the counts to agree.
    paired = len(tasks) == len(good)
    if not paired:
        t.notes.append(f"block at index {first}: {len(good)} ok records but {len(tasks)} server tasks; "
                       "server decode taken unpaired")
    for i, r in enumerate(good):
        m = r["metrics"]
        t.ttft_ms.append(m["time_to_first_token"]["value"])
        if paired and tasks[i].prompt_ms is not None:
            t.ttft_over_prefill_ms.append(m["time_to_first_token"]["value"] - tasks[i].prompt_ms)
        if paired and "output_token_throughput_per_user" in m:
            decode = m["output_token_throughput_per_user"]["value"]
            t.decode_tps.append(decode)
            t.server_tps.append(tasks[i].predicted_per_second)
            t.decode_ratio.append(decode / tasks[i].predicted_per_second - 1)
    if not paired:
        t.decode_tps += [r["metrics"]["output_token_throughput_per_user"]["value"] for r in good
                         if "output_token_throughput_per_user" in r["metrics"]]
        t.server_tps += [task.predicted_per_second for task in tasks]
    t.server_prompt_ms += [task.prompt_ms for task in tasks if task.prompt_ms is not None]
    return tasks


# ---------------------------------------------------------------- the enginetop worker (a child process)

async def _worker(base: str, first: int, count: int, max_tokens: int, out: Path) -> None:
    from tui.model.targets import EngineTarget
    from tui.probe.client import ProbeClient

    params = WorkloadParams(max_tokens=max_tokens)
    target = EngineTarget("llama-server", base)
    results = []
    cpu0 = time.process_time()
    async with ProbeClient() as client:
        for index, body in zip(range(first, first + count), bodies(params, first, count), strict=True):
            results.append((await client.chat(target, body, workload="short", index=index)).to_json())
    loop_cpu = time.process_time() - cpu0
    out.write_text(json.dumps({"loop_cpu_s": loop_cpu, "results": results}))


# ---------------------------------------------------------------- the run

def wait_healthy(base: str, launched: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not launched.alive():
            raise SystemExit("llama-server exited while loading:\n" + "\n".join(launched.log_tail()))
        try:
            if httpx.get(base + "/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"llama-server not healthy after {timeout:g}s")


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def pct(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b == 0 else f"{(a / b - 1) * 100:+.1f}%"


# (heading line 1, heading line 2, width) of each column after the client's name.
COLUMNS = (
    ("ok/fail", "", 7), ("TTFT", "med ms", 8), ("srv prefill", "med ms", 11),
    ("TTFT-prefill", "paired ms", 12),
    ("decode", "med tok/s", 9), ("srv decode", "med tok/s", 10), ("diff", "of meds", 7),
    ("diff", "paired med", 10), ("/metrics", "tok/s", 8), ("CPU", "s", 7), ("CPU/req", "ms", 7),
)


def report(tallies: list[Tally], args: argparse.Namespace, rounds: int) -> None:
    name_w = max(len(t.name) for t in tallies)
    print()
    print(f"{args.requests} requests per client, one stream, max_tokens={args.max_tokens} with ignore_eos, "
          f"{rounds} alternating block(s) per client")
    for line in (0, 1):
        print(f"{'client' if line == 0 else '':<{name_w}} " + " ".join(f"{c[line]:>{c[2]}}" for c in COLUMNS))
    print("-" * (name_w + sum(c[2] + 1 for c in COLUMNS)))
    for t in tallies:
        client, server = median(t.decode_tps), median(t.server_tps)
        paired = median(t.decode_ratio)
        # The counters sum predicted_n over eval time; drop one token a request to match llama.cpp's (n-1)/t.
        agg = ((t.metric_tokens - t.server_tasks) / t.metric_seconds) if t.metric_seconds else None
        per_req = t.cpu_s / (t.ok + t.failed) * 1000 if t.ok + t.failed else None
        cells = (
            f"{t.ok}/{t.failed}", fmt(median(t.ttft_ms), ".1f"), fmt(median(t.server_prompt_ms), ".1f"),
            fmt(median(t.ttft_over_prefill_ms), "+.1f"), fmt(client, ".2f"), fmt(server, ".2f"),
            pct(client, server), fmt(None if paired is None else paired * 100, "+.2f") + "%", fmt(agg, ".2f"),
            f"{t.cpu_s:.2f}", fmt(per_req, ".0f"),
        )
        print(f"{t.name:<{name_w}} " + " ".join(f"{v:>{c[2]}}" for v, c in zip(cells, COLUMNS, strict=True)))
    print()
    print("TTFT: the client's own figure. srv prefill: llama.cpp prompt_ms of the same requests; "
          "TTFT-prefill: per request, what the client adds on top.")
    print("decode: enginetop (n-1)/(last - first token arrival); aiperf output_token_throughput_per_user "
          "(1000 / inter_token_latency).")
    print("srv decode: llama.cpp predicted_per_second of the same requests (enginetop: each response's "
          "timings; aiperf: llama-server's log).")
    print("/metrics: (delta tokens_predicted_total - requests) / delta tokens_predicted_seconds_total over "
          "the client's blocks.")
    print("CPU: rusage of the client's whole process tree (interpreter start and imports included).")
    for t in tallies:
        blocks = ", ".join(f"{c:.2f}" for c in t.block_cpu_s)
        extra = f"; probe loop alone {t.loop_cpu_s:.2f} s" if t.loop_cpu_s is not None else ""
        cores = t.cpu_s / t.wall_s if t.wall_s else 0.0
        print(f"{t.name}: CPU s per block {blocks}{extra}; {t.wall_s:.1f} s wall, so {cores:.2f} cores on "
              f"average; server finished {t.server_tasks} request(s) in its blocks")
        for note in t.notes:
            print(f"  note: {note}")
        for err in sorted(set(t.errors)):
            print(f"  failed x{t.errors.count(err)}: {err[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per client (default 20)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating blocks per client; each aiperf block starts aiperf anew")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, aiperf artifacts)")
    parser.add_argument("--worker", nargs=5, metavar=("URL", "FIRST", "COUNT", "MAX_TOKENS", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        base, first, count, max_tokens, out = args.worker
        asyncio.run(_worker(base, int(first), int(count), int(max_tokens), Path(out)))
        return
    if args.requests < 1 or args.max_tokens < 2 or args.rounds < 1:
        raise SystemExit("--requests and --rounds must be at least 1, --max-tokens at least 2")
    rounds = min(args.rounds, args.requests)

    exe = ensure_aiperf()
    hub = ensure_tokenizer_cache()
    work = Path(tempfile.mkdtemp(prefix="bench-vs-aiperf-"))
    log = work / "llama-server.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    launched = launch(demo_argv(port, "--parallel", "1"), log)
    params = WorkloadParams(max_tokens=args.max_tokens)
    engine, other = Tally("enginetop"), Tally(f"aiperf {AIPERF_VERSION}")
    try:
        wait_healthy(base, launched)
        # One unmeasured request, so neither client pays for the server's first-request warm-up.
        warm = short_body(params, 10**6)
        httpx.post(base + "/v1/chat/completions", json=warm, timeout=300, trust_env=False)
        sizes = [args.requests // rounds + (1 if i < args.requests % rounds else 0) for i in range(rounds)]
        first_e, first_a = 0, args.requests  # disjoint prompt indices: no prompt is served from cache
        for r, size in enumerate(sizes):
            order = ("e", "a") if r % 2 == 0 else ("a", "e")
            for who in order:
                offset, before = log_size(log), scrape_counters(base)
                if who == "e":
                    print(f"round {r + 1}: enginetop probe, {size} requests ...", flush=True)
                    tally = engine
                    tasks = enginetop_block(base, params, first_e, size, work, log, offset, engine)
                    first_e += size
                else:
                    print(f"round {r + 1}: aiperf, {size} requests ...", flush=True)
                    tally = other
                    tasks = aiperf_block(exe, hub, base, params, first_a, size, work, log, offset, other)
                    first_a += size
                after = scrape_counters(base)
                tally.server_tasks += len(tasks)
                tally.metric_tokens += after[TOKENS] - before[TOKENS]
                tally.metric_seconds += after[SECONDS] - before[SECONDS]
    finally:
        # On failure the work folder stays, since the error message points into it.
        print(f"llama-server {stop_group(launched)}; work folder {work}", flush=True)
    report([engine, other], args, rounds)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
