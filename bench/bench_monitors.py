"""enginetop beside the monitors users install for one engine each, on the same engine and traffic, every
monitor polling each second, in one run: llamastat 0.3.0 ("nvtop for llama.cpp") and llmtop
(rxxusp/llmtop, Textual like us) on a llama-server started as its README starts it (no --metrics, two slots);
vllm-htop 0.5.0 (one file, no dependencies), vllmstat 0.9.1 ("nvtop for vLLM") and llmtop on the CPU vLLM.
Each monitor runs as a user runs it, its real TUI in a pseudo-terminal of 200×55, one after the other
under the same steady agent traffic; its process tree's CPU and peak RSS are read from outside
(bench/meter.py), and enginetop's are given as ratios to each peer's. Then what each shows that the
other does not, row by row, from each one's own JSON
(`llamastat --once --json`, `vllmstat --once --json`, `enginetop snapshot --json`).

The peers are installed on first use into their own venv (~/.cache/enginetop/peers-venv), never enginetop's:
from PyPI, and llmtop (its name on PyPI is another project's) from a clone of its repository, given by
--llmtop-source or $LLMTOP_SOURCE (without one, llmtop is left out and the run says so).

    .venv/bin/python bench/bench_monitors.py [--seconds 60] [--sections llama,vllm] [--warmup 310]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from bench.meter import TreeMeter  # noqa: E402
from bench.tools import ensure_tool  # noqa: E402
from tests.conftest import start_engine, wait_openai_ready  # noqa: E402
from tui.base.paths import cache_dir, runs_dir  # noqa: E402
from tui.base.process import free_port, launch, stop_group  # noqa: E402
from tui.engines.install_llamacpp import demo_argv  # noqa: E402

PEERS = cache_dir() / "peers-venv"
ENGINETOP = [sys.executable, "-m", "tui"]
TERM = {"TERM": "xterm-256color", "COLUMNS": "200", "LINES": "55"}
INTERVAL_S = "1"  # every monitor polls each second (their defaults: llamastat 1 s, the others 2 s)
PYPI = {"llamastat": "llamastat==0.3.0", "vllmstat": "vllmstat==0.9.1", "vllm-htop": "vllm-htop==0.5.0"}


def peer(name: str, llmtop_source: str | None = None) -> Path | None:
    """The peer's command, installed on first use; None for llmtop without a source to install it from."""
    exe = PEERS / "bin" / name
    if exe.exists():
        return exe
    if name == "llmtop":
        if not llmtop_source:
            return None
        requirement = f"git+file://{Path(llmtop_source).resolve()}"
    else:
        requirement = PYPI[name]
    return ensure_tool(PEERS, requirement, name, "~40 MB")


VLLM_MODEL = "enginetop-tiny-llama"  # the demo vLLM profile's served name


def start_vllm() -> tuple[subprocess.Popen, str]:
    """The real vLLM of the bundled demo profile (demo-vllm-tiny) on a free port, ready: (process, URL)."""
    from tui.lifecycle.profile_files import load_profiles, repo_profiles_dir
    from tui.lifecycle.profile_resolve import resolve

    port = free_port()
    profile = dataclasses.replace(load_profiles([repo_profiles_dir()]).get("demo-vllm-tiny"), port=port)
    resolved = resolve(profile)
    assert resolved.argv is not None
    launched = launch(list(resolved.argv), runs_dir() / f"bench-vllm-{port}.log", env=resolved.env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_openai_ready("vLLM", url, launched, timeout=300)
    except BaseException:
        stop_group(launched)
        raise
    return launched, url


class Traffic:
    """Agents in a loop until stopped: a request, its answer, a think time; the tokens answers reported."""

    def __init__(self, url: str, model: str | None, agents: int = 2, tokens: int = 48,
                 think_s: float = 0.5) -> None:
        self.url, self.model, self.agents, self.tokens, self.think_s = url, model, agents, tokens, think_s
        self.stop = threading.Event()
        self.told = 0
        self.threads = [threading.Thread(target=self._agent, args=(n,), daemon=True) for n in range(agents)]

    def _agent(self, n: int) -> None:
        with httpx.Client(timeout=120) as client:
            turn = 0
            while not self.stop.is_set():
                body = {"messages": [{"role": "user", "content": f"agent {n} step {turn}: list fruit"}],
                        "max_tokens": self.tokens, **({"model": self.model} if self.model else {})}
                with_reply = client.post(f"{self.url}/v1/chat/completions", json=body)
                if with_reply.status_code == 200:
                    self.told += with_reply.json()["usage"]["completion_tokens"]
                turn += 1
                self.stop.wait(self.think_s)

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def cost(argv: list[str], seconds: float, warmup: float, log: Path) -> tuple[float, int]:
    """The monitor's real TUI in a pseudo-terminal (`script`), its tree's CPU share and peak RSS."""
    cmd = ["script", "-qfec", " ".join(argv), "/dev/null"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **TERM}, start_new_session=True)
        try:
            time.sleep(warmup)
            if proc.poll() is not None:
                raise SystemExit(f"{argv[0]} exited at once: see {log}")
            with TreeMeter(proc.pid) as meter:
                time.sleep(seconds)
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    return meter.cpu_s / seconds * 100, meter.peak


