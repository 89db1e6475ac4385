"""`enginetop exporter`: probe engines on a schedule and serve the results on /metrics, headless.

Exit status: 0 after SIGTERM/SIGINT/SIGHUP, 2 for bad input (an unknown workload, a --listen port in use,
a non-loopback --listen without --allow-remote, a bad engine or key).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from tui.cli.options import EXIT_BAD_INPUT, add_targets

if TYPE_CHECKING:
    from tui.exporter.metrics import ProbeMetrics
    from tui.exporter.schedule import ProbeScheduler, Schedule
    from tui.model.targets import EngineTarget
    from tui.probe.results import ProbeResult

DEFAULT_LISTEN = "127.0.0.1:9469"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "exporter", help="probe engines on a schedule and serve the results as Prometheus metrics",
        description="Probe every engine with each workload once per --probe-every seconds (spread out and "
                    "jittered, never two probes at once on an engine) and serve what a client measured "
                    "on http://LISTEN/metrics. Engines are probed, never started.")
    add_targets(p, profiles=True)
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help="where /metrics is served (default %(default)s; loopback unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen (the exporter has no authentication)")
    p.add_argument("--probe-every", type=float, default=30.0, metavar="SECONDS",
                   help="each workload on each engine once per this many seconds (default %(default)g)")
    p.add_argument("--workload", default="short", metavar="LIST",
                   help="comma-separated workloads: short, long-prefill, agent, thinking-off (default short)")
    p.add_argument("--agent-turns", type=int, default=3, help="turns of each agent conversation (default 3)")
    p.add_argument("--jitter", type=float, default=0.1, help="± share of each gap drawn at random (0.1)")
    p.add_argument("--max-tokens", type=int, default=None, help="output tokens per request "
                   "(default: the workload's own, as `enginetop probe`)")
    p.add_argument("--prompt-tokens", type=int, default=8192, help="long-prefill: prompt length in tokens")
    p.add_argument("--model", default=None, help="model name to send (default: none; the server's own)")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds of silence before a request fails")
    p.add_argument("--rounds", type=int, default=None,
                   help="stop probing after N rounds and keep serving the last figures (default: never)")
    p.add_argument("--traffic", action="append", metavar="URL", default=[],
                   help="also read a separate `enginetop proxy` (e.g. http://127.0.0.1:8081, repeatable): "
                        "the per-request series of an engine without them (llama.cpp), from its answers")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="level of the log on stderr")
    p.set_defaults(func=cmd_exporter)


def profile_targets(names: list[str] | None) -> list[EngineTarget]:
    """The engines of these profiles at their URLs (probed, never started); a key file that cannot be read
    is an error."""
    # imported when the command runs, so --help and the other commands never pay for it
    from tui.lifecycle.profile_files import load_profiles
    from tui.run.targets import profile_target

    if not names:
        return []
    loaded = load_profiles()
    return [profile_target(loaded.get(name), strict=True) for name in names]


def _schedule(args: argparse.Namespace) -> Schedule:
    from tui.exporter.schedule import Schedule, parse_workloads
    from tui.probe.workloads import WorkloadParams

    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.prompt_tokens < 1:
        raise ValueError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout:g}")
    params = WorkloadParams(max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
                            ignore_eos=not args.no_ignore_eos, model=args.model)
    return Schedule(every_s=args.probe_every, workloads=parse_workloads(args.workload), jitter=args.jitter,
                    agent_turns=args.agent_turns, params=params, rounds=args.rounds)


def _targets(args: argparse.Namespace) -> list[EngineTarget]:
    from tui.net.policy import public_url
    from tui.run.targets import build_targets

    targets = build_targets(args.engine, args.api_key_file, args.api_key_env) + profile_targets(args.profile)
    if not targets:
        raise ValueError("give at least one --engine NAME=URL or --profile NAME to probe")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError("two engines share a name: give each --engine a distinct NAME=")
    by_url: dict[str, str] = {}
    for t in targets:
        # Two names for one URL would be probed twice as often and by two loops that could overlap.
        if (other := by_url.setdefault(t.base, t.name)) != t.name:
            raise ValueError(f"{other} and {t.name} are the same engine ({public_url(t.base)}): give it once")
    return targets


class _UpLog:
    """One log line when an engine's probes start failing or recover, not one per failed probe."""

    def __init__(self, metrics: ProbeMetrics) -> None:
        import logging

        self.metrics = metrics
        self.down: dict[str, bool] = {}
        self.log = logging.getLogger("tui.exporter")

    def __call__(self, result: ProbeResult) -> None:
        self.metrics.observe(result)
        was_down = self.down.get(result.engine)
        self.down[result.engine] = not result.ok
        if not result.ok and not was_down:
            self.log.warning("%s: probe failed (%s): %s", result.engine, result.failure, result.error)
        elif result.ok and was_down:
            self.log.warning("%s: probes succeed again", result.engine)


async def probe_until_stopped(scheduler: ProbeScheduler,
                              watch: Coroutine[Any, Any, None] | None = None) -> None:
    """Probe (and `watch` the engines' own figures) until SIGTERM, SIGINT or SIGHUP; the HTTP server runs on
    its own threads meanwhile."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(scheduler.run())]
    if watch is not None:
        tasks.append(asyncio.create_task(watch))
    await stop.wait()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def cmd_exporter(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from prometheus_client import disable_created_metrics

    from tui.exporter.metrics import ProbeMetrics
    from tui.exporter.schedule import ProbeScheduler
    from tui.exporter.serve import serve as serve_metrics
    from tui.exporter.watch import watch_engines
    from tui.net.listen import ListenError, bind_message, check_free, parse_listen
    from tui.probe.client import ProbeLimits
    from tui.probe.runner import ProbeRunner

    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        listen = parse_listen(args.listen, args.allow_remote)
        schedule = _schedule(args)
        targets = _targets(args)
        check_free(listen)
        for url in args.traffic:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--traffic: expected the proxy's http(s) URL, got {url!r}")
    except (ListenError, ValueError) as exc:  # TargetError, SecretError and ProfileError are ValueErrors
        print(f"enginetop exporter: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # `_created` series double the text a scrape reads and no rule here uses them.
    disable_created_metrics()
    metrics = ProbeMetrics()
    for target in targets:
        for workload in schedule.workloads:
            metrics.declare(target.name, workload)
    try:
        server = serve_metrics(metrics, listen.host, listen.port)
    except OSError as exc:  # lost a race for the port since check_free
        print(f"enginetop exporter: {bind_message(listen, exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"enginetop exporter: serving http://{listen.display}/metrics; probing {len(targets)} engine(s) "
          f"({', '.join(t.name for t in targets)}) with {', '.join(schedule.workloads)} every "
          f"{schedule.every_s:g} s", file=sys.stderr, flush=True)
    runner = ProbeRunner(ProbeLimits(read_s=args.timeout))
    scheduler = ProbeScheduler(targets, schedule, _UpLog(metrics), runner)
    try:
        watch = watch_engines(targets, metrics, min(schedule.every_s, 30.0), traffic=args.traffic)
        asyncio.run(probe_until_stopped(scheduler, watch))
    finally:
        server.shutdown()
        server.server_close()
    print("enginetop exporter: stopped", file=sys.stderr)
    return 0
