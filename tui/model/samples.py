"""Typed, immutable samples that every source returns and every widget draws.

"Not available" is always `None` (JSON null, shown as "n/a"): a value the source does not expose is
never reported as 0, and no sampler raises for missing data; a failure becomes a readable `error`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tui.model.config import EngineConfig
from tui.model.containers import CgroupReading, Container
from tui.model.slots import SlotsReading

Health = Literal["up", "loading", "starting", "down"]
Dialect = Literal["llamacpp", "vllm", "sglang", "unknown"]

# Histograms are kept as cumulative bucket counts summed over label sets: ((upper_bound, count), ...)
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One scrape of an engine's /metrics, normalised across dialects. Cumulative values, not rates."""

    dialect: Dialect
    # gauges
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # fraction 0..1
    # counters (cumulative since the engine started)
    prompt_tokens_processed_total: float | None = None  # every prompt token, cache hits included
    prompt_tokens_computed_total: float | None = None  # prefilled: cache hits excluded (exact counter)
    prompt_tokens_cached_total: float | None = None  # served from a prefix/prompt cache
    generation_tokens_total: float | None = None
    generation_seconds_total: float | None = None  # llama.cpp only: busy time decoding
    prefix_cache_queries_total: float | None = None  # tokens looked up in the prefix cache
    prefix_cache_hits_total: float | None = None  # tokens served from it
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    spec_accepted_per_pos: tuple[float, ...] | None = None  # accepted tokens per draft position, 0 first
    requests_finished_total: float | None = None
    # gauges that some engines compute themselves (SGLang), used when counters are absent
    cache_hit_rate_gauge: float | None = None
    spec_accept_rate_gauge: float | None = None
    spec_accept_length_gauge: float | None = None
    # histograms (vLLM, SGLang)
    ttft_buckets: Buckets | None = None
    itl_buckets: Buckets | None = None
    # Each request's life as the engine itself saw it (vLLM; SGLang where it publishes one): the time in
    # each phase, its prompt and generation lengths, how it ended, preemptions, tokens per engine step
    queue_buckets: Buckets | None = None
    prefill_buckets: Buckets | None = None
    decode_buckets: Buckets | None = None
    e2e_buckets: Buckets | None = None
    prompt_len_buckets: Buckets | None = None
    prompt_len_sum: float | None = None
    gen_len_buckets: Buckets | None = None
    gen_len_sum: float | None = None
    finish_reasons: tuple[tuple[str, float], ...] | None = None  # (stop | length | abort | error, count)
    preemptions_total: float | None = None
    iteration_tokens_sum: float | None = None  # tokens over every engine step...
    iteration_steps_total: float | None = None  # ...and the steps: tokens per iteration
    # where the figures came from when not the engine's /metrics: "/slots" (llama-server without --metrics,
    # counted from its slots by tui.sources.slot_counters)
    origin: str | None = None
    # the proxy's only: requests that ended "length" before the max_tokens their client asked for (or with
    # none asked): the context, not the client, cut them. vLLM refuses what would not fit, so its "length"
    # is this already; llama.cpp says "length" for both.
    length_unasked: float | None = None
    # origin "/slots" only: requests whose last tokens, or all of them, ended between two readings of /slots
    # and so are not in generation_tokens_total (said beside the rate, never hidden in it)
    slots_uncounted_total: float | None = None
    # llama.cpp with --metrics: the tokens its running requests generated so far, from /slots (its counter
    # moves only when a request ends), counted in generation_tokens_total ahead of the counter (None: none)
    generation_in_progress: float | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the dashboard shows for one engine over one window: rates and quantiles, None = n/a."""

    prompt_processed_tps: float | None = None  # prompt tokens per second, cache hits included
    prompt_computed_tps: float | None = None  # prompt tokens per second prefilled (no cache hits)
    gen_tps: float | None = None
    decode_tps_busy: float | None = None  # llama.cpp: generated tokens per second of decode time
    prefix_cache_hit_rate: float | None = None
    spec_accept_rate: float | None = None
    spec_accept_length: float | None = None  # tokens a draft step gives: 1 + accepted / drafts
    spec_accept_per_pos: tuple[float, ...] | None = None  # drafts whose token at each position was accepted
    spec_drafts_per_s: float | None = None
    # The same since the engine started (its counters' totals): figures even when nothing ran in the window
    spec_accept_rate_total: float | None = None
    spec_accept_length_total: float | None = None
    spec_accept_per_pos_total: tuple[float, ...] | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    counter_reset: bool = False  # the engine restarted (a counter went backwards) within the window
    requests: RequestStats | None = None  # each request's life, where the engine publishes it (vLLM, SGLang)
    # Energy per generated token over the rate window (tui.sources.energy.attribute): the watts of what the
    # engine runs on (its GPUs, or the CPU package for an engine on this machine's CPU) over its gen tok/s.
    energy_w: float | None = None  # average power of `energy_scope` over the window
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    energy_source: str | None = None  # "counter" | "power × time" | "counter + power × time" (GPUs differ)
    # whose energy: "engine" (it alone holds its GPUs), "gpu 0" / "gpu 0+1" (shared: per GPU, over the tokens
    # of every watched engine on them, `energy_shared_with` says with whom), "cpu package"
    energy_scope: str | None = None
    energy_shared_with: tuple[str, ...] = ()
    energy_note: str | None = None  # why there is no figure, in the one line a user needs (RAPL root-only)


Quantiles = tuple[float | None, float | None, float | None]  # p50, p90, p99


@dataclass(frozen=True, slots=True)
class RequestStats:
    """The requests that ended in the window as the engine itself timed and counted them (vLLM's per-request
    histograms and counters, SGLang's where it has them): quantiles from the histograms' deltas over the same
    window as TTFT, None where the engine publishes no such series or nothing ended."""

    window_s: float
    ended: float | None = None  # requests that ended in the window
    requests_per_s: float | None = None
    queue_s: Quantiles | None = None  # waiting to be scheduled
    prefill_s: Quantiles | None = None  # scheduled to first token
    decode_s: Quantiles | None = None  # first token to last
    e2e_s: Quantiles | None = None  # arrival to last token
    prompt_len: tuple[float | None, float | None, float | None] | None = None  # avg, p50, p90 tokens
    gen_len: tuple[float | None, float | None, float | None] | None = None  # avg, p50, p90 tokens
    finish_window: tuple[tuple[str, float], ...] = ()  # (reason, requests) in the window
    finish_total: tuple[tuple[str, float], ...] = ()  # (reason, requests) since the engine started
    preemptions_per_s: float | None = None
    tokens_per_step: float | None = None  # tokens the engine computed per step (prompt + generated)
    busy_share: float | None = None  # share of the window's polls that found a request running
    gen_tps_serving: float | None = None  # generation tok/s over the time it was serving (busy share)
    kv_usage_max: float | None = None  # the fullest the KV pool was at a poll in the window
    # None: the engine's own series; "proxy": the requests relayed by enginetop's proxy (an engine that
    # publishes no per-request series, as llama.cpp: lengths and finish reasons from its answers, prefill
    # and decode from its `timings`, end to end as the client saw it)
    origin: str | None = None
    # the proxy's only: requests that ended "length" before the max_tokens their client asked for (or with
    # none asked): the context, not the client, cut them. vLLM refuses what would not fit, so its "length"
    # is this already; llama.cpp says "length" for both.
    length_unasked: float | None = None


@dataclass(frozen=True, slots=True)
class RoutedModel:
    """One model behind a llama-server in router mode (GET /models) or llama-swap (GET /running): its status
    in their words, and for a loaded (ready) one its own /metrics and /slots, read so that looking never
    loads a model (autoload=false; llama-swap: only while /running says ready)."""

    id: str
    status: str  # downloading, downloaded, unloaded, loading, loaded, sleeping
    failed: bool = False  # its last load failed (status "unloaded" with failed: true)
    exit_code: int | None = None  # of the failed child process
    reading: EngineReading | None = None  # a loaded model's /metrics
    slots: SlotsReading | None = None  # a loaded model's /slots
    error: str | None = None  # a loaded model's figures could not be read
    in_flight: int | None = None  # llama-swap: requests to it in flight (its event stream); None: unknown
    oldest_ms: int | None = None  # llama-swap: how long the oldest of them has run
    progress: float | None = None  # router: share of a loading model's load done (its event stream)
    # Ollama's and LM Studio's own account of a model (tui.sources.native_servers): the memory it takes and
    # its part on the GPU, its context, its quantization and size, and when Ollama unloads it (keep-alive)
    size_bytes: int | None = None
    vram_bytes: int | None = None
    context_tokens: int | None = None
    quantization: str | None = None
    parameters: str | None = None  # "268.10M", as the server says it
    family: str | None = None  # its architecture
    expires_wall: float | None = None  # the keep-alive's end (wall time); None: not said


# What serves several models behind one address: llama-server in router mode, llama-swap, Ollama, LM Studio.
RouterKind = Literal["llama-server", "llama-swap", "ollama", "lm-studio"]


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One poll of one engine: health, model, and (when /metrics answered) a reading."""

    name: str
    url: str
    t: float  # time.monotonic() when the poll finished
    wall: float  # time.time(), for recordings and reports
    health: Health
    health_reason: str | None = None  # why it is not "up", in words a user can act on
    model: str | None = None
    reading: EngineReading | None = None
    metrics_error: str | None = None  # /metrics failed while health may still be fine
    # Figures a source computed itself (Prometheus' rates and quantiles): the store shows them as they are
    # instead of deriving them from successive readings. None for engines polled directly.
    stats: EngineStats | None = None
    # Engines read through a Prometheus (tui.fleet): the scrape labels that tell them apart, the node
    job: str | None = None
    instance: str | None = None
    host: str | None = None
    labels: tuple[tuple[str, str], ...] = ()  # model_name, engine (data-parallel rank) where present
    stale: bool = False  # the source could not refresh it: these are the last good values
    alerts: tuple[str, ...] = ()  # what is wrong beyond health, in words (tui.fleet.alerts)
    slots: SlotsReading | None = None  # llama-server's /slots, polled beside its /metrics
    models: tuple[RoutedModel, ...] | None = None  # a router's models (None: not one)
    router: RouterKind | None = None  # what serves those models
    # What the engine is really set to (tui.sources.config), read at its start and now and then since: every
    # sample of the engine carries the last one read
    config: EngineConfig | None = None


THROTTLE_REASON_WORDS: dict[int, str] = {
    0x001: "idle",
    0x002: "applications clocks setting",
    0x004: "power cap",
    0x008: "HW slowdown",
    0x010: "sync boost",
    0x020: "thermal slowdown (SW)",
    0x040: "thermal slowdown (HW)",
    0x080: "power brake",
    0x100: "display clock setting",
}
# Reasons that mean "slower than it could be" rather than "nothing to do" or "user-set clocks".
REAL_THROTTLE_MASK = 0x004 | 0x008 | 0x010 | 0x020 | 0x040 | 0x080


EnergySource = Literal["counter", "power × time"]


@dataclass(frozen=True, slots=True)
class EnergyWindow:
    """Energy over the store's window for one GPU or the CPU package (tui.sources.energy): the change of the
    device's own energy counter, or power x time where the counter is missing or did not advance, never the
    two mixed in one figure. Derived by the store, never recorded (the counter itself is)."""

    seconds: float
    joules: float
    watts: float  # joules / seconds
    source: EnergySource
    idle_w: float | None = None  # its draw while the engines on it served nothing (the latest such stretch)
    note: str | None = None  # e.g. why power x time stood in for the counter


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    engine: str | None = None  # name of the watched engine whose process tree holds this PID
    graphics: bool = False  # listed by NVML as a graphics process only (a desktop's Xorg, a compositor)
    # the container a process no watched engine owns runs in, "runtime short-id" ("podman 3d8f423a11bc"), from
    # its /proc/PID/cgroup (tui.sources.container_of); None: on the host, an engine's, or not known
    container: str | None = None
    host_memory: bool = False  # used_bytes is its resident memory on the host (a unified-memory GPU's share)


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    t: float
    name: str | None = None
    uuid: str | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None  # memory-controller utilisation
    mem_bw_gbps: float | None = None
    mem_bw_pct: float | None = None
    mem_bw_source: str | None = None  # "gpm" (Hopper+ DRAM_BW_UTIL) or "util.memory x peak"
    peak_bw_gbps: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    vram_used_bytes: int | None = None
    vram_total_bytes: int | None = None
    clock_event_mask: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # every active reason, in words (AMD's and Intel's from sysfs too)
    throttled: bool = False  # a real throttle reason (not idle / settings) is active
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None  # e.g. "GPU is lost"
    host: str | None = None  # the node it is in, for GPUs read remotely (dcgm-exporter); None = this machine
    xid_error: int | None = None  # the last XID error dcgm-exporter saw (0 = none)
    stale: bool = False  # the source could not refresh it: these are the last good values
    # the Kubernetes pod using it, as dcgm-exporter labels it there (None elsewhere): tui.fleet.match
    namespace: str | None = None
    pod: str | None = None
    vendor: str | None = None  # "NVIDIA", "AMD", "Intel": who made it
    driver: str | None = None  # what read it: "nvml", "dcgm", "amdgpu", "xe", "i915"
    # The GPU's own energy counter in joules (NVML's total energy since the driver loaded, dcgm's field 156,
    # hwmon's energy1_input): a counter, never reset here; the store turns its change into `energy`
    energy_j: float | None = None
    fan_rpm: float | None = None
    energy: EnergyWindow | None = None  # over the store's window (tui.live.store): derived, never recorded
    # The GPU's memory is the host's (DGX Spark's GB10, Jetson): NVML answers NotSupported for its memory,
    # so vram_used/total_bytes are None and the host's RAM is the memory figure; its processes' may be None
    unified_memory: bool = False


@dataclass(frozen=True, slots=True)
class GpuReport:
    """All GPUs at one instant, or why there are none (no driver, library missing)."""

    t: float
    gpus: tuple[GpuSample, ...] = ()
    driver_version: str | None = None
    unavailable: str | None = None  # one line for the panel when NVML cannot be used at all
    error: str | None = None  # a remote source's trouble; GPUs it could not refresh are marked stale


@dataclass(frozen=True, slots=True)
class ProcessTreeMemory:
    engine: str
    pid: int
    rss_bytes: int
    processes: int
    pids: tuple[int, ...] = ()  # the whole tree: the GPU panel maps GPU processes to engines with it
    container: Container | None = None  # the container the engine runs in (tui.sources.containers)
    cgroup: CgroupReading | None = None  # what its container's cgroup imposes and counts (tui.sources.cgroup)


@dataclass(frozen=True, slots=True)
class HostSample:
    t: float
    cpu_pct: float | None = None
    cpu_count: int | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    engines: tuple[ProcessTreeMemory, ...] = field(default_factory=tuple)
    # (engine, why): a watched engine on this machine whose port no process of its own holds, and what holds
    # it instead (a tunnel, a forwarder, enginetop's proxy): nothing of the holder is the engine's
    unowned: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # The CPU packages' RAPL energy counter (tui.sources.rapl), joules summed over packages, its wraps undone
    # since enginetop first read it: a counter that only rises
    cpu_energy_j: float | None = None
    cpu_energy_domains: tuple[str, ...] = ()  # what was read: "intel-rapl:0 package-0", ...
    cpu_energy_error: str | None = None  # why not, in the one line a user needs (root-only: the chmod)
    cpu_energy: EnergyWindow | None = None  # over the store's window (tui.live.store): derived, not recorded


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """llama-server's progress through a streamed request's prompt (`return_progress`): tokens in all, reused
    from the cache, processed so far, and the time it took. Real prefill work is processed - cache of
    total - cache."""

    total: int
    cache: int
    processed: int
    time_ms: float

    @property
    def fraction(self) -> float:
        todo = self.total - self.cache
        return 1.0 if todo <= 0 else min(1.0, max(0.0, (self.processed - self.cache) / todo))