def once_json(argv: list[str]) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr[-800:]}")
    return json.loads(out.stdout)


def present(data: object, *keys: str) -> bool:
    """Any of `keys` anywhere in the JSON with a value that is not null, empty or zero-length."""
    if isinstance(data, dict):
        return any(data.get(k) not in (None, [], {}, "") for k in keys) or \
            any(present(v, *keys) for v in data.values())
    if isinstance(data, list):
        return any(present(v, *keys) for v in data)
    return False


def side_by_side(rows: list[tuple[str, tuple[str, ...], tuple[str, ...]]], ours: dict, theirs: dict,
                 peer_name: str) -> None:
    print(f"  {'figure':<44} {'enginetop':>9} {peer_name:>9}")
    for label, our_keys, their_keys in rows:
        mark = ("yes" if present(ours, *our_keys) else "–", "yes" if present(theirs, *their_keys) else "–")
        print(f"  {label:<44} {mark[0]:>9} {mark[1]:>9}")


LLAMA_ROWS = [
    ("slots: phase, task, prompt progress, generated", ("slots",), ("slots",)),
    ("per-slot context used / n_ctx", ("slots",), ("ctx_used",)),
    ("generation tok/s (from /slots without --metrics)", ("gen_tps",), ("gen_rate", "gen_tps")),
    ("prompt tok/s", ("prompt_processed_tps",), ("prompt_rate", "prompt_tps")),
    ("quantization", ("quantization",), ("model_ftype",)),
    ("parameters", ("params",), ("n_params",)),
    ("file size", ("model_bytes",), ("model_size_bytes",)),
    ("training context", ("train_context",), ("n_ctx_train",)),
    ("build", ("version",), ("build_info",)),
    ("slots × context", ("slots", "context_tokens"), ("total_slots",)),
    ("sampling defaults", ("sampling",), ("temperature",)),
    ("configuration: KV pool, unified/split, KV dtype, cache", ("summary",), ("kv_unified",)),
    ("findings with evidence", ("findings",), ("findings", "advice")),
    ("where each figure came from", ("origin", "sources"), ("source",)),
    ("requests completed", ("requests_finished_total",), ("tasks_completed",)),
    ("session peaks and totals", ("peak_gen_tps", "gen_tokens_session"), ("peak_gen_rate",)),
    ("host power / energy per token", ("joules_per_token", "energy"), ("host",)),
]
# vllmstat's names: its Snapshot dataclass (vllmstat/core/state.py), as `--once --json` dumps it
VLLM_ROWS = [
    ("running / waiting, session peaks", ("running",), ("peak_running",)),
    ("gen / prompt tok/s", ("gen_tps",), ("gen_tps",)),
    ("requests/s", ("requests_per_s",), ("req_rate",)),
    ("TTFT quantiles", ("ttft_p50_s",), ("ttft",)),
    ("queue / prefill / decode quantiles", ("queue_s", "prefill_s"), ("queue", "prefill")),
    ("end-to-end quantiles", ("e2e_s",), ("e2e",)),
    ("prompt / generation lengths", ("prompt_len",), ("prompt_len",)),
    ("finish reasons", ("finish_window", "finish_total"), ("finish_reasons",)),
    ("preemptions/s", ("preemptions_per_s",), ("preempt_rate",)),
    ("tokens per iteration", ("tokens_per_step",), ("tokens_per_iter",)),
    ("busy share / averages while serving", ("busy_share",), ("session_active_frac",)),
    ("KV pool in tokens (as vLLM says)", ("kv_pool_tokens",), ("kv_capacity_tokens",)),
    ("prefix cache hit", ("prefix_cache_hit_rate",), ("prefix_hit_window",)),
    ("goodput against SLOs", ("goodput",), ("goodput_ttft",)),
    ("configuration read from the engine", ("summary",), ("max_model_len",)),
    ("findings with evidence", ("findings",), ("advice",)),
    ("where each figure came from", ("sources",), ("source",)),
]


