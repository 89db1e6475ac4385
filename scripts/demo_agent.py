"""A small coding agent's traffic, for trying capture-then-compare without an agent of your own.

    .venv/bin/python scripts/demo_agent.py http://127.0.0.1:8081 [--agents 3] [--turns 6] [--seed 0]

Each agent is one conversation (an agent loop): a long system prompt, a task, then turns that each append the
model's reply and a tool result (a file listing, a test log) with the next instruction, after a short think
time; every request streams. Point it at `enginetop proxy` with --trace to capture the session as a trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import httpx

SYSTEM = ("You are a coding agent working in a Python repository. Use the tools you are given, read their "
          "output carefully, and answer with the next action in one or two sentences. ") * 3
TASKS = ("Fix the failing test in tests/test_parser.py.", "Add a --json flag to the report command.",
         "Find why the cache hit rate dropped after the last change.", "Rename the module utils to helpers.")
TOOLS = ("$ ls src/\nparser.py report.py cache.py cli.py utils.py __init__.py\n",
         "$ pytest -q tests/test_parser.py\nF..\n"
         "FAILED tests/test_parser.py::test_empty - ValueError: no input\n",
         "$ git log --oneline -3\n4f2a1c0 cache: key by path\n9b1d2e7 report: totals\n1c0ffee cli: flags\n",
         "$ grep -n 'def parse' src/parser.py\n12:def parse(text):\n48:def parse_line(line):\n")


async def agent(client: httpx.AsyncClient, url: str, i: int, turns: int, rng: random.Random) -> int:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[i % len(TASKS)]}]
    sent = 0
    for turn in range(turns):
        reply = []
        async with client.stream("POST", f"{url}/v1/chat/completions", json={
                "messages": messages, "max_tokens": 48, "temperature": 0.7, "seed": i * 100 + turn,
                "stream": True}) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices") or ():
                        reply.append((choice.get("delta") or {}).get("content") or "")
        sent += 1
        tool = TOOLS[(i + turn) % len(TOOLS)]
        messages += [{"role": "assistant", "content": "".join(reply)},
                     {"role": "user", "content": f"Tool output:\n{tool}\nWhat next?"}]
        await asyncio.sleep(rng.uniform(0.5, 2.0))  # the agent "thinks" (runs its tool)
    return sent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="base URL, e.g. the proxy's http://127.0.0.1:8081")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=300) as client:
        sent = await asyncio.gather(*(agent(client, args.url.rstrip("/"), i, args.turns, rng)
                                      for i in range(args.agents)))
    print(f"{sum(sent)} requests from {args.agents} agents")


if __name__ == "__main__":
    asyncio.run(main())
