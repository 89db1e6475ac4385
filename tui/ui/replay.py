"""`enginetop replay FILE`: the dashboard itself, fed by a recording instead of engines.

Only the feed and the clock change: the same store derives the same figures from the recorded readings,
and the same widgets draw them at the replay cursor. Keys that would act on an engine say this is a replay.
A recording of a fleet (`enginetop record --prometheus`, or the fleet view recording) replays as the fleet
table, `enter` opening an engine with the history the recording holds (nothing is asked of Prometheus).
"""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input

from tui.live.feed import Feed
from tui.model.targets import EngineTarget
from tui.record.reader import Recording
from tui.record.replay import ReplaySource, parse_goto
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig
from tui.ui.screens.fleet import EngineScreen, FleetStatus
from tui.ui.screens.goto import GotoScreen

REPLAY_KEYS = [
    # priority: a focused engine column must not take space or the arrows
    Binding("space", "play_pause", "Play/pause", priority=True),
    Binding("left", "step(False)", "← sample", priority=True),
    Binding("right", "step(True)", "sample →", priority=True),
    Binding("left_square_bracket", "jump(-60)", "−1 min", key_display="["),
    Binding("right_square_bracket", "jump(60)", "+1 min", key_display="]"),
    Binding("plus,equals_sign", "speed(True)", "faster", key_display="+"),
    Binding("minus", "speed(False)", "slower", key_display="−"),
    Binding("g", "goto", "Go to"),
]


# Keys of the live dashboard that act on engines: a recording has none to act on.
LIVE_ONLY = frozenset({"probe_now", "sweep", "ab", "switch", "show_log"})


class _Nothing:
    """Stands in for NVML and psutil: a replay reads neither."""

    def sample(self, *args: object) -> None:
        return None

    def close(self) -> None:
        return None


class ReplayApp(EnginetopApp):
    # a recording's pace is its own: + and - change the replay's speed, and there is no session to reset
    BINDINGS = [*(b for b in EnginetopApp.BINDINGS
                  if isinstance(b, Binding) and not b.action.startswith(("poll(", "reset"))), *REPLAY_KEYS]

    def __init__(self, recording: Recording, config: AppConfig | None = None,
                 start: float | None = None) -> None:
        config = config or AppConfig()
        fleet_from = fleet_source(recording)
        if fleet_from is not None:  # the table; its engines come and go with the recording
            config.fleet, config.fleet_replay, config.targets = None, True, []
        else:
            names = dict(recording.engines)
            for name in recording.sources("engine"):
                names.setdefault(name, "")
            config.targets = [EngineTarget(name=n, url=u) for n, u in names.items()]
        config.profiles, config.switchable, config.probe_every_s = [], [], None
        # a replay reads neither NVML nor psutil: a stand-in with their two methods, not a subclass of either
        config.gpu_sampler = config.host_sampler = _Nothing  # type: ignore[assignment]
        config.recorder = None
        config.redraw_interval_s = min(config.redraw_interval_s, 0.5)
        super().__init__(config)
        self.fleet_from = fleet_from
        self.recording = recording
        self.replay = ReplaySource(recording, self.store, start=start)
        self.clock = lambda: self.replay.now
        self._damage_shown = False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in LIVE_ONLY:
            return False  # acts on a live engine: neither offered in the footer nor run
        # the priority keys belong to a text field while one is open (the go-to prompt)
        if action in ("play_pause", "step") and (isinstance(self.screen, GotoScreen)
                                                 or isinstance(self.focused, Input)):  # the / filter
            return False
        return super().check_action(action, parameters)

    def _feed(self) -> Feed:
        return Feed(self.store, [self.replay], on_error=self._report_failure)

    # ---- moving the cursor -------------------------------------------------------------------
    def _moved(self) -> None:
        """Bring the store to the cursor now (not at the next feed turn) and draw it."""
        for item in self.replay.take():
            self.store.add(item)
        self.redraw()

    def action_play_pause(self) -> None:
        if self.replay.at_end and self.replay.paused is False:
            self.notify("the end of the recording: [ or g to go back", severity="information")
        self.replay.paused = not self.replay.paused
        self.replay._real = None  # the time spent paused does not move the cursor
        self.redraw()

    action_toggle_pause = action_play_pause

    def action_step(self, forward: bool) -> None:
        self.replay.step(forward)
        self._moved()

    def action_jump(self, seconds: float) -> None:
        self.replay.seek(self.replay.now + seconds)
        self._moved()

    def action_speed(self, up: bool) -> None:
        self.replay.faster(up)
        self.redraw()

    def action_goto(self) -> None:
        def answered(text: str | None) -> None:
            if not text:
                return
            try:
                t = parse_goto(text, self.recording)
            except ValueError as exc:
                self.notify(str(exc), severity="warning")
                return
            self.replay.seek(t)
            self._moved()

        self.push_screen(GotoScreen(), answered)

    # ---- the fleet table ------------------------------------------------------------------------
    def _fleet_seen(self) -> tuple[float, int]:  # the cursor moves the table, not a count of reads
        return self.replay.now, id(self.store.gpu)

    def _fleet_status(self) -> FleetStatus:
        return FleetStatus(source=f"replay of {self.recording.path.name}, recorded from {self.fleet_from}")

    def _backfill(self, screen: EngineScreen) -> None:
        """Nothing to ask: the plots show the history the recording holds up to the cursor."""

    # ---- drawing -------------------------------------------------------------------------------
    def redraw(self, force: bool = False) -> None:
        notices, self.replay.notices = self.replay.notices, []
        for notice in notices:  # what the live dashboard said as the cursor plays past it
            self.notify(notice.message, title=notice.title, severity=notice.severity)
        for slot in self.slots:  # a crash, a failed start: the column shows what it showed live
            slot.status = self.replay.engine_status(slot.target.name)
        super().redraw(force)
        self.sub_title = self._subtitle()
        damage = self.recording.damage
        if damage and not self._damage_shown:
            self._damage_shown = True
            self.notify(damage, title="damaged recording", severity="error", timeout=30)

    def _subtitle(self, width: int | None = None) -> str:  # short enough as it is, at any width
        rec, replay = self.recording, getattr(self, "replay", None)
        if replay is None or rec.empty:
            return f"replay of {rec.path.name} — empty recording"
        assert rec.start is not None and rec.end is not None
        state = "end" if replay.at_end else "paused" if replay.paused else f"playing {replay.speed}×"
        at, length = _hms(replay.now - rec.start), _hms(rec.end - rec.start)
        damaged = " — DAMAGED, shown up to the damage" if rec.damage else ""
        return f"replay {rec.path.name} — {rec.clock(replay.now)} ({at} of {length}) — {state}{damaged}"


def fleet_source(recording: Recording) -> str | None:
    """Where a fleet recording was read from ("Prometheus http://prom:9090"), None for engines polled
    directly. Recordings made before the `fleet` meta key: engines with a Prometheus job label are a fleet."""
    if "fleet" in recording.meta:
        return recording.meta["fleet"] or None
    for row in recording.rows(kinds=("engine",)):
        return "Prometheus" if row.item is not None and row.item.job is not None else None
    return None


def _hms(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
