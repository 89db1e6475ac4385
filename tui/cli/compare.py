"""`enginetop ab`, `enginetop sweep-param`, `enginetop report`: headless comparisons and their report.

Progress goes to stderr; with --json the whole result goes to stdout. Exit codes: 0 done, 1 an arm
produced no data, 2 bad input (a clear message on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tui.base.defaults import DEFAULT_CV_THRESHOLD_PCT, WORKLOADS
from tui.cli.options import add_output

if TYPE_CHECKING:
    from tui.compare.ab import ABConfig, Mode
    from tui.lifecycle.profiles import Profile
    from tui.run.targets import EngineSpec
    from tui.workload.blocks import WorkloadBlocks


class UsageError(ValueError):
    """Bad input on the command line: printed as one line, exit code 2."""


PROBE_WORKLOADS = [w for w in WORKLOADS if w != "agent"]


def _levels(text: str) -> tuple[int, ...]:
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.probe.sweep import parse_levels

    try:
        return parse_levels(text, "--concurrency")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--instances", type=int, default=3,
                   help="fresh engine instances per arm; rounds in time for attached servers (default 3)")
    p.add_argument("--blocks", type=int, default=4, help="probe blocks per instance (default 4)")
    p.add_argument("--requests", type=int, default=3, help="requests per block (default 3)")
    p.add_argument("--workload", default="short", metavar="NAME|FILE",
                   help=f"what a block sends: a probe workload ({', '.join(PROBE_WORKLOADS)}), or your own "
                        "workload file (PATH or KIND:PATH, as `enginetop bench` reads them), replayed: the "
                        "block at one place gets the same requests on every arm (default short)")
    p.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per request (default: the workload's)"
    )
    p.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                   help="with --workload FILE: make prompts from hash ids in this Hugging Face tokenizer's "
                        "tokens (a tokenizer.json or its folder, never downloaded) instead of each engine's "
                        "/tokenize")
    p.add_argument("--warmup", type=int, default=1,
                   help="unrecorded requests after each start or round (default 1)")
    p.add_argument(
        "--mode",
        choices=["auto", "switch", "coresident"],
        default="auto",
        help="switch: one engine at a time (GPU); coresident: instance i of every arm side by side, "
        "blocks A B A B. auto: coresident without a GPU (or for attached servers), else switch",
    )
    p.add_argument(
        "--cv-threshold",
        type=float,
        default=DEFAULT_CV_THRESHOLD_PCT,
        help=f"CV%% across instances (rounds) above which an arm is not reproducible (default "
        f"{DEFAULT_CV_THRESHOLD_PCT:g})",
    )
    p.add_argument("--exclude-throttled", action="store_true", help="drop blocks run while the GPU throttled")
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=(),
        metavar="1,2,4",
        help="also sweep these concurrency levels on each arm's first instance",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--weights",
        help="model weight bytes per token for the roofline: a size (14GB) or a path "
        "(.gguf or model dir); default: the size of the first arm's --model file",
    )
    p.add_argument("--bandwidth", help="peak memory bandwidth (1.79TB/s); default: NVML's, if a GPU is there")
    p.add_argument(
        "--profiles-dir",
        type=Path,
        action="append",
        help="where profiles are (default: the repo's profiles/ and the user's)",
    )
    add_output(p, output="result JSON (CSV files are written beside it)",
               json="print the result JSON on stdout")
    p.add_argument("--report", type=Path, help="also write the HTML report here")


def register(subparsers: Any) -> None:
    ab = subparsers.add_parser("ab", help="interleaved A/B comparison over fresh engine instances (or rounds "
                               "on running servers)")
    ab.add_argument(
        "arms",
        nargs="+",
        metavar="ARM",
        help="a profile name, or NAME=URL / URL of a running server (attached: never restarted)",
    )
    _common(ab)
    ab.set_defaults(func=cmd_ab)

    sweep = subparsers.add_parser("sweep-param", help="sweep one argv option of a profile, e.g. --threads")
    sweep.add_argument("profile", help="profile name")
    sweep.add_argument(
        "--param",
        required=True,
        metavar="OPTION=V1,V2",
        help="e.g. spec-draft-n-max=1,2,3,4,5,6 (sets --spec-draft-n-max); 'off' removes it",
    )
    _common(sweep)
    sweep.set_defaults(func=cmd_sweep)

    report = subparsers.add_parser("report", help="write the offline HTML report of an ab, sweep-param, "
                                                  "bench or capacity result, or of a recording")
    report.add_argument("result", type=Path, help="RESULT.json written by ab, sweep-param, bench or "
                                                  "capacity, or a recording")
    add_output(report, output="report.html", required=True)
    report.set_defaults(func=cmd_report)


# ---- building arms -------------------------------------------------------------------------------


def _gpu_source() -> tuple[Any, bool]:
    """The sampler's bound method, and whether a GPU answered (without one, arms fit side by side)."""
    from tui.sources.gpu import GpuSampler

    sampler = GpuSampler()
    report = sampler.sample()
    return sampler.sample, bool(report.gpus)


