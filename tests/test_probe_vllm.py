"""The engine's own TTFT beside the client's on the real vLLM (CPU build, tiny model, per-request metrics).

vLLM's API server detokenizes and writes every stream on one event loop. With 48 other streams running
on the tiny model (sent by another process, so the probing client itself stays idle), its engine still
makes a probe's first token ~10-15 ms after scheduling it (no queue: the batch has room), while the busy
frontend hands it to the client ~25-45 ms after the send, connect ~0.4 ms (seen here; a quiet server is
~3-8 ms behind, not enough to flag). The probe must flag that gap and call it frontend bound.
A missing install fails (`make vllm`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tui.engines import models
from tui.model.targets import EngineTarget
from tui.probe.client import ProbeClient
from tui.probe.workloads import WorkloadParams, run_workload

ROOT = Path(__file__).resolve().parents[1]
FRONTEND = "frontend or detokenizer bound"
LOAD_STREAMS = 48
# The busy frontend's delay is about the engine's own TTFT again (ratios of 1.85-6.3 seen on CI's machine),
# so the test flags above 1.5x: what it checks is the flag and its cause, not where the default sits.
FACTOR = 1.5
# The load: long streams from another process, as another user of the engine would send them.
LOAD = """
import asyncio, sys
from tui.engines import models
from tui.probe.client import ProbeClient, ProbeLimits
from tui.probe.workloads import WorkloadParams, request_body
from tui.sources.engine import EngineTarget

async def stream_forever(client, target, params, i):
    # A stream that ends (EOS, length cap) is sent again at once, so the load lasts until it is killed
    # however fast the machine decodes; a failed request ends the process, which the test sees.
    while True:
        result = await client.chat(target, request_body("short", params, i))
        if not result.ok:
            sys.exit(f"load stream {i}: {result.error}")

async def main(url, streams):
    params = WorkloadParams(max_tokens=1500, model=models.TINY_NAME)
    # A load on a loaded machine (CI: the other worker busy too) once took over 5 s to connect; the load
    # must last, not measure connects, so it waits as long as a request may.
    async with ProbeClient(ProbeLimits(connect_s=60.0)) as client:
        target = EngineTarget(name="load", url=url)
        await asyncio.gather(*(stream_forever(client, target, params, i) for i in range(streams)))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def cli_probe(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui", "probe", "--engine", url, "--model", models.TINY_NAME,
         "--max-tokens", "64", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


async def test_a_busy_frontend_is_flagged_beside_the_engines_own_ttft(vllm_server) -> None:
    target = EngineTarget(name="vllm", url=vllm_server.url)
    load = subprocess.Popen([sys.executable, "-c", LOAD, vllm_server.url, str(LOAD_STREAMS)], cwd=ROOT)
    try:
        await asyncio.sleep(2.0)  # every load stream is decoding
        assert load.poll() is None, "the load failed to start"
        params = WorkloadParams(max_tokens=64, model=models.TINY_NAME)
        async with ProbeClient() as client:
            results = [r async for r in run_workload(client, target, "short", params, 4)]
        table = cli_probe(vllm_server.url, "--repeat", "2", "--ttft-gap-factor", str(FACTOR))
        quiet = cli_probe(vllm_server.url, "--repeat", "1", "--json", "--ttft-gap-factor", "1000")
        assert load.poll() is None, "the load failed before the measurements ended"
    finally:
        load.kill()
        load.wait()

    for r in results:
        assert r.ok, r.error
        assert r.server is not None and r.server.source == "vllm" and r.server.ttft_ms is not None
        assert r.server_ttft_s == r.server.ttft_ms / 1000 and r.server_queue_s is not None
        assert r.ttft_s is not None and r.connect_s is not None
    flagged = [(r, gap) for r in results if (gap := r.ttft_gap(FACTOR)) is not None]
    assert len(flagged) >= 3, [(r.ttft_s, r.server_ttft_s, r.server_queue_s, r.connect_s) for r in results]
    frontend = 0
    for r, gap in flagged:
        assert gap.client_s == r.ttft_s and gap.server_s == r.server_ttft_s and gap.ratio > FACTOR
        if gap.cause.startswith(f"{FRONTEND}: the engine had the first token after"):
            frontend += 1
        else:  # once on CI's two busy cores the probe's own connect took 37 ms, and was named as the cause
            assert gap.cause.startswith(f"a slow connection path: connecting alone took "
                                        f"{r.connect_s * 1000:.0f} ms"), gap.cause
    assert frontend >= 2, [gap.cause for _, gap in flagged]

    assert table.returncode == 0, table.stderr
    assert "srv TTFT" in table.stdout and f"likely {FRONTEND}" in table.stdout, table.stdout
    assert quiet.returncode == 0, quiet.stderr
    request = json.loads(quiet.stdout.splitlines()[0])
    assert request["server_ttft_s"] is not None and request["ttft_gap"] is None  # the user's factor rules


async def test_a_long_prefill_probe_asks_for_progress_and_vllm_answers_it_all_the_same(vllm_server) -> None:
    """The long-prefill body carries llama-server's `return_progress`: vLLM ignores the field it does not
    know (it logs it) and answers as usual, with no progress reported."""
    seen = []
    target = EngineTarget(name="vllm", url=vllm_server.url)
    async with ProbeClient() as client:
        [result] = [r async for r in run_workload(client, target, "long-prefill",
                                                  WorkloadParams(prompt_tokens=300, model=models.TINY_NAME),
                                                  1, seen.append)]
    assert result.ok, result.error
    assert result.prompt_tokens is not None and result.prompt_tokens > 200 and seen == []
