"""The fleet view, headless, as `bench_fleet.py` measures it: real Prometheus reads, real redraws."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tui.fleet.options import FleetOptions
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--refresh", type=float, default=5.0)
    args = parser.parse_args()
    options = FleetOptions(prometheus=args.prometheus, refresh_s=args.refresh)
    config = AppConfig(fleet=options, horizon_s=1800.0)
    EnginetopApp(config).run(headless=True, size=(220, 60))


if __name__ == "__main__":
    main()
