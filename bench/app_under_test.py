"""The dashboard, headless, as `bench_app.py` measures it: real pollers, real redraws, fake NVML GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fake_pynvml import FakeNvml, h200
from tui.app import AppConfig, EnginetopApp
from tui.sources.gpu import GpuSampler
from tui.targets import build_targets


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", action="append", required=True)
    args = parser.parse_args()
    config = AppConfig(targets=build_targets(args.engine), gpu_sampler=lambda: GpuSampler(FakeNvml([h200()])))
    EnginetopApp(config).run(headless=True, size=(200, 60))


if __name__ == "__main__":
    main()
