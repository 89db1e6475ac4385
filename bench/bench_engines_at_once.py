"""Why the engine tests run one at a time (tests/conftest.py): two demo llama-servers (2 threads each, on a
2-core machine) asked for the same generation at once, with llama.cpp's default wait for work (no
`--poll`: its threads spin) and with threads that wait asleep (`--poll 0`).

    .venv/bin/python bench/bench_engines_at_once.py [--tokens 64] [--rounds 3]

Printed, each way: decode tok/s (the server's own `timings.predicted_per_second`) of one server alone, and
of each of the two at once, each round (the spinning case varies a lot from round to round).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/conftest.py imports its helpers by name

from tests.conftest import start_llama  # noqa: E402
from tui.base.process import Launched, stop_group  # noqa: E402


def start(poll: bool) -> tuple[Launched, str]:
    engine = start_llama("bench-at-once", "--threads", "2", *(["--poll", "0"] if poll else []))
    return engine.launched, engine.url


def decode_tps(url: str, tokens: int) -> float:
    body = {"prompt": "Once upon a time", "n_predict": tokens, "cache_prompt": False}
    reply = httpx.post(f"{url}/completion", json=body, timeout=600).json()
    return float(reply["timings"]["predicted_per_second"])


def at_once(urls: list[str], tokens: int) -> list[float]:
    rates: list[float] = [0.0] * len(urls)

    def one(i: int) -> None:
        rates[i] = decode_tps(urls[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for poll in (False, True):
        servers = [start(poll), start(poll)]
        try:
            urls = [url for _, url in servers]
            at_once(urls, 8)  # warm: the first generation of a server is slower
            rounds = [(decode_tps(urls[0], args.tokens), at_once(urls, args.tokens))
                      for _ in range(args.rounds)]
        finally:
            for launched, _ in servers:
                stop_group(launched)
        way = "--poll 0  " if poll else "no --poll "
        print(f"{way}: " + "; ".join(f"alone {alone:.1f}, two at once {both[0]:.1f} + {both[1]:.1f} tok/s"
                                    for alone, both in rounds))


if __name__ == "__main__":
    main()
