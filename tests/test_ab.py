"""A/B runs against the loopback SSE server: a noisy arm is "not reproducible", a steady one reproducible."""

from __future__ import annotations

import random
import statistics

import pynvml
import pytest
from fake_pynvml import FakeNvml, rtx4090

from tests.sse_server import Scenario, SSEServer
from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.analysis import analyze
from tui.compare.engines import AttachedEngine, Started, Target
from tui.compare.report import render_html
from tui.model.samples import GpuReport
from tui.sources.gpu import GpuSampler


class SSEEngine:
    """Each start() is a fresh SSE server; `delay_for(instance)` sets its per-token delay."""

    attached = False

    def __init__(self, name: str, delay_for, jitter_s: float = 0.0) -> None:
        self.name = name
        self.delay_for = delay_for
        self.jitter_s = jitter_s
        self.server: SSEServer | None = None
        self.starts = 0

    def start(self) -> Started:
        scenario = Scenario(
            per_token_delay_s=self.delay_for(self.starts),
            jitter_s=self.jitter_s,
            first_token_delay_s=0.01,
            seed=self.starts,
        )
        self.server = SSEServer(default=scenario).start()
        self.starts += 1
        return Started(Target(self.name, self.server.url), cold_start_s=0.0, pid=None, log_path=None)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _config(**kw) -> ABConfig:
    base = dict(
        instances=3,
        blocks=2,
        requests_per_block=2,
        max_tokens=16,
        warmup_requests=1,
        mode="coresident",
        bootstrap_samples=500,
    )
    base.update(kw)
    return ABConfig(**base)


def test_noisy_arm_not_reproducible_steady_arm_reproducible() -> None:
    rng = random.Random(42)
    # Long per-token delays and requests keep a loaded 2-core machine's scheduling noise small next to them:
    # with 16 tokens (0.3 s a request) a stall on the engines' side once moved the steady arm's CV over 5 %
    noisy_delays = [rng.uniform(0.01, 0.06) for _ in range(3)]
    steady = SSEEngine("steady", lambda _i: 0.02)
    noisy = SSEEngine("noisy", lambda i: noisy_delays[i], jitter_s=0.003)
    result = run_comparison([Arm("steady", steady), Arm("noisy", noisy)], _config(max_tokens=32))
    arms = result["analysis"]["arms"]
    assert steady.starts == 3 and noisy.starts == 3  # every instance a fresh server
    assert arms["steady"]["verdict"] == "reproducible", arms["steady"]
    assert arms["noisy"]["verdict"] == "not reproducible", arms["noisy"]
    assert arms["noisy"]["instance_cv_pct"] > 5.0 > arms["steady"]["instance_cv_pct"]
    # 20 ms per token: decode ~50 tok/s, measured on the client clock with the server's token counts
    assert arms["steady"]["decode_tps"]["median"] == pytest.approx(50, rel=0.25)
    assert arms["steady"]["token_source"] == "server"
    assert arms["steady"]["blocks_used"] == 6
    cmp = result["analysis"]["comparisons"][0]
    assert cmp["base"] == "steady" and cmp["other"] == "noisy"
    assert cmp["decode_tps"]["ci_low"] <= cmp["decode_tps"]["ratio"] <= cmp["decode_tps"]["ci_high"]
    assert "noisy is not reproducible" in cmp["verdict"]


def test_blocks_alternate_arms_and_rounds_alternate_who_goes_first() -> None:
    a = SSEEngine("A", lambda _i: 0.002)
    b = SSEEngine("B", lambda _i: 0.002)
    result = run_comparison(
        [Arm("A", a), Arm("B", b)], _config(instances=2, requests_per_block=1, warmup_requests=0)
    )
    order = [(blk["arm"], blk["instance"]) for blk in sorted(result["blocks"], key=lambda x: x["seq"])]
    assert order == [("A", 0), ("B", 0), ("A", 0), ("B", 0), ("B", 1), ("A", 1), ("B", 1), ("A", 1)]


