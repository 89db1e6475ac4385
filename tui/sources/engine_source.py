"""An engine polled directly, as a feed source (tui.live.feed), and which local process serves it.

The dashboard's columns and `enginetop record` both poll through `EngineSource`, so what is recorded
headless is exactly what the dashboard would have shown. Nothing here imports Textual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from urllib.parse import urlsplit

from tui.base.process import pid_alive
from tui.model.config import EngineConfig
from tui.model.samples import EngineSample
from tui.model.slots import SlotsReading
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports, exchange
from tui.net.policy import is_loopback_host, target_headers
from tui.sources.containers import shared_catalog
from tui.sources.engine import nothing_listened, poll_engine, poll_slots
from tui.sources.engine_config import poll_config
from tui.sources.engine_metrics import METRICS_OFF, NO_METRICS, NameFilter
from tui.sources.port_holder import whose_port, whose_ports
from tui.sources.rates import went_back
from tui.sources.router import SSE_PATH, LoadProgress
from tui.sources.slot_counters import RunningTokens, SlotCounters
from tui.sources.slot_watch import SlotWatch

MODEL_REFRESH_S = 30.0
HEALTH_REFRESH_S = 5.0  # while /metrics answers; any failure asks /health at once
PID_RESCAN_S = 30.0  # who listens on a watched port: a walk of every socket, and engines seldom move
# An idle llama-server's /slots is given again while its /metrics does not move (no request ran since), but
# asked at least this often: erasing or restoring a slot's cache (POST /slots/ID) moves no counter.
IDLE_SLOTS_REFRESH_S = 5.0
# The configuration is read again when the engine (re)starts, and this often anyway: a server can be given new
# settings without its counters going back (a router's model reloaded, a llama-swap restart between polls).
CONFIG_REFRESH_S = 60.0


class EngineSource:
    """One engine. `target` may be replaced while it runs (a profile switch gives the column a new engine);
    an answer from the engine it replaced is dropped."""

    def __init__(self, target: EngineTarget, transports: Transports, interval_s: float = 1.0,
                 launched_by_us: bool = False, timeout_s: float | None = None,
                 read_config: bool = True) -> None:
        self.target = target
        self.timeout_s = min(2.0, interval_s * 2) if timeout_s is None else timeout_s
        self.transports = transports
        self.interval_s = interval_s
        self.launched_by_us = launched_by_us  # a refused connection then reads "starting", not "down"
        self.read_config = read_config  # the engine's configuration too (tui.sources.config)
        self.name = f"engine {target.name}"
        self._last: EngineSample | None = None
        self._model_asked = 0.0
        self._health_asked = 0.0
        self._follow: asyncio.Task[None] | None = None  # a router's event stream, while a model loads
        self._progress = LoadProgress()
        self._only: tuple[EngineTarget, NameFilter] | None = None  # once a poll found a vLLM at the target
        self._slots_asked: tuple[EngineTarget, float] | None = None  # whose /slots were last asked, and when
        self._config: tuple[EngineTarget, float, EngineConfig | None] | None = None  # whose, when read, what
        self._counters: tuple[EngineTarget, SlotCounters] | None = None  # a llama-server without --metrics
        self._watch: tuple[EngineTarget, SlotWatch] | None = None  # its /slots read often while busy
        self._running: tuple[EngineTarget, RunningTokens] | None = None  # a llama-server with --metrics

    async def read(self) -> list[EngineSample]:
        started = time.monotonic()
        target = self.target
        last = self._last if self._last is not None and self._last.name == target.name else None
        known = None  # ask /v1/models again after any trouble, and every MODEL_REFRESH_S anyway
        if last is not None and last.health == "up" and started - self._model_asked < MODEL_REFRESH_S:
            known = last.model
        if known is None:
            self._model_asked = started
        # A dead vLLM engine core still serves /metrics, so /health is asked now and then; llama-server
        # answers both from one HTTP server (503 on every path while loading), so /metrics says it all.
        llama = last is not None and last.reading is not None and last.reading.dialect == "llamacpp"
        # a server with no metrics that is no engine enginetop reads (a gateway): its /health may ask every
        # model behind it (LiteLLM's does), so it is asked only with its model list, not every few seconds
        plain = last.metrics_error if last is not None and last.router is None and last.reading is None \
            and last.metrics_error is not None and last.metrics_error.startswith(NO_METRICS) else None
        check_health = known is None or (not llama and plain is None
                                         and started - self._health_asked >= HEALTH_REFRESH_S)
        if check_health:
            self._health_asked = started
        router = last.router if last is not None else None  # set only beside the router's models
        if router is not None:  # one server answers for every model: its /models says it all, like /metrics
            check_health = known is None
        only = None
        vllm = last is not None and last.reading is not None and last.reading.dialect == "vllm"
        if vllm and router is None:
            if self._only is None or self._only[0] is not target:
                self._only = (target, NameFilter())
            only = self._only[1]
        reuse = None  # the last poll's slots, every one idle, with the /metrics reading they go with
        asked = self._slots_asked
        recent = asked is not None and asked[0] is target and started - asked[1] < IDLE_SLOTS_REFRESH_S
        if recent and last is not None and last.reading is not None and last.slots is not None \
                and last.slots.error is None and not any(s.processing for s in last.slots.slots):
            reuse = (last.reading, last.slots)
        watch = self._watch[1] if self._watch is not None and self._watch[0] is target else None
        watched = watch.latest if watch is not None and watch.running else None
        if watch is not None:
            watch.touch()
        sample = await poll_engine(self.transports.for_url(target.url), target,
                                   timeout=self.timeout_s, launched_by_us=self.launched_by_us,
                                   known_model=known, check_health=check_health, router=router, only=only,
                                   idle_slots=reuse, slots_read=watched, plain=plain)
        if target is not self.target:
            return []  # switched meanwhile: the old engine's answer
        if reuse is None or sample.slots is not reuse[1]:  # asked (or none to ask)
            self._slots_asked = (target, started)
        sample = self._with_load_progress(sample)
        sample = self._with_slot_counters(sample, counted=watched is not None and sample.slots is watched)
        sample = await self._with_config(sample, last, started)
        if target is not self.target:
            return []
        self._last = sample
        return [sample]

    def _with_slot_counters(self, sample: EngineSample, counted: bool) -> EngineSample:
        """llama-server's generated tokens as they are generated. Without --metrics: the counters its slots
        give (tui.sources.slot_counters), as the sample's reading, which says it came from /slots; while a
        slot is busy its /slots are read several times a second (tui.sources.slot_watch) and counted as they
        come (`counted`: this sample's slots are the watch's, counted already). With --metrics: the tokens its
        running requests generated so far added to its counter, which moves only when a request ends."""
        target = self.target
        reading = sample.reading
        if reading is not None:
            if reading.dialect != "llamacpp" or reading.origin is not None or sample.router is not None:
                return sample
            if self._running is None or self._running[0] is not target:
                self._running = (target, RunningTokens())
            return replace(sample, reading=self._running[1].add(reading, sample.slots))
        if self._counters is not None and self._counters[0] is target and nothing_listened(sample):
            self._counters[1].new_run(fresh=True)  # the old process is gone: its task ids mean nothing now
        if sample.metrics_error != METRICS_OFF or sample.slots is None:
            return sample
        if self._counters is None or self._counters[0] is not target:
            self._counters = (target, SlotCounters())
        counters = self._counters[1]
        made = counters.reading(sample.slots) if counted else counters.add(sample.slots)
        if made is None:
            return sample
        if made.running:
            self._watch_slots(target, counters, sample.slots)
        return replace(sample, reading=made, metrics_error=None)

    def _watch_slots(self, target: EngineTarget, counters: SlotCounters, counted: SlotsReading) -> None:
        if self._watch is None or self._watch[0] is not target:
            if self._watch is not None:
                self._watch[1].cancel()  # another engine's: it stops at its next answer anyway
            transport = self.transports.for_url(target.url)

            async def ask() -> SlotsReading | None:
                if target is not self.target:
                    return None
                return await poll_slots(transport, target, self.timeout_s, None, llama=True)

            self._watch = (target, SlotWatch(ask, counters, lambda: self.interval_s))
        self._watch[1].start(counted)

    async def _with_config(self, sample: EngineSample, last: EngineSample | None,
                           started: float) -> EngineSample:
        """The sample with the engine's configuration: read again when it (re)started (it was not up, or its
        counters went back) and every CONFIG_REFRESH_S; a router's models have none of their own here."""
        if not self.read_config:
            return sample
        target = self.target
        kept = self._config if self._config is not None and self._config[0] is target else None
        # a llama-server with neither /metrics nor /slots still has its /props and command line
        dialect = sample.reading.dialect if sample.reading is not None else \
            "llamacpp" if sample.metrics_error == METRICS_OFF else \
            "ollama" if sample.router == "ollama" else None
        if sample.health != "up" or dialect is None or sample.router not in (None, "ollama"):
            return sample if kept is None or kept[2] is None else replace(sample, config=kept[2])
        restarted = last is None or last.health != "up" or (
            last.reading is not None and sample.reading is not None
            and went_back(last.reading, sample.reading))
        if kept is not None and not restarted and started - kept[1] < CONFIG_REFRESH_S:
            return sample if kept[2] is None else replace(sample, config=kept[2])
        pid = why = None
        remote = not is_local(target.url)
        if not remote and (port := urlsplit(target.url).port):
            host = urlsplit(target.url).hostname
            holder = await asyncio.to_thread(whose_port, None if host in (None, "0.0.0.0") else host, port,
                                             shared_catalog())
            pid, why = holder.engine_pid, holder.why_none
        config = await poll_config(self.transports.for_url(target.url), target, dialect,
                                   slots=sample.slots, pid=pid, remote=remote, timeout=self.timeout_s * 2,
                                   no_pid=why)
        if kept is not None and kept[2] is not None and config is not None and not restarted \
                and (kept[2].version, kept[2].model) != (config.version, config.model) \
                and self._counters is not None and self._counters[0] is target:
            self._counters[1].new_run(fresh=False)  # another build or model answers (/props): seen late
        self._config = (target, started, config)
        return sample if config is None else replace(sample, config=config)

    def _with_load_progress(self, sample: EngineSample) -> EngineSample:
        """A router loading a model: follow its event stream while it does, for the load's progress."""
        loading = [m.id for m in sample.models or () if m.status == "loading"]
        if not loading or sample.router == "llama-swap":
            self._stop_following()
            return sample
        if self._follow is None or self._follow.done():
            self._progress = LoadProgress()
            self._follow = asyncio.create_task(self._follow_events(self.target, self._progress))
        of = self._progress.of
        return replace(sample, models=tuple(replace(m, progress=of.get(m.id)) if m.id in loading else m
                                            for m in sample.models or ()))

    async def _follow_events(self, target: EngineTarget, progress: LoadProgress) -> None:
        with contextlib.suppress(Exception):  # the progress is a nicety: the poll reports trouble
            await exchange(self.transports.for_url(target.url), "GET", target.base + SSE_PATH,
                           target_headers(target), 64 * 2**20, self.timeout_s, until=progress.feed)

    @property
    def filtering(self) -> bool:
        """/metrics is asked for the series read here alone (tui.sources.engine_metrics.NameFilter)."""
        return self._only is not None and self._only[0] is self.target and not self._only[1].refused

    @property
    def following(self) -> bool:
        """A router's event stream is being read (a model of it loads)."""
        return self._follow is not None and not self._follow.done()

    def _stop_following(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
            self._follow = None

    async def aclose(self) -> None:
        if self._watch is not None:
            await self._watch[1].stop()
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow
            self._follow = None


def is_local(url: str) -> bool:
    host = urlsplit(url).hostname
    return is_loopback_host(host) or host == "0.0.0.0"


class LocalPids:
    """Which local process is each watched loopback engine's own (for its memory, its container, its energy
    and its GPUs): the one rule of tui.sources.port_holder, so a tunnel, forwarder or enginetop's proxy on its
    port is never taken for the engine, and a container's publisher leads to the engine in the container.
    Finding it walks every socket, so it is looked up again only every `every_s`, and not even then while
    every process found is alive. Each engine maps to its process's PID, or to why there is none."""

    def __init__(self, targets: list[EngineTarget], every_s: float = PID_RESCAN_S) -> None:
        self.watched: dict[str, tuple[str | None, int]] = {
            t.name: (None, port) for t in targets if is_local(t.url) and (port := urlsplit(t.url).port)}
        self.every_s = every_s
        self._next = 0.0
        self._found: dict[str, int | str] = {}

    def __call__(self) -> dict[str, int | str]:
        now = time.monotonic()
        if self.watched and now >= self._next:
            self._next = now + self.every_s
            known = self._found
            if not all(isinstance(known.get(name), int) and pid_alive(known[name])  # type: ignore[arg-type]
                       for name in self.watched):
                found: dict[str, int | str] = {}
                holders = whose_ports(list(self.watched.values()), shared_catalog())  # one socket walk
                for name, address in self.watched.items():
                    holder = holders[address]
                    if holder.engine_pid is not None:
                        found[name] = holder.engine_pid
                    elif holder.pid is not None and holder.why_none:
                        found[name] = holder.why_none  # a process holds it, and it is not the engine
                self._found = found
        return dict(self._found)


async def read_once(target: EngineTarget, timeout_s: float = 5.0) -> EngineSample:
    """One poll of an engine with its configuration: what a run (bench, capacity, A/B) records of the engine
    it measured, before and after."""
    transports = Transports()
    source = EngineSource(target, transports, timeout_s=timeout_s)
    try:
        [sample] = await source.read()
    finally:
        await source.aclose()
        await transports.aclose()
    return sample
