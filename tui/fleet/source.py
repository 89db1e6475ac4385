"""Engines read through Prometheus as one feed source: a fixed set of queries a refresh, whatever the fleet.

Each read asks, all at once: which engines exist (discovery over the last 15 min, so one that died stays
listed as down), `up`, and one query per figure (tui.fleet.queries). Engines are told apart by (job,
instance, model_name, engine); their name is the instance, prefixed by the job when two jobs share an
instance, with the model and data-parallel rank added only where one instance serves several.

When Prometheus cannot answer, every engine keeps its last good values, marked stale, with the reason
(tui.fleet.prometheus.PromError) as its metrics error; nothing raises.

The in-app alerts (tui.fleet.alerts.AlertTracker) judge the history of each figure. So that an engine
stalled for an hour alerts on the first refresh rather than a minute (or five) after enginetop starts, the
first good read also asks Prometheus for the last 10 minutes of the figures the alerts use (one range query
per figure for the whole fleet, once) and replays them through the tracker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from tui.fleet.alerts import DROP_WINDOW_S, AlertTracker
from tui.fleet.match import GpuMatcher, pod_of_labels
from tui.fleet.prometheus import Labels, PromError, PrometheusClient, Target
from tui.fleet.queries import K8S_LABELS, KEY_LABELS, FleetQueries, Windows, window
from tui.model.samples import Dialect, EngineReading, EngineSample, EngineStats, GpuReport, Health
from tui.model.targets import EngineTarget
from tui.net.keepalive import Transports
from tui.sources.engine import poll_slots

Key = tuple[str, str, str, str]  # job, instance, model_name, engine
TARGETS_REFRESH_S = 60.0  # scrape intervals and target health: refetched sooner when a target is down

STAT_FIGURES = ("gen_tps", "prompt_processed_tps", "prompt_computed_tps", "prefix_cache_hit_rate",
                "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s")
READING_FIGURES = ("running", "waiting", "kv_cache_usage", "generation_tokens_total",
                   "prompt_tokens_processed_total")
# what the alerts judge, back-filled once over their longest window (the tok/s drop's 10 minutes)
ALERT_FIGURES = ("running", "waiting", "kv_cache_usage", "gen_tps")
ALERT_HISTORY_S = DROP_WINDOW_S


def key_of(labels: Labels) -> Key:
    # spelt out: called for every series of every figure, a generator here was the refresh's top cost
    get = labels.get
    return get("job", ""), get("instance", ""), get("model_name", ""), get("engine", "")


assert KEY_LABELS == ("job", "instance", "model_name", "engine")


def host_of(instance: str) -> str:
    """The node part of an instance: `node-7:8000` -> `node-7`, `[::1]:80` -> `::1`."""
    host = instance.rsplit(":", 1)[0] if instance.count(":") == 1 or instance.startswith("[") else instance
    return host.strip("[]")


def engine_names(keys: list[Key]) -> dict[Key, str]:
    """Readable, unique names: the instance; job/instance when two jobs share it; + model, + dp rank."""
    jobs_per_instance: dict[str, set[str]] = {}
    per_target: dict[tuple[str, str], list[Key]] = {}
    for k in keys:
        jobs_per_instance.setdefault(k[1], set()).add(k[0])
        per_target.setdefault((k[0], k[1]), []).append(k)
    names = {}
    for k in keys:
        job, instance, model, rank = k
        name = f"{job}/{instance}" if len(jobs_per_instance[instance]) > 1 else instance
        siblings = per_target[(job, instance)]
        if len({s[2] for s in siblings}) > 1 and model:
            name += f" {model}"
        if len({s[3] for s in siblings}) > 1 and rank:
            name += f" dp{rank}"
        names[k] = name
    return names


class FleetSource:
    """Every engine a Prometheus scrapes (narrowed by `match`), as EngineSamples with Prometheus' figures."""

    name = "prometheus"

    def __init__(self, client: PrometheusClient, match: str | None = None, interval_s: float = 5.0,
                 gpus: Callable[[], GpuReport | None] | None = None) -> None:
        self.client = client
        self.match = match
        self.interval_s = interval_s
        self.queries = FleetQueries(match)
        self.alerts = AlertTracker()
        self.gpus = gpus  # the node GPUs (for the throttled-GPU alert); None = no GPU source
        self.error: str | None = None  # the last refresh's trouble, None when it went fine
        self.error_kind: str | None = None
        self.last_ok: float | None = None  # time.monotonic() of the last good refresh
        self.reads = 0  # refreshes done, good or not (the table redraws when it moves)
        self.queries_per_read: int | None = None  # API calls of the last refresh, whatever the fleet size
        self.engines: dict[str, tuple[Key, Dialect]] = {}  # name -> key and dialect
        self._last: dict[str, EngineSample] = {}
        self._targets: dict[tuple[str, str], Target] = {}
        self._targets_at = float("-inf")
        self.backfilled = False  # the alerts' history was asked for (on the first good read)
        # Engines whose /slots are read straight from them (the one the dashboard has opened from the table):
        # Prometheus has no slots. Set by the UI; read with `transports` where set.
        self.slots_of: dict[str, EngineTarget] = {}
        self.transports: Transports | None = None

    @property
    def labels_of(self) -> dict[str, Labels]:
        return {name: dict(zip(KEY_LABELS, key, strict=True)) for name, (key, _) in self.engines.items()}

    async def read(self) -> list[EngineSample]:
        self.reads += 1
        before = self.client.calls
        try:
            return await self._with_slots(await self._read())
        except PromError as exc:
            self.error, self.error_kind = exc.message, exc.kind
            return self._stale(exc.message)
        finally:
            self.queries_per_read = self.client.calls - before

    async def _with_slots(self, samples: list[EngineSample]) -> list[EngineSample]:
        """A llama-server in `slots_of`, reachable directly: its /slots beside Prometheus' figures."""
        if not self.slots_of or self.transports is None:
            return samples
        out = []
        for sample in samples:
            target = self.slots_of.get(sample.name)
            if target is not None and sample.reading is not None and target.url:
                slots = await poll_slots(self.transports.for_url(target.url), target, self.client.timeout,
                                         sample.reading)
                sample = dataclasses.replace(sample, slots=slots)
                self._last[sample.name] = sample
            out.append(sample)
        return out

    def _stale(self, why: str) -> list[EngineSample]:
        now, wall = time.monotonic(), time.time()
        out = []
        for name, last in self._last.items():
            out.append(dataclasses.replace(last, t=now, wall=wall, stale=True, metrics_error=why))
            self._last[name] = out[-1]
        return out

    async def _refresh_targets(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._targets_at < TARGETS_REFRESH_S:
            return
        self._targets = {(t.job, t.instance): t for t in await self.client.targets()}
        self._targets_at = now
        intervals = [t.scrape_interval_s for t in self._targets.values() if t.scrape_interval_s]
        scrape = max(intervals) if intervals else 15.0
        # Grafana's $__rate_interval: at least four scrapes in a rate window; latencies over a longer one
        self.queries.windows = Windows(rate=window(max(4 * scrape, 10.0)),
                                       latency=window(max(4 * scrape, 60.0)))

    async def _read(self) -> list[EngineSample]:
        await self._refresh_targets(force=not self._targets)
        figures = self.queries.figures()
        names = ["discovery", "up", *figures]
        exprs = [self.queries.discovery(), self.queries.up(), *figures.values()]
        # the alerts' history, asked with the first read's own queries (so it costs no extra round trip)
        end = time.time()
        history = [] if self.backfilled else [
            self.client.query_range(figures[f], end - ALERT_HISTORY_S, end, self.interval_s)
            for f in ALERT_FIGURES]
        answers = await asyncio.gather(*(self.client.query(e) for e in exprs), *history,
                                       return_exceptions=True)
        answers, history_answers = answers[:len(exprs)], answers[len(exprs):]
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        results: dict[str, Any] = dict(zip(names, answers, strict=True))
        up = {(labels.get("job", ""), labels.get("instance", "")): v for labels, v in results["up"]}
        if any(v == 0 and not self._last_error(key) for key, v in up.items()):
            # lastError of the targets that are down now (ones read before the `up` query may predate it)
            await self._refresh_targets(force=True)
        found: dict[Key, Dialect] = {}
        pods: dict[Key, tuple[tuple[str, str], ...]] = {}
        for labels, _ in results["discovery"]:
            key = key_of(labels)
            found[key] = labels.get("dialect", "unknown")
            pods[key] = tuple((k, labels[k]) for k in K8S_LABELS if labels.get(k))
        by_figure = {f: {key_of(labels): v for labels, v in results[f]} for f in figures}
        names_by_key = engine_names(sorted(found))
        backfill_trouble = self._backfill(names_by_key, found, history_answers) if history else None
        now, wall = time.monotonic(), time.time()
        gpu_report = self.gpus() if self.gpus else None
        gpus = GpuMatcher(g for g in gpu_report.gpus if not g.stale) if gpu_report else None
        samples = []
        self.engines = {}
        for key, name in names_by_key.items():
            dialect = found[key]
            self.engines[name] = (key, dialect)
            job, instance, model, rank = key
            stats = EngineStats(**{f: by_figure[f].get(key) for f in STAT_FIGURES})  # type: ignore[arg-type]  # STAT_FIGURES are EngineStats' float fields
            reading = EngineReading(dialect=dialect, **{f: by_figure[f].get(key) for f in READING_FIGURES})
            health, reason = self._health(up, job, instance)
            host = host_of(instance)
            target = self._targets.get((job, instance))
            url = target.scrape_url.rsplit("/", 1)[0] if target and target.scrape_url else f"http://{instance}"
            labels = tuple((k, v) for k, v in (("model_name", model), ("engine", rank)) if v) + pods[key]
            # the engine's GPUs by pod where dcgm-exporter names pods, else by host (tui.fleet.match)
            throttled = gpus is not None and any(g.throttled for g in gpus.of(host, pod_of_labels(labels)))
            alerts = self.alerts.update(name, now, health, reading, stats, throttled)
            sample = EngineSample(
                name=name, url=url, t=now, wall=wall, health=health, health_reason=reason,
                model=model or None, reading=reading if health == "up" else None, stats=stats,
                job=job, instance=instance, host=host, labels=labels, alerts=alerts)
            samples.append(sample)
        self._last = {s.name: s for s in samples}
        self.error = self.error_kind = None
        if backfill_trouble:
            self.error, self.error_kind = backfill_trouble, "warning"
        if self.client.warnings:
            self.error = "Prometheus warned: " + "; ".join(self.client.warnings)
            self.error_kind = "warning"
            self.client.warnings = []
        self.last_ok = now
        return samples

    def _health(self, up: dict[tuple[str, str], float | None], job: str,
                instance: str) -> tuple[Health, str | None]:
        value = up.get((job, instance))
        if value == 1:
            return "up", None
        if value is None:
            return "down", "no longer scraped by Prometheus (the target is gone from its configuration)"
        # empty when the target was scraped well again between the `up` query and the targets' read
        error = self._last_error((job, instance)) or "the last scrape failed"
        return "down", f"Prometheus cannot scrape it: {error}"

    def _last_error(self, key: tuple[str, str]) -> str:
        target = self._targets.get(key)
        return target.last_error if target else ""


    def _backfill(self, names: dict[Key, str], found: dict[Key, Dialect], answers: list[Any]) -> str | None:
        """Replay the last 10 minutes of the alerts' figures through the tracker, oldest first, as if
        enginetop had been reading all along (the GPUs' throttling is judged on the current read only).
        Asked once: a failure is shown and not retried (the alerts then count from now)."""
        self.backfilled = True
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            if not isinstance(failed, PromError):
                raise failed
            return f"alert history not back-filled, alerts count from now: {failed.message}"
        steps: dict[Key, dict[float, dict[str, float | None]]] = {}
        for figure, series in zip(ALERT_FIGURES, answers, strict=True):
            for labels, points in series:
                key = key_of(labels)
                if key in names:
                    per_t = steps.setdefault(key, {})
                    for t, v in points:
                        per_t.setdefault(t, {})[figure] = v
        to_monotonic = time.monotonic() - time.time()
        for key, per_t in steps.items():
            for t in sorted(per_t):
                f = per_t[t]
                reading = EngineReading(dialect=found[key], running=f.get("running"),
                                        waiting=f.get("waiting"), kv_cache_usage=f.get("kv_cache_usage"))
                self.alerts.update(names[key], t + to_monotonic, "up", reading,
                                   EngineStats(gen_tps=f.get("gen_tps")), False)
        return None
