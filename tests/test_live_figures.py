"""The figures the widgets used to compute themselves, made once below them (tui.live): the probe panel's
medians, the fleet table's GPU figures, the shares the bars draw. Real values in, exact figures out."""

from __future__ import annotations

from tui.live.fleet_gpus import fleet_gpus
from tui.live.probe_summary import MEDIAN_OF, probe_medians
from tui.live.shares import engine_shares, gpu_shares, host_shares, pct_share, share
from tui.model.config import EngineConfig
from tui.model.fleet_gpus import FleetGpus
from tui.model.probe_medians import ProbeMedians
from tui.model.samples import EngineReading, EngineSample, GpuReport, GpuSample, HostSample
from tui.model.shares import EngineShares, GpuShares, HostShares
from tui.model.slots import SlotsReading, SlotState
from tui.probe.results import ProbeResult
from tui.probe.timings import ServerTimings

GiB = 2**30


def probe(sent_at: float, ttft_s: float, decode_s: float, tokens: int, server: ServerTimings | None = None,
          error: str | None = None, chunks: bool = False) -> ProbeResult:
    first = sent_at + ttft_s
    return ProbeResult(engine="e", url="http://e", workload="short", index=0, wall_start=sent_at,
                       sent_at=sent_at, first_token_at=first, last_token_at=first + decode_s,
                       ended_at=first + decode_s, status=500 if error else 200, error=error,
                       completion_tokens=tokens, chunks=tokens, server=server,
                       token_source="chunks" if chunks else "server")


def llama(prompt_ms: float, per_second: float) -> ServerTimings:
    return ServerTimings(source="llamacpp", prompt_ms=prompt_ms, predicted_per_second=per_second)


def test_probe_medians_are_over_the_last_five_that_succeeded() -> None:
    results = [
        probe(0.0, 0.125, 1.0, 1001, llama(10.0, 900.0)),  # sixth from the end: out of the window
        probe(10.0, 0.125, 1.0, 65, llama(80.0, 70.0)),  # 64 tok/s
        probe(20.0, 0.25, 1.0, 33, llama(250.0, 40.0)),  # 32 tok/s
        probe(30.0, 0.375, 0.5, 51),  # 100 tok/s, no timings of the engine's own
        probe(40.0, 9.0, 1.0, 0, error="HTTP 500"),  # failed: left out
        probe(50.0, 0.5, 2.0, 97, llama(150.0, 50.0), chunks=True),  # 48 tok/s, counted from chunks
    ]
    assert MEDIAN_OF == 5
    assert probe_medians(results) == ProbeMedians(count=4, decode_tps=56.0, server_decode_tps=50.0,
                                                  ttft_s=0.3125, server_ttft_s=0.15, estimated=True)
    # the last two alone: one failed, the other's figures whole
    assert probe_medians(results, of=2) == ProbeMedians(count=1, decode_tps=48.0, server_decode_tps=50.0,
                                                        ttft_s=0.5, server_ttft_s=0.15, estimated=True)


def test_probe_medians_of_none_that_succeeded_say_none() -> None:
    assert probe_medians([]) == ProbeMedians(count=0)
    failed = probe_medians([probe(0.0, 0.1, 1.0, 0, error="refused")])
    assert failed == ProbeMedians(count=0)
    assert failed.decode_tps is None and failed.ttft_s is None and not failed.estimated


def test_fleet_gpus_mean_hottest_summed_and_throttled() -> None:
    gpus = (
        GpuSample(index=0, t=1.0, util_gpu_pct=80.0, power_w=300.5, temp_c=70.0, throttled=True,
                  throttle_reasons=("sw_power_cap", "idle")),
        # a reason on a GPU that is not throttled (a setting) is not the table's
        GpuSample(index=1, t=1.0, util_gpu_pct=40.0, power_w=250.0, temp_c=82.0,
                  throttle_reasons=("hw_slowdown",)),
        # no figure of its own: left out of the mean, the hottest and the sum
        GpuSample(index=2, t=1.0, throttled=True, throttle_reasons=("sw_power_cap", "hw_thermal")),
    )
    assert fleet_gpus(gpus) == FleetGpus(count=3, util_pct=60.0, temp_c=82.0, power_w=550.5,
                                         throttle=("hw_thermal", "sw_power_cap"))