def test_switch_mode_runs_one_instance_at_a_time_abba() -> None:
    a = SSEEngine("A", lambda _i: 0.002)
    b = SSEEngine("B", lambda _i: 0.002)
    live: list[int] = []

    def gpu(engine_pids: dict[str, set[int]] | None = None) -> GpuReport:
        live.append(sum(e.server is not None for e in (a, b)))
        return GpuReport(t=0.0, unavailable="no GPU here")

    result = run_comparison(
        [Arm("A", a), Arm("B", b)],
        _config(instances=2, requests_per_block=1, warmup_requests=0, mode="switch"),
        gpu=gpu,
    )
    assert max(live) == 1  # never two engines at once
    starts = [(i["arm"], i["instance"]) for i in result["instances"]]
    assert starts == [("A", 0), ("B", 0), ("B", 1), ("A", 1)]
    assert result["blocks"][0]["gpu"]["unavailable"] == "no GPU here"


def test_throttled_blocks_are_flagged_and_can_be_excluded() -> None:
    """The real GpuSampler over pynvml's functions faked (no GPU here): SW thermal slowdown in block 1."""
    nvml = FakeNvml([rtx4090(util_gpu=90, power_mw=300_000, temp_c=45)])
    sampler = GpuSampler(nvml)
    calls = {"n": 0}

    def gpu(engine_pids=None):
        calls["n"] += 1
        hot = 2 <= calls["n"] <= 3  # the two samples around the first recorded block (after run start)
        nvml.set_clock_event_mask(0, pynvml.nvmlClocksEventReasonSwThermalSlowdown if hot else 0)
        nvml.gpus[0].temp_c = 83 if hot else 45
        return sampler.sample()

    a = SSEEngine("A", lambda _i: 0.002)
    cfg = _config(instances=1, blocks=3, requests_per_block=1, warmup_requests=0, gpu_interval_s=10.0)
    result = run_comparison([Arm("A", a)], cfg, gpu=gpu)
    blocks = sorted(result["blocks"], key=lambda x: x["seq"])
    assert [b["throttled"] for b in blocks] == [True, False, False]
    assert blocks[0]["gpu"]["throttle_reasons"] == ["thermal slowdown (SW)"]
    assert blocks[0]["gpu"]["temp_c_max"] == 83 and blocks[1]["gpu"]["temp_c_max"] == 45
    assert blocks[1]["gpu"]["power_w_mean"] == 300.0
    assert blocks[1]["gpu"]["util_gpu_pct_mean"] == 90.0
    assert result["platform"]["gpus"][0]["name"] == "NVIDIA GeForce RTX 4090"
    kept = result["analysis"]["arms"]["A"]
    assert kept["blocks_used"] == 3 and kept["blocks_throttled"] == 1
    result["config"]["exclude_throttled"] = True
    dropped = analyze(result)["arms"]["A"]
    assert dropped["blocks_used"] == 2 and dropped["blocks_excluded_throttled"] == 1


def test_bad_config_is_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="workload 'agent'"):
        _config(workload="agent").check()
    with pytest.raises(ValueError, match="at least 1"):
        _config(instances=0).check()


def test_attached_arms_are_rounds_in_the_progress_the_result_and_the_method() -> None:
    """Nothing is restarted for attached servers: no word of the run may say "instance" or a fresh start."""
    server = SSEServer(default=Scenario(per_token_delay_s=0.002, first_token_delay_s=0.01)).start()
    try:
        arms = [Arm(name, AttachedEngine(name, server.url), origin=f"watched at {server.url}")
                for name in ("A", "B")]
        messages: list[str] = []
        result = run_comparison(arms, _config(instances=2, requests_per_block=1), progress=messages.append)
    finally:
        server.stop()
    assert messages and not [m for m in messages if "instance" in m]
    assert "A: round 1" in messages and any(m.startswith("B: round 2 block 1:") for m in messages)
    facts = result["method"]
    assert facts["mode"] == "coresident"
    assert [(a["name"], a["restarted"], a["unit"], a["starts"]) for a in facts["arms"]] == [
        ("A", False, "round", 2), ("B", False, "round", 2)]
    assert all(not i["fresh"] for i in result["instances"])
    assert {a["instance_unit"] for a in result["analysis"]["arms"].values()} == {"rounds"}
    html = render_html(result)
    method = _method_text(html)
    assert "fresh engine start" not in method and "instance" not in method
    assert "never restarted (watched at" in method and "2 rounds in time" in method
    assert "all engines kept running side by side" in method
    assert "The GPU was not sampled: no GPU source was given to this run." in method
    assert "Inst." not in html and "<th>Round</th>" in html