def _load(args: argparse.Namespace) -> Any:
    from tui.lifecycle.profile_files import load_profiles

    return load_profiles(args.profiles_dir) if args.profiles_dir else load_profiles()


def _is_url(spec: str) -> bool:
    return "://" in spec


def _block_source(args: argparse.Namespace, config: ABConfig) -> WorkloadBlocks | None:
    """The user's workload for the blocks, when --workload names a file."""
    from tui.probe.client import ProbeLimits
    from tui.workload.blocks import WorkloadBlocks
    from tui.workload.formats import WorkloadError, load_workload
    from tui.workload.tokenizer import load_tokenizer

    if config.workload_file is None:
        if args.tokenizer:
            raise UsageError("--tokenizer is for --workload FILE (prompts made from its hash ids)")
        return None
    try:
        workload = load_workload(config.workload_file)
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
        return WorkloadBlocks(workload, config.blocks, limits=ProbeLimits(read_s=config.request_timeout_s),
                              tokenizer=tokenizer)
    except (WorkloadError, ValueError) as exc:
        raise UsageError(f"--workload: {exc}") from exc


def _config(args: argparse.Namespace, mode: Mode) -> ABConfig:
    from tui.compare.ab import ABConfig

    replay = args.workload not in PROBE_WORKLOADS
    config = ABConfig(
        instances=args.instances,
        blocks=args.blocks,
        requests_per_block=args.requests,
        workload="short" if replay else args.workload,  # with a file: the warm-ups' workload
        workload_file=args.workload if replay else None,
        max_tokens=args.max_tokens,
        warmup_requests=args.warmup,
        cv_threshold_pct=args.cv_threshold,
        exclude_throttled=args.exclude_throttled,
        mode=mode,
        seed=args.seed,
        concurrency=tuple(args.concurrency),
    )
    try:
        config.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return config


def _roofline_input(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any] | None:
    from tui.compare.roofline import model_weight_bytes, parse_bandwidth, parse_bytes

    bytes_per_token = bytes_source = None
    if args.weights:
        path = Path(args.weights).expanduser()
        if path.exists():
            bytes_per_token, bytes_source = float(model_weight_bytes(path)), str(path)
        else:
            try:
                bytes_per_token, bytes_source = parse_bytes(args.weights), "given"
            except ValueError as exc:
                raise UsageError(f"--weights: {exc}; or give an existing path") from exc
    else:
        for arm in result["arms"]:
            argv = arm.get("argv") or []
            for flag in ("--model", "-m"):
                if flag in argv[:-1]:
                    model = Path(argv[argv.index(flag) + 1])
                    # A model the roofline cannot size (e.g. a Hugging Face id) just means no roofline.
                    with contextlib.suppress(ValueError):
                        bytes_per_token = float(model_weight_bytes(model))
                        bytes_source = f"{model} (file size)"
                    break
            if bytes_per_token:
                break
    bandwidth = band_source = None
    if args.bandwidth:
        try:
            bandwidth, band_source = parse_bandwidth(args.bandwidth), "given"
        except ValueError as exc:
            raise UsageError(f"--bandwidth: {exc}") from exc
    else:
        peaks = [g.get("peak_bw_gbps") for g in result["platform"].get("gpus", []) if g.get("peak_bw_gbps")]
        if peaks:
            bandwidth, band_source = peaks[0] * 1e9, "NVML (max memory clock × bus width)"
    if bytes_per_token is None and bandwidth is None:
        return None
    return {
        "bytes_per_token": bytes_per_token,
        "bytes_source": bytes_source,
        "bandwidth_bps": bandwidth,
        "bandwidth_source": band_source,
    }


def _validate_roofline_args(args: argparse.Namespace) -> None:
    from tui.compare.roofline import parse_bandwidth, parse_bytes

    if args.bandwidth:
        try:
            parse_bandwidth(args.bandwidth)
        except ValueError as exc:
            raise UsageError(f"--bandwidth: {exc}") from exc
    if args.weights and not Path(args.weights).expanduser().exists():
        try:
            parse_bytes(args.weights)
        except ValueError as exc:
            raise UsageError(f"--weights: {exc}; or give an existing path") from exc


def _progress(message: str) -> None:
    print(f"enginetop: {message}", file=sys.stderr, flush=True)


