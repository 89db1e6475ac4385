"""Time parse_reading (pre-filter + prometheus_client parser + normalisation) on the fixture bodies.

Target: the ~3,000-line vLLM 0.33 body in under 5 ms. For comparison it also times prometheus_client's
parser on the whole body, which is what the pre-filter avoids.

Run: .venv/bin/python bench/bench_parse.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
