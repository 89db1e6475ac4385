"""`enginetop setup demo|vllm`: install what the bundled demo needs (tui.lifecycle.setup), for an enginetop
installed from a wheel; in a checkout the same is `make engine` / `make vllm`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tui.cli.options import EXIT_FAILED, EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("setup", help="install what the demo needs: `demo` (llama-server built from source, "
                                     "~8 min on 2 cores, and the model) or `vllm` (~3.4 GiB, its own venv)")
    p.add_argument("what", choices=["demo", "vllm"])
    p.add_argument("--rebuild", action="store_true",
                   help="demo: build llama-server again instead of reusing the cached build")
    p.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from tui.engines.llamacpp import EngineNotInstalled
    from tui.lifecycle.setup import SetupError, setup_demo, setup_vllm

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        if args.what == "demo":
            setup_demo(say, rebuild=args.rebuild)
        else:
            setup_vllm(say)
    except (SetupError, EngineNotInstalled, OSError) as exc:
        print(f"enginetop setup: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