def test_fresh_arms_method_says_fresh_starts_and_what_the_requests_used() -> None:
    a = SSEEngine("A", lambda _i: 0.002)
    b = SSEEngine("B", lambda _i: 0.002)
    result = run_comparison([Arm("A", a), Arm("B", b)], _config(instances=2, requests_per_block=1,
                                                               warmup_requests=1, mode="switch"))
    facts = result["method"]
    assert [(x["restarted"], x["starts"], x["warmup_sent"], x["warmup_ok"]) for x in facts["arms"]] == [
        (True, 2, 2, 2), (True, 2, 2, 2)]
    method = _method_text(render_html(result))
    # SSE servers started directly, not through the safe switch: the Method must not claim it was used
    assert "<b>A</b>: 2 fresh engine starts, cold start" in method
    assert "safe switch" not in method and "round" not in method.split("Schedule")[0]
    assert "Schedule <b>switch</b>: one engine at a time" in method
    assert "after each start (4 sent, 4 answered)" in method
    req = facts["requests"]
    assert req["max_tokens"] == 16 and req["temperature"] == 0 and req["ignore_eos"] is True
    assert req["params"]["seed"] == 0 and req["params"]["max_tokens"] == 16
    first = result["blocks"][0]["requests"][0]
    assert first["prompt_tokens"] and req["first_prompt_start"].startswith("[")
    assert f"began “{req['first_prompt_start']}" in method
    nonce = req["params"]["nonce"]  # drawn for this run (tui.probe.workloads), so no earlier run's prompts
    assert nonce and f"this run's nonce <b>{nonce}</b>" in method
    assert "opening the connection was measured apart" in method


def _method_text(html: str) -> str:
    return html[html.index("<h2>Method</h2>"):html.index("</ol>", html.index("<h2>Method</h2>"))]


def implied_verdict(result: dict, arm: str) -> tuple[float, str]:
    """The CV across instance (round) medians and its verdict, recomputed from the raw blocks with the
    standard library: what the data implies, independent of tui.compare's own arithmetic."""
    by_instance: dict[int, list[float]] = {}
    for b in result["blocks"]:
        if b["arm"] == arm and b["decode_tps"] is not None:
            by_instance.setdefault(b["instance"], []).append(b["decode_tps"])
    medians = [statistics.median(v) for _, v in sorted(by_instance.items())]
    cv = statistics.stdev(medians) / statistics.fmean(medians) * 100
    return cv, "reproducible" if cv <= result["config"]["cv_threshold_pct"] else "not reproducible"


def test_coresident_blocks_name_the_idle_arms_engine_to_the_gpu_source() -> None:
    """Both arms are up through a round: while A's block runs, B's engine (up, idle) is named to the GPU
    source too, so a GPU they share reads as shared with B, not with a process enginetop does not watch; in
    switch mode only the arm that runs is up, and only it is named."""
    named: list[set[str]] = []

    def gpu(engine_pids: dict[str, set[int]] | None = None) -> GpuReport:
        named.append(set(engine_pids or {}))
        return GpuReport(t=0.0, unavailable="no GPU here")

    a = SSEEngine("A", lambda _i: 0.002)
    b = SSEEngine("B", lambda _i: 0.002)
    run_comparison([Arm("A", a), Arm("B", b)], _config(instances=1, blocks=1, requests_per_block=1,
                                                       warmup_requests=0), gpu=gpu)
    blocks = [n for n in named if n]  # (a report outside the blocks names no one)
    assert blocks and all(n == {"A", "B"} for n in blocks), named
    named.clear()
    run_comparison([Arm("A", a), Arm("B", b)], _config(instances=1, blocks=1, requests_per_block=1,
                                                       warmup_requests=0, mode="switch"), gpu=gpu)
    assert {frozenset(n) for n in named if n} == {frozenset({"A"}), frozenset({"B"})}, named
