"""What a dashboard is asked to do: the one dataclass that the command line (tui/cli), the replay and the
tests fill in and hand to EnginetopApp.

Kept apart from the app so that building one needs no Textual app class, and so that the fields, each with
why it is there, read as one list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tui.lifecycle.profiles import Profile
from tui.model.targets import EngineTarget
from tui.probe.results import DEFAULT_TTFT_GAP_FACTOR
from tui.probe.sweep import SweepConfig
from tui.sources.gpu import GpuSampler
from tui.sources.host import HostSampler

if TYPE_CHECKING:  # types only: a dashboard imports the A/B, fleet and proxy code only when it uses them
    from tui.compare.ab import ABConfig
    from tui.fleet.options import FleetOptions
    from tui.proxy.options import ProxyOptions
    from tui.record.writer import Recorder


@dataclass
class AppConfig:
    targets: list[EngineTarget] = field(default_factory=list)  # engines only watched
    profiles: list[Profile] = field(default_factory=list)  # engines started (or attached) via profiles
    switchable: list[Profile] = field(default_factory=list)  # number keys 1..9 switch to these
    probe_every_s: float | None = None  # for watched engines; None = only on key `f`
    probe_every_managed_s: float | None = None  # for engines enginetop started
    probe_workload: str = "short"
    probe_max_tokens: int = 64
    ttft_gap_factor: float = DEFAULT_TTFT_GAP_FACTOR  # client TTFT over engine TTFT: flagged above this
    sweep: SweepConfig = field(default_factory=lambda: SweepConfig(levels=(1, 2, 4, 8, 16, 32)))
    ab: ABConfig | None = None  # `a`'s comparison; None: the dashboard's own (tui.ui.screens.ab.DASHBOARD_AB)
    model_bytes: float | None = None  # roofline: weight bytes read per token, when not found on disk
    bandwidth_bps: float | None = None  # roofline: memory bandwidth, when NVML cannot say (no GPU)
    poll_interval_s: float = 1.0
    gpu_interval_s: float = 1.0
    host_interval_s: float = 2.0
    redraw_interval_s: float = 2.0  # nvitop's default; polling stays at 1 Hz, so rates keep their resolution
    horizon_s: float = 300.0
    screenshot_dir: Path = Path("screenshots")
    gpu_sampler: Callable[[], GpuSampler] = GpuSampler
    host_sampler: Callable[[], HostSampler] = HostSampler
    recorder: Recorder | None = None  # listens to the store (tui.record); the caller closes it
    # The fleet view (--prometheus): a table of every engine Prometheus scrapes instead of engine columns.
    # With only --dcgm, the usual columns with the GPU panel fed by those dcgm-exporters instead of NVML.
    fleet: FleetOptions | None = None
    fleet_replay: bool = False  # the fleet table, fed by a replayed recording of a Prometheus (no queries)
    proxy: ProxyOptions | None = None  # a traffic proxy this dashboard runs in front of its engines
    traffic: list[str] = field(default_factory=list)  # separate `enginetop proxy` processes to watch
    # what the start found or could not (discovery's report, a profile that cannot start): notified at start;
    # with no engine at all, said where the columns would be
    notes: list[str] = field(default_factory=list)

    @property
    def fleet_table(self) -> bool:
        return self.fleet_replay or (self.fleet is not None and self.fleet.prometheus is not None)