def _finish(args: argparse.Namespace, result: dict[str, Any], kind: str) -> int:
    from tui.base.paths import runs_dir
    from tui.compare.report import write_report
    from tui.compare.result_files import write_result

    out = args.output or runs_dir() / "compare" / f"{kind}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    result["roofline_input"] = _roofline_input(args, result)
    result["source_file"] = str(out)
    for path in write_result(result, out):
        _progress(f"wrote {path}")
    if args.report:
        _progress(f"wrote {write_report(result, args.report)}")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_summary(result)
    empty = [name for name, a in result["analysis"]["arms"].items() if a["blocks_used"] == 0]
    if empty:
        _progress(f"no usable block for: {', '.join(empty)}")
        return 1
    return 0


def _print_summary(result: dict[str, Any]) -> None:
    from tui.compare.analysis import arm_findings, verdict_words
    from tui.compare.sweep_param import best_value, margins, sweep_table

    def f(v: float | None, d: int = 1) -> str:
        return "n/a" if v is None else f"{v:.{d}f}"

    arms = result["analysis"]["arms"]
    drafting = any(a.get("spec") for a in arms.values())
    spec_head = f" {'accept':>7} {'mean len':>8}  per position" if drafting else ""
    print(f"{'arm':<36} {'decode tok/s':>12} {'J/token':>9} {'CV':>9} {'min-max':>15} {'TTFT ms':>8}  "
          f"{'verdict':<18}{spec_head}")
    for name, a in arms.items():
        d = a["decode_tps"]
        ttft = a["ttft_s"]["median"]
        jpt = (a.get("joules_per_token") or {}).get("median")
        line = (f"{name:<36} {f(d['median']):>12} {'n/a' if jpt is None else f'{jpt:.3g}':>9} "
                f"{f(a['instance_cv_pct']) + '%':>9} "
                f"{f(d['min']) + '-' + f(d['max']):>15} {f(ttft * 1000 if ttft else None, 0):>8}  "
                f"{verdict_words(a):<18}")
        if drafting:
            spec = a.get("spec") or {}
            rate = spec.get("acceptance_rate")
            per_pos = " ".join(f"{p * 100:.0f}%" for p in spec.get("per_position") or ())
            accept = "off" if not spec else "n/a" if rate is None else f"{rate * 100:.1f}%"
            length = "" if not spec else f(spec.get("mean_accepted_length"), 2)
            line += f" {accept:>7} {length:>8}  {per_pos}"
        print(line.rstrip())
    scopes = sorted({a["energy_scope"] for a in arms.values() if a.get("energy_scope")})
    if scopes:
        print(f"J/token: median over blocks of the energy of {', '.join(scopes)} over the tokens generated "
              "(prefills included)")
    else:
        notes = sorted({a["energy_note"] for a in arms.values() if a.get("energy_note")})
        print("J/token n/a: " + ("; ".join(notes) if notes else "no energy reading"))
    for cmp in result["analysis"]["comparisons"]:
        d = cmp["decode_tps"]
        print(
            f"{cmp['other']} / {cmp['base']}: decode ratio {f(d['ratio'], 3)} "
            f"[95% {f(d['ci_low'], 3)}, {f(d['ci_high'], 3)}]: {cmp['verdict']}"
        )
    if result["kind"] == "sweep":
        rows = sweep_table(result)
        best = best_value(rows)
        if best is None:
            print("no value was reproducible: do not pick one from these numbers")
        else:
            m = margins(rows, best)
            ahead = [f"{m['over_next']:.2f}x the next ({m['next']})"] if m["over_next"] else []
            ahead += [f"{m['over_off']:.2f}x speculation off ({m['off']})"] if m["over_off"] else []
            said = ": " + ", ".join(ahead) if ahead else ""
            print(f"best: {best['value']} at {best['decode_tps']:.1f} tok/s{said}")
    for arm in result["arms"]:
        config = next((i["config"] for i in result["instances"]
                       if i["arm"] == arm["name"] and i.get("config")), None)
        spec = (arms.get(arm["name"]) or {}).get("spec")
        for finding in arm_findings(arm["name"], config, spec):
            print(f"{arm['name']}: {finding['severity'].upper()} {finding['id']}: {finding['title']}")


# ---- commands ------------------------------------------------------------------------------------


