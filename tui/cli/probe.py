"""Headless `enginetop probe` and `enginetop sweep`: JSON lines with --json, a readable table without.

Exit status: 0 when at least one request succeeded, 1 when every request failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from tui.base.defaults import DEFAULT_LEVELS, SWEEP_WORKLOADS, WORKLOADS
from tui.cli.options import EXIT_BAD_INPUT, EXIT_FAILED, add_targets
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR

if TYPE_CHECKING:
    from tui.model.targets import EngineTarget
    from tui.probe.client import ProbeLimits
    from tui.probe.results import ProbeResult, ProbeSummary
    from tui.probe.sweep import LevelResult
    from tui.probe.workloads import WorkloadParams


def _common(parser: argparse.ArgumentParser) -> None:
    add_targets(parser)
    parser.add_argument("--max-tokens", type=int, default=None, help="output tokens per request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated prompt text")
    parser.add_argument("--nonce", default=None, metavar="TEXT",
                        help="fix the nonce every prompt starts from (default: a new random one per run, so "
                             "no prompt cache serves an earlier run's prompts); the same TEXT and seed "
                             "send the same prompts")
    parser.add_argument("--model", default=None, help="model name to send (default: none; the server's own)")
    parser.add_argument("--no-ignore-eos", action="store_true",
                        help="do not send ignore_eos (for servers that reject unknown fields)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds of silence from the server before a request fails")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def register(subparsers: Any) -> None:
    """Add `probe` and `sweep` to the enginetop command line."""
    probe = subparsers.add_parser("probe", help="time streamed chat completions against one engine")
    _common(probe)
    probe.add_argument("--workload", choices=WORKLOADS, default="short")
    probe.add_argument("--repeat", type=int, default=3, help="requests to send (agent: turns)")
    probe.add_argument("--prompt-tokens", type=int, default=8192,
                       help="long-prefill: approximate prompt length in tokens")
    probe.add_argument("--ttft-gap-factor", type=float, default=DEFAULT_TTFT_GAP_FACTOR, metavar="X",
                       help="flag a request whose TTFT is over X times the engine's own "
                            "(default %(default)g)")
    probe.set_defaults(func=cmd_probe)

    sweep = subparsers.add_parser("sweep", help="concurrency sweep: aggregate and per-stream tok/s by level")
    _common(sweep)
    sweep.add_argument("--levels", default=",".join(map(str, DEFAULT_LEVELS)),
                       help="comma-separated stream counts (default %(default)s)")
    hold = sweep.add_mutually_exclusive_group()
    hold.add_argument("--duration", type=float, default=None, help="seconds to hold each level (default 10)")
    hold.add_argument("--requests", type=int, default=None, help="requests per stream at each level")
    sweep.add_argument("--workload", choices=SWEEP_WORKLOADS, default="short")
    sweep.add_argument("--prompt-tokens", type=int, default=8192,
                       help="long-prefill: approximate prompt length in tokens")
    sweep.set_defaults(func=cmd_sweep)


def _target(args: argparse.Namespace) -> EngineTarget:
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.run.targets import TargetError, build_targets

    if not args.engine or len(args.engine) > 1:
        raise TargetError("give one --engine URL (or NAME=URL): this command measures one engine")
    [target] = build_targets(args.engine, args.api_key_file, args.api_key_env)
    return target


def _params(args: argparse.Namespace, default_max_tokens: int | None) -> WorkloadParams:
    from tui.probe.workloads import WorkloadParams

    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.prompt_tokens < 1:
        raise ValueError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    fixed = {} if args.nonce is None else {"nonce": args.nonce}
    return WorkloadParams(
        max_tokens=args.max_tokens if args.max_tokens is not None else default_max_tokens,
        prompt_tokens=args.prompt_tokens,
        seed=args.seed,
        ignore_eos=not args.no_ignore_eos,
        model=args.model,
        **fixed,
    )


def _limits(args: argparse.Namespace) -> ProbeLimits:
    from tui.probe.client import ProbeLimits

    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    return ProbeLimits(read_s=args.timeout)


def _bad_input(command: str, exc: Exception) -> int:
    print(f"enginetop {command}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


# --- probe ---------------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str = ".1f", na: str = "n/a") -> str:
    return na if value is None else format(value, spec)


def _tokens(value: int | None, estimated: bool) -> str:
    if value is None:
        return "n/a"
    return f"~{value}" if estimated else str(value)


PROBE_HEADER = (
    f"{'#':>3} {'turn':>4} {'TTFT ms':>9} {'srv TTFT':>8} {'conn ms':>7} {'decode t/s':>10} "
    f"{'prefill t/s':>12} {'prompt':>7} {'cached':>7} {'output':>7} {'chunks':>6} {'srv dec t/s':>11}  status"
)


def _ms(seconds: float | None, spec: str = ".1f") -> str:
    return _fmt(None if seconds is None else seconds * 1000, spec)


def _probe_row(r: ProbeResult, gap_factor: float) -> str:
    prefill = _fmt(r.prefill_tps, ".0f")
    if r.prefill_source == "client-lower-bound":
        prefill = "≥" + prefill
    status = "ok" if r.ok else f"FAILED: {r.error}"
    if r.server is not None and r.server.draft_n is not None:  # speculative: accepted / drafted tokens
        status += f", drafts {r.server.draft_n_accepted or 0}/{r.server.draft_n} accepted"
    row = (
        f"{r.index:>3} {'' if r.turn is None else r.turn:>4} {_ms(r.ttft_s):>9} {_ms(r.server_ttft_s):>8} "
        f"{_ms(r.connect_s):>7} {_fmt(r.decode_tps):>10} {prefill:>12} {_tokens(r.prompt_tokens, False):>7} "
        f"{_tokens(r.cached_tokens, False):>7} {_tokens(r.completion_tokens, r.estimated):>7} {r.chunks:>6} "
        f"{_fmt(r.server_decode_tps):>11}  {status}"
    )
    warnings = [r.cache_note] if r.cache_note is not None else []
    if (gap := r.ttft_gap(gap_factor)) is not None:
        warnings.append(gap.text())
    return "".join([row, *(f"\n        ! {w}" for w in warnings)])


def _probe_footer(summary: ProbeSummary, results: list[ProbeResult], out: TextIO) -> None:
    print(f"\n{summary.ok}/{summary.requests} ok.  median TTFT {_ms(summary.ttft_s_p50)} ms "
          f"(engine's own {_ms(summary.server_ttft_s_p50)} ms), "
          f"decode {_fmt(summary.decode_tps_p50)} tok/s ({summary.server_label or 'server'} "
          f"{_fmt(summary.server_decode_tps_p50)}), "
          f"prefill {_fmt(summary.prefill_tps_p50, '.0f')} tok/s ({summary.prefill_source or 'n/a'})",
          file=out)
    print(f"output tokens {summary.completion_tokens} in {summary.chunks} non-empty chunks; "
          f"token counts from: {summary.token_source or 'n/a'}", file=out)
    if any(r.estimated for r in results):
        print("~ = estimated from chunks: the server sent no token counts (chunks undercount tokens)",
              file=out)
    if any(r.prefill_source == "client-lower-bound" for r in results):
        print("≥ = lower bound: uncached prompt tokens / client TTFT (the server gave no prefill timing)",
              file=out)
    print("TTFT from the send (connection set-up apart: conn ms); srv TTFT = the engine's own "
          "(llama.cpp prompt_ms, Ollama prompt_eval_duration, vLLM time_to_first_token_ms)", file=out)
    if summary.cache_served:
        print(f"! {summary.cache_served} request(s) served from the prompt cache: their TTFT and prefill "
              "measure a cache hit", file=out)


async def _probe(args: argparse.Namespace, target: EngineTarget, params: WorkloadParams,
                 limits: ProbeLimits) -> list[ProbeResult]:
    from tui.probe.client import ProbeClient
    from tui.probe.workloads import run_workload

    results: list[ProbeResult] = []
    if not args.json:
        print(f"probe {target.name} ({target.url}), workload {args.workload}, {args.repeat} request(s)")
        print(PROBE_HEADER)
    async with ProbeClient(limits) as client:
        async for result in run_workload(client, target, args.workload, params, args.repeat):
            results.append(result)
            if args.json:
                print(json.dumps(result.to_json(args.ttft_gap_factor)), flush=True)
            else:
                print(_probe_row(result, args.ttft_gap_factor), flush=True)
    return results


def cmd_probe(args: argparse.Namespace) -> int:
    from tui.base.secrets import SecretError
    from tui.net.loop import run_loop
    from tui.probe.results import ProbeSummary
    from tui.run.targets import TargetError
    from tui.sources.energy_meter import EnergyMeter, EnginePids
    from tui.sources.engine_source import is_local
    from tui.sources.gpu import GpuSampler

    try:
        target = _target(args)
        params = _params(args, None)
        limits = _limits(args)
        if args.repeat < 1:
            raise ValueError(f"--repeat must be at least 1, got {args.repeat}")
        if not args.ttft_gap_factor > 0:
            raise ValueError(f"--ttft-gap-factor must be positive, got {args.ttft_gap_factor}")
    except (TargetError, SecretError, ValueError) as exc:
        return _bad_input("probe", exc)
    # this machine's energy over the run (an engine here only): the GPUs', or the CPU package's (tui.sources)
    meter = EnergyMeter(GpuSampler(sysfs=True).sample, interval_s=0.5,
                        pids=EnginePids(target.name, target.url))
    with meter:
        results = run_loop(_probe(args, target, params, limits))
    summary = ProbeSummary.of(results)
    energy = meter.result(summary.completion_tokens, is_local(target.url))
    if args.json:
        print(json.dumps({**summary.to_json(), "engine": target.name, "workload": args.workload,
                          "energy": energy}), flush=True)
    else:
        _probe_footer(summary, results, sys.stdout)
        if energy["energy_j"] is not None:
            jpt = energy["joules_per_token"]
            per = "n/a (no output tokens counted)" if jpt is None else f"{jpt:.3g}"
            print(f"energy over the run: {energy['energy_j']:.1f} J of {energy['energy_scope']} "
                  f"({energy['energy_source']}), {per} J per output token "
                  "(prefills and the gaps between requests included)")
        else:
            print(f"energy: n/a ({energy['energy_note']})")
    if summary.ok == 0:
        print(f"enginetop probe: all {summary.requests} request(s) failed: {summary.errors[0]}",
              file=sys.stderr)
        return EXIT_FAILED
    return 0


# --- sweep ---------------------------------------------------------------------------------------------
SWEEP_HEADER = (
    f"{'streams':>7} {'reqs':>5} {'errors':>6} {'agg tok/s':>10} {'stream t/s p50':>14} "
    f"{'TTFT p50 ms':>11} {'TTFT p90 ms':>11} {'client cpu':>10} {'loop lag p99':>12}"
)


def _level_row(lv: LevelResult) -> str:
    est = "~" if lv.token_source in ("chunks", "mixed") else ""
    row = (
        f"{lv.level:>7} {lv.requests:>5} {lv.failed:>6} {est + _fmt(lv.aggregate_tps):>10} "
        f"{est + _fmt(lv.per_stream_tps_p50):>14} {_fmt(lv.ttft_p50_s and lv.ttft_p50_s * 1000):>11} "
        f"{_fmt(lv.ttft_p90_s and lv.ttft_p90_s * 1000):>11} {lv.client.cpu_share:>10.0%} "
        f"{_fmt(lv.client.loop_lag_p99_ms) + ' ms':>12}"
    )
    for note in lv.client.notes:
        row += f"\n        ! {note}"
    for err in lv.errors[:2]:
        row += f"\n        error: {err}"
    return row


def cmd_sweep(args: argparse.Namespace) -> int:
    from tui.base.secrets import SecretError
    from tui.net.loop import run_loop
    from tui.probe.client import ProbeClient
    from tui.probe.sweep import SweepConfig, parse_levels, run_sweep
    from tui.run.targets import TargetError

    try:
        target = _target(args)
        config = SweepConfig(
            levels=parse_levels(args.levels),
            duration_s=args.duration if args.duration is not None else 10.0,
            requests_per_stream=args.requests,
            workload=args.workload,
            params=_params(args, 64),
        )
        limits = _limits(args)
    except (TargetError, SecretError, ValueError) as exc:
        return _bad_input("sweep", exc)

    def on_level(level: LevelResult) -> None:
        if args.json:
            print(json.dumps({**level.to_json(), "engine": target.name}), flush=True)
        else:
            print(_level_row(level), flush=True)

    async def go() -> Any:
        async with ProbeClient(limits) as client:
            return await run_sweep(client, target, config, on_level)

    if not args.json:
        hold = (f"{config.requests_per_stream} request(s) per stream" if config.requests_per_stream
                else f"{config.duration_s:g} s")
        print(f"sweep {target.name} ({target.url}), workload {config.workload}, each level held {hold}")
        print(SWEEP_HEADER)
    result = run_loop(go())
    if args.json:
        print(json.dumps(result.to_json()), flush=True)
    if result.ok == 0:
        first = next((e for lv in result.levels for e in lv.errors), "no request completed")
        print(f"enginetop sweep: all {result.requests} request(s) failed: {first}", file=sys.stderr)
        return EXIT_FAILED
    return 0