def test_fleet_gpus_of_none_and_of_gpus_that_say_nothing() -> None:
    assert fleet_gpus(()) == FleetGpus(count=0, util_pct=None, temp_c=None, power_w=None, throttle=())
    # as the table always drew it: matched GPUs none of which says its power sum to 0 W
    assert fleet_gpus((GpuSample(index=0, t=1.0),)) == FleetGpus(count=1, power_w=0)


def test_share_and_pct_share() -> None:
    assert share(6 * GiB, 24 * GiB) == 0.25
    assert share(None, 24) is None and share(3, None) is None and share(3, 0) is None
    assert share(0, 4) == 0.0
    assert pct_share(37.5) == 0.375 and pct_share(None) is None and pct_share(0.0) == 0.0


def test_gpu_shares_each_gpu_in_the_reports_order() -> None:
    report = GpuReport(t=1.0, gpus=(
        GpuSample(index=0, t=1.0, util_gpu_pct=37.5, vram_used_bytes=6 * GiB, vram_total_bytes=24 * GiB),
        GpuSample(index=1, t=1.0, vram_total_bytes=24 * GiB),  # says neither its use nor what it holds
        GpuSample(index=2, t=1.0, util_gpu_pct=100.0, vram_used_bytes=GiB, vram_total_bytes=0),
    ))
    assert gpu_shares(report) == (GpuShares(util=0.375, memory=0.25), GpuShares(util=None, memory=None),
                                  GpuShares(util=1.0, memory=None))
    assert gpu_shares(None) == ()
    assert gpu_shares(GpuReport(t=1.0, unavailable="no NVIDIA driver")) == ()


def test_host_shares() -> None:
    host = HostSample(t=1.0, cpu_pct=12.5, cpu_count=16, ram_used_bytes=48 * GiB, ram_total_bytes=64 * GiB)
    assert host_shares(host) == HostShares(cpu=0.125, ram=0.75)
    assert host_shares(HostSample(t=1.0)) == HostShares(cpu=None, ram=None)


def engine(reading: EngineReading | None, slots: int | None = None,
           slot_states: tuple[SlotState, ...] | None = None) -> EngineSample:
    config = EngineConfig(engine="llama.cpp", read_wall=0.0, slots=slots) if slots is not None else None
    return EngineSample(name="e", url="http://e", t=1.0, wall=1.0, health="up", reading=reading,
                        config=config, slots=None if slot_states is None else SlotsReading(slots=slot_states))


def test_engine_shares_running_of_its_slots_and_its_kv() -> None:
    # llama.cpp: 3 of 4 slots running, no KV figure of its own: the /slots' estimate (1,500 of 4 x 1,000)
    held = tuple(SlotState(id=i, n_ctx=1000, processing=i < 3, task=i, prompt_tokens=n)
                 for i, n in enumerate((1000, 400, 100, 0)))
    llama_engine = engine(EngineReading(dialect="llamacpp", running=3.0), slots=4, slot_states=held)
    assert engine_shares(llama_engine) == EngineShares(running=0.75, kv=0.375)
    # vLLM: its own KV figure wins over any estimate; slots not known: no running share
    vllm_engine = engine(EngineReading(dialect="vllm", running=7.0, kv_cache_usage=0.5), slot_states=held)
    assert engine_shares(vllm_engine) == EngineShares(running=None, kv=0.5)
    nothing = EngineShares(running=None, kv=None)
    assert engine_shares(engine(None, slots=4)) == nothing
    assert engine_shares(engine(EngineReading(dialect="vllm"), slots=4)) == nothing