def cmd_ab(args: argparse.Namespace) -> int:
    from tui.compare.ab import run_comparison
    from tui.compare.arms import ScheduleError, arms_from_profiles, choose_mode
    from tui.lifecycle.profiles import ProfileError
    from tui.run.targets import TargetError, parse_engine_spec

    try:
        _validate_roofline_args(args)
        if len(args.arms) < 2:
            raise UsageError("ab needs at least two arms (profile names or NAME=URL)")
        profiles = _load(args)
        named: list[tuple[str, Profile | None, EngineSpec | None]] = []
        for spec in args.arms:
            if _is_url(spec):
                parsed = parse_engine_spec(spec)
                named.append((parsed.name, None, parsed))
            else:
                named.append((spec, profiles.get(spec), None))
        names = [n for n, _, _ in named]
        if len(set(names)) != len(names):
            raise UsageError(f"each arm needs a distinct name, got {', '.join(names)}")
        gpu, has_gpu = _gpu_source()
        mode = choose_mode(args.mode, [p for _, p, _ in named], has_gpu)
        config = _config(args, mode)
        source = _block_source(args, config)
        arms = arms_from_profiles(named, mode, gpu)
    except (UsageError, ProfileError, TargetError, ScheduleError) as exc:
        print(f"enginetop ab: {exc}", file=sys.stderr)
        return 2
    units = " / ".join(sorted({arm.unit + "s" for arm in arms}))
    _progress(f"ab: {len(arms)} arms, {config.instances} {units} x {config.blocks} blocks, schedule {mode}")
    result = run_comparison(arms, config, gpu=gpu, progress=_progress, kind="ab", source=source)
    try:
        return _finish(args, result, "ab")
    except UsageError as exc:
        print(f"enginetop ab: {exc}", file=sys.stderr)
        return 2


def cmd_sweep(args: argparse.Namespace) -> int:
    from tui.compare.ab import run_comparison
    from tui.compare.arms import arms_from_profiles, choose_mode
    from tui.compare.sweep_param import parse_param_spec, sweep_profiles
    from tui.lifecycle.profiles import ProfileError

    try:
        _validate_roofline_args(args)
        spec = parse_param_spec(args.param)
        profile = _load(args).get(args.profile)
        derived = sweep_profiles(profile, spec)
        gpu, has_gpu = _gpu_source()
        mode = choose_mode(args.mode, [p for _, p in derived], has_gpu)
        config = _config(args, mode)
        source = _block_source(args, config)
        arms = arms_from_profiles([(name, p, None) for name, p in derived], mode, gpu)
    except (UsageError, ProfileError, ValueError) as exc:
        print(f"enginetop sweep-param: {exc}", file=sys.stderr)
        return 2
    for arm, value in zip(arms, spec.values, strict=True):
        arm.param = {"option": spec.option, "value": value}
    _progress(f"sweep-param: {spec.option} = {', '.join(spec.values)} on {profile.name}, schedule {mode}")
    extra = {"sweep": {"profile": profile.name, "option": spec.option, "values": list(spec.values)}}
    result = run_comparison(arms, config, gpu=gpu, progress=_progress, kind="sweep", extra=extra,
                            source=source)
    return _finish(args, result, "sweep")


def cmd_report(args: argparse.Namespace) -> int:
    from tui.compare.report import write_report
    from tui.compare.result_files import load_result
    from tui.record.report import is_recording
    from tui.workload.report import write_workload_report

    if is_recording(args.result):
        return _recording_report(args)
    if (workload := _workload_result(args.result)) is not None:
        try:
            print(write_workload_report(workload, args.output, str(args.result)))
        except (KeyError, TypeError, ValueError) as exc:
            print(f"enginetop report: {args.result} is incomplete or from another version: {exc!r}",
                  file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"enginetop report: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        return 0
    try:
        result = load_result(args.result)
    except ValueError as exc:
        print(f"enginetop report: {exc}", file=sys.stderr)
        return 2
    result.setdefault("source_file", str(args.result))
    try:
        path = write_report(result, args.output)
    except (KeyError, TypeError, ValueError) as exc:
        print(
            f"enginetop report: {args.result} is incomplete or from another version: {exc!r}", file=sys.stderr
        )
        return 2
    except OSError as exc:
        print(f"enginetop report: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _workload_result(path: Path) -> dict[str, Any] | None:
    """A bench or capacity result, or None when the file is something else (or unreadable: load_result
    says why)."""
    from tui.workload.report import is_workload_result

    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if is_workload_result(data) else None


def _recording_report(args: argparse.Namespace) -> int:
    from tui.record.reader import Recording
    from tui.record.report import write_recording_report
    from tui.record.schema import RecordingError

    try:
        rec = Recording(args.result)
        path = write_recording_report(rec, args.output)
    except RecordingError as exc:
        print(f"enginetop report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"enginetop report: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if rec.damage:
        print(f"enginetop report: {rec.damage}", file=sys.stderr)
    print(path)
    return 0