def section(name: str, url: str, model: str | None, peers: list[list[str]], peer_json: list[str],
            rows: list, seconds: float, work: Path, warmup: float = 6.0) -> None:
    """enginetop and each peer in turn under the same traffic, and enginetop's cost as a ratio to each's; the
    rows compared with the peer whose JSON `peer_json` reads."""
    print(f"\n== {name}: {url}")
    ours_argv = [*ENGINETOP, "--engine", f"{name}={url}", "--no-record", "--no-discover",
                 "--interval", INTERVAL_S]
    with Traffic(url, model) as traffic:
        time.sleep(3)
        results = {}
        for argv in (ours_argv, *peers):
            label = "enginetop" if argv is ours_argv else argv[0].rsplit("/", 1)[-1]
            cpu, rss = cost(argv, seconds, warmup, work / f"{label}.log")
            results[label] = (cpu, rss)
            print(f"  {label:<10} {cpu:5.2f} % of a core, peak RSS {rss / 2**20:5.0f} MiB "
                  f"({seconds:.0f} s after {warmup:.0f} s running, its tree, in a 200×55 pseudo-terminal)",
                  flush=True)
        ours = once_json([*ENGINETOP, "snapshot", "--engine", f"{name}={url}", "--json", "--interval", "1"])
        theirs = once_json(peer_json)
    cpu_a, rss_a = results["enginetop"]
    for label, (cpu_b, rss_b) in results.items():
        if label != "enginetop":
            print(f"  ratio enginetop/{label}: CPU {cpu_a / cpu_b:.2f}x, RSS {rss_a / rss_b:.2f}x")
    print(f"  {traffic.told} tokens generated meanwhile")
    side_by_side(rows, ours, theirs, peer_json[0].rsplit("/", 1)[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--sections", default="llama,vllm")
    ap.add_argument("--warmup", type=float, default=6.0,
                    help="seconds each monitor runs before it is measured (310: enginetop's charts full)")
    ap.add_argument("--llmtop-source", default=os.environ.get("LLMTOP_SOURCE"),
                    help="a clone of github.com/rxxusp/llmtop to install llmtop from (or $LLMTOP_SOURCE)")
    args = ap.parse_args()
    llmtop = peer("llmtop", args.llmtop_source)
    if llmtop is None:
        print("llmtop left out: give --llmtop-source (a clone of github.com/rxxusp/llmtop)")
    work = runs_dir() / "bench-monitors"
    work.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    if "llama" in sections:
        llamastat = str(peer("llamastat"))
        engine = start_engine("plain", "llama-server", lambda port: [
            a for a in demo_argv(port, "--parallel", "2") if a != "--metrics"])
        try:
            peers = [[llamastat, "-u", engine.url, "-i", INTERVAL_S]]
            if llmtop is not None:
                peers.append([str(llmtop), "--port", str(engine.port), "--no-gpu", "--interval", INTERVAL_S])
            section("llama", engine.url, None, peers, [llamastat, "-u", engine.url, "--once", "--json"],
                    LLAMA_ROWS, args.seconds, work, args.warmup)
        finally:
            stop_group(engine.launched)
    if "vllm" in sections:
        vllmstat, vllm_htop = str(peer("vllmstat")), str(peer("vllm-htop"))
        launched, url = start_vllm()
        port = int(url.rsplit(":", 1)[1])
        try:
            peers = [[vllm_htop, "--url", url, "--interval", INTERVAL_S, "--no-gpu-detect"],
                     [vllmstat, "-u", url, "--no-gpu", "-i", INTERVAL_S]]
            if llmtop is not None:
                peers.append([str(llmtop), "--port", str(port), "--no-gpu", "--interval", INTERVAL_S])
            section("vllm", url, VLLM_MODEL, peers,
                    [vllmstat, "-u", url, "--no-gpu", "--once", "--json"], VLLM_ROWS, args.seconds, work,
                    args.warmup)
        finally:
            stop_group(launched)


if __name__ == "__main__":
    main()
