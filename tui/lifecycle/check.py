"""`python -m tui.lifecycle.check` (`make engine` runs it): the bundled demo engine is installed, and it runs.

With --check it is started once, on a free port, exactly as a profile starts an engine (tui.lifecycle:
launch, then the one ready-wait: port, /health, a real 1-token completion), and stopped again. A build can
install fine and still die at its first matrix multiply (an instruction the CPU or the VM refuses), which
only a real request shows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tui.base.install import how_to
from tui.base.process import free_port
from tui.engines.install_llamacpp import EngineNotInstalled, demo_model_path, llama_server_binary
from tui.lifecycle.engine import StepError, exit_words, launch_instance, stop_instance, wait_ready
from tui.lifecycle.profile_files import load_profiles
from tui.lifecycle.profile_resolve import resolve
from tui.lifecycle.profiles import ProfileError

DEMO_PROFILE = "demo-cpu-threads2"


def smoke_test(timeout: float = 120.0) -> str | None:
    """Start the demo engine once and ask it for one token: None when it answers, else why not."""
    demo = load_profiles().get(DEMO_PROFILE)
    profile = dataclasses.replace(demo, port=free_port(), start_timeout_s=timeout)
    instance = launch_instance(resolve(profile))
    try:
        wait_ready(instance)
        return None
    except StepError as exc:
        code = instance.exit_code()
        if code is None:
            return f"llama-server gave no token within {timeout:g}s: {exc} (log: {instance.log_path})"
        tail = "\n".join(instance.log_tail()[-5:])
        return (f"llama-server died ({exit_words(code)}) before its first answer: this build does not run "
                f"here: {how_to('rebuild-engine')}.\n"
                f"{tail}")
    finally:
        stop_instance(instance)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the bundled demo engine is installed and runs.")
    parser.add_argument("--check", action="store_true",
                        help="also start it once and ask for one token (a few seconds)")
    args = parser.parse_args(argv)
    try:
        print(f"llama-server: {llama_server_binary()}")
        print(f"demo model:   {demo_model_path()}")
    except EngineNotInstalled as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 1
    if args.check:
        try:
            problem = smoke_test()
        except (ProfileError, StepError) as exc:
            problem = str(exc)
        if problem is not None:
            print(f"enginetop: {problem}", file=sys.stderr)
            return 1
        print("llama-server answered a request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
