"""`enginetop bench`: a workload's requests sent to engines on one plan (tui.workload.schedule), each measured
by the probe client, summed up per engine side by side.

Every request asks for its recorded output length and makes the engine produce exactly that many tokens
(`ignore_eos`, and `min_tokens` for vLLM and SGLang); a request that got another count is flagged and
counted, not averaged away. Prompts are the workload's own text where it has it, sent as chat (a session's
turns carry the conversation so far, with the replies this engine gave), or made in the engine's own tokens
from hash ids and lengths (tui.workload.prompts) and sent as a raw prompt to /v1/completions, so that no chat
template comes between the blocks and equal ids reach the engine as equal tokens. The send time of each
open-loop request is compared with its plan: the lateness says whether the client kept up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from tui.base.stats import median, quantile
from tui.engines.tokens import EngineTokens
from tui.model.slo import Slo
from tui.model.targets import EngineTarget
from tui.model.workload import WorkloadRequest
from tui.probe.client import CHAT_PATH, COMPLETIONS_PATH, ProbeClient, ProbeLimits
from tui.probe.results import ProbeResult
from tui.probe.sweep import ClientLoad, SelfMonitor
from tui.workload.prompts import PromptMaker, Tokens
from tui.workload.schedule import Planned
from tui.workload.slo import met, tpot_s

DEFAULT_OUTPUT = 128  # tokens, for a request whose workload does not say
GONE_AFTER = 3  # connections refused in a row: the engine is gone, and its part ends


@dataclass
class EngineRun:
    engine: str
    url: str
    results: list[tuple[Planned, ProbeResult]] = field(default_factory=list)
    lateness_s: list[float] = field(default_factory=list)  # sent minus planned, open-loop sends only
    duration_s: float = 0.0
    error: str | None = None  # why this engine's part ended early
    client: ClientLoad | None = None  # the sending process's own CPU and event-loop lag meanwhile
    prompt_note: str | None = None  # prompts made without the engine's tokens: why, and what is approximate
    workers: list[dict[str, Any]] = field(default_factory=list)  # --workers: each one's share, its figures
    worker_notes: tuple[str, ...] = ()  # the workers that could not keep up, named
    # the machine's energy over this part and per generated token (tui.sources.energy_meter), when measured
    energy: dict[str, Any] | None = None


@dataclass(frozen=True)
class Spread:
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        values = sorted(values)
        return cls(quantile(values, 0.5), quantile(values, 0.9), quantile(values, 0.99))


@dataclass(frozen=True)
class EngineSummary:
    engine: str
    url: str
    requests: int
    ok: int
    errors: int
    wrong_length: int  # ok, but the engine gave another number of tokens than asked
    duration_s: float
    requests_per_s: float | None
    output_tokens_per_s: float | None
    ttft_s: Spread
    tpot_s: Spread
    itl_s: Spread
    e2el_s: Spread
    decode_tps_p50: float | None
    cached_share: float | None  # cached prompt tokens / prompt tokens, as the engine reported them
    lateness_s: Spread
    # requests out on average, weighted by time from the first send to the last end: a closed loop that held
    # its bound for the whole run is near it, one that held it only at its peak is not
    mean_in_flight: float | None = None
    slo: str | None = None
    attainment: float | None = None  # share of requests meeting every SLO term (errors count as misses)
    goodput_rps: float | None = None  # good requests per second
    error: str | None = None
    first_errors: tuple[str, ...] = ()
    client_notes: tuple[str, ...] = ()  # when the client may have been the bottleneck, why
    prompt_note: str | None = None  # lengths and block sharing approximate on this engine, and why
    workers: tuple[dict[str, Any], ...] = ()  # --workers: each worker's share (sent, lateness, CPU, lag)
    # energy over the run (the engine's GPUs, or the CPU package for an engine on this machine's CPU) and per
    # generated token, prefills included (tui.sources.energy.run_energy)
    energy_j: float | None = None
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    energy_source: str | None = None
    energy_scope: str | None = None
    energy_note: str | None = None


def mean_in_flight(results: list[ProbeResult]) -> float | None:
    """The time-weighted mean number of requests out, from the first send to the last end: the area under
    the in-flight count (each result's own send and end, time.monotonic(), one clock in every worker) over the
    run's span. None: nothing was sent, or it all took no time."""
    events = sorted((t, step) for r in results if r.sent_at is not None and r.ended_at is not None
                    for t, step in ((r.sent_at, 1), (r.ended_at, -1)))
    if not events or events[-1][0] <= events[0][0]:
        return None
    area = 0.0
    out = 0
    for (t, step), (after, _) in pairwise(events):
        out += step
        area += out * (after - t)
    return area / (events[-1][0] - events[0][0])


def summarize(run: EngineRun, slo: Slo | None = None) -> EngineSummary:
    results = [r for _, r in run.results]
    ok = [r for r in results if r.ok]
    wrong = sum(1 for p, r in run.results if r.ok and r.completion_tokens != _output(p.request))
    prompt = sum(r.prompt_tokens or 0 for r in ok if r.cached_tokens is not None)
    cached = sum(r.cached_tokens or 0 for r in ok if r.cached_tokens is not None)
    span = run.duration_s or None
    good = sum(1 for r in results if slo is not None and met(slo, r))
    return EngineSummary(
        engine=run.engine, url=run.url, requests=len(results), ok=len(ok), errors=len(results) - len(ok),
        wrong_length=wrong, duration_s=run.duration_s,
        requests_per_s=len(ok) / span if span else None,
        output_tokens_per_s=sum(r.completion_tokens or 0 for r in ok) / span if span else None,
        ttft_s=Spread.of([t for r in ok if (t := r.ttft_s) is not None]),
        tpot_s=Spread.of([t for r in ok if (t := tpot_s(r)) is not None]),
        itl_s=Spread.of([g for r in ok for g in r.gaps_s]),
        e2el_s=Spread.of([t for r in ok if (t := r.e2e_s) is not None]),
        decode_tps_p50=median([t for r in ok if (t := r.decode_tps) is not None]),
        cached_share=cached / prompt if prompt else None,
        lateness_s=Spread.of(run.lateness_s), mean_in_flight=mean_in_flight(results),
        slo=str(slo) if slo is not None else None,
        attainment=good / len(results) if slo is not None and results else None,
        goodput_rps=good / span if slo is not None and span else None,
        error=run.error,
        first_errors=tuple(dict.fromkeys(r.error or "" for r in results if not r.ok))[:3],
        client_notes=(*(run.client.notes if run.client is not None else ()), *run.worker_notes),
        prompt_note=run.prompt_note, workers=tuple(run.workers),
        **{k: (run.energy or {}).get(k) for k in ("energy_j", "joules_per_token", "tokens_per_joule",
                                                  "energy_source", "energy_scope", "energy_note")},
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def request_json(planned: Planned, result: ProbeResult) -> dict[str, Any]:
    """One request as the result file keeps it: what `enginetop report` draws its CDFs from."""
    return {"index": planned.index, "line": planned.request.line, "session": planned.request.session_id,
            "ok": result.ok, "error": result.error, "ttft_ms": _ms(result.ttft_s),
            "tpot_ms": _ms(tpot_s(result)), "e2el_ms": _ms(result.e2e_s),
            "itl_ms": [round(g * 1000.0, 3) for g in result.gaps_s],
            "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
            "completion_tokens": result.completion_tokens, "asked_tokens": _output(planned.request)}


def engine_json(run: EngineRun, slo: Slo | None = None) -> dict[str, Any]:
    """An engine's summary and every request it sent."""
    return {**asdict(summarize(run, slo)),
            "per_request": [request_json(p, r) for p, r in sorted(run.results, key=lambda x: x[0].index)]}


def _synthetic(request: WorkloadRequest) -> bool:
    """Lengths (and ids) without text: the prompt is made in the engine's tokens."""
    return request.messages is None and request.prompt is None


def _output(request: WorkloadRequest) -> int:
    return request.output_length or DEFAULT_OUTPUT


class Bench:
    """One engine's part of a run."""

    def __init__(self, target: EngineTarget, planned: list[Planned], *, concurrency: int | None = None,
                 model: str | None = None, block_size: int | None = None,
                 limits: ProbeLimits | None = None, prompts: PromptMaker | None = None, fresh_from: int = 0,
                 prompt_seed: str = "enginetop", tokenizer: Tokens | None = None,
                 on_result: Callable[[str, Planned, ProbeResult], None] | None = None) -> None:
        self.target = target
        self.planned = planned
        self.concurrency = concurrency
        self.model = model or target.model
        self.block_size = block_size
        self.client = ProbeClient(limits)
        self.on_result = on_result
        self.run = EngineRun(target.name, target.url)
        self._ended: dict[int, asyncio.Event] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}
        self.prompts = prompts  # made once per engine; a capacity search passes it from level to level
        self.fresh_from = fresh_from
        self.prompt_seed = prompt_seed
        self.tokenizer = tokenizer  # whose tokens prompts are made in, when not the engine's (--tokenizer)
        self.sent = 0
        self._since: dict[int, float] = {}  # in flight: index -> when it was sent
        self.max_in_flight = 0
        self._refused = 0  # connections refused in a row
        self._gone = False
        self._sending: asyncio.Future[Any] | None = None

    async def _prepare_prompts(self, http: httpx.AsyncClient) -> None:
        if self.prompts is None and any(_synthetic(p.request) for p in self.planned):
            tokens = self.tokenizer or EngineTokens(http, self.target.url, self.model)
            maker = PromptMaker(tokens, self.block_size or 512, seed=self.prompt_seed,
                                fresh_from=self.fresh_from, fallback=self.tokenizer is None)
            await maker.prepare()
            maker.follow_sessions([p.request for p in self.planned])
            self.prompts = maker
        if self.prompts is not None:
            self.run.prompt_note = self.prompts.approximate

    def _messages(self, request: WorkloadRequest) -> list[dict[str, Any]]:
        turn = list(request.messages) if request.messages is not None else [
            {"role": "user", "content": request.prompt}]
        if request.session_id is None:
            return turn
        return [*self._history.get(request.session_id, []), *turn]

    def body(self, request: WorkloadRequest) -> dict[str, Any]:
        out = _output(request)
        body: dict[str, Any] = {"max_tokens": out, "ignore_eos": True, "min_tokens": out, **request.extra}
        if _synthetic(request):  # a raw prompt: no chat template between blocks, the tokens are the blocks'
            assert self.prompts is not None and request.input_length is not None
            body["prompt"] = self.prompts.text(request.hash_ids, request.input_length)
        else:
            body["messages"] = self._messages(request)
        if self.model:
            body["model"] = self.model
        return body

    async def ready(self) -> None:
        """Prepare what the requests need before the clock starts: the engine's one-token words, when prompts
        are to be made."""
        headers = {"Authorization": f"Bearer {self.target.api_key}"} if self.target.api_key else {}
        async with httpx.AsyncClient(timeout=30, headers=headers) as http:
            await self._prepare_prompts(http)

    @property
    def in_flight(self) -> int:
        return len(self._since)

    def oldest_wait_s(self, now: float) -> float | None:
        """How long the oldest request in flight has been out (None: none is)."""
        return now - min(self._since.values()) if self._since else None

    async def go(self, start_at: float | None = None) -> EngineRun:
        """Prepare, then run the plan from now (or from `start_at`, a moment of time.monotonic(): the one
        clock of every worker process of a run): its clock starts when everything is ready, so no request
        starts out late."""
        await self.ready()
        self._ended = {p.index: asyncio.Event() for p in self.planned}
        gate = asyncio.Semaphore(self.concurrency) if self.concurrency else None
        if start_at is not None:
            await until(start_at)
        started = t0 = time.monotonic() if start_at is None else start_at
        monitor = SelfMonitor()
        try:
            async with monitor:
                self._sending = asyncio.gather(*(self._one(p, started, gate) for p in self.planned))
                try:
                    await self._sending
                except asyncio.CancelledError:
                    if not self._gone:  # cancelled from outside (Ctrl-C): not ours to swallow
                        raise
        finally:
            self.run.duration_s = time.monotonic() - t0
            self.run.client = monitor.load
        return self.run

    async def _one(self, planned: Planned, started: float, gate: asyncio.Semaphore | None) -> None:
        try:
            if planned.after is not None:
                await self._ended[planned.after].wait()
                if planned.delay_s:
                    await asyncio.sleep(planned.delay_s)
            due = None
            if planned.at_s is not None:
                due = started + planned.at_s
                await until(due)
            if gate is not None:
                await gate.acquire()
            try:
                body = self.body(planned.request)
                if due is not None and planned.after is None:
                    self.run.lateness_s.append(max(0.0, time.monotonic() - due))
                path = COMPLETIONS_PATH if "prompt" in body else CHAT_PATH
                self.sent += 1
                self._since[planned.index] = time.monotonic()
                self.max_in_flight = max(self.max_in_flight, len(self._since))
                try:
                    result = await self.client.chat(self.target, body, workload="bench", index=planned.index,
                                                    path=path)
                finally:
                    del self._since[planned.index]
            finally:
                if gate is not None:
                    gate.release()
            req = planned.request
            if req.session_id is not None and result.ok and "messages" in body:
                turn = body["messages"][len(self._history.get(req.session_id, [])):]
                self._history[req.session_id] = [*self._history.get(req.session_id, []), *turn,
                                                 {"role": "assistant", "content": result.text}]
            self.run.results.append((planned, result))
            self._refused = self._refused + 1 if result.failure == "refused" else 0
            if self._refused >= GONE_AFTER and not self._gone and self._sending is not None:
                self._gone = True  # what is not sent yet is not sent: the part ends here
                self.run.error = (f"the engine stopped answering ({GONE_AFTER} requests in a row: "
                                  f"{result.error}); its part ended after {len(self.run.results)} of "
                                  f"{len(self.planned)} requests")
                self._sending.cancel()
            if self.on_result is not None:
                self.on_result(self.target.name, planned, result)
        finally:
            self._ended[planned.index].set()


SPIN_S = 0.0015  # the event loop's timers wake up to a millisecond late (epoll): the last stretch is yielded


async def until(due: float) -> None:
    """Return at `due` (time.monotonic()), not a millisecond after: sleep most of the way, then yield to the
    loop until the moment comes."""
    if (wait := due - time.monotonic()) > SPIN_S:
        await asyncio.sleep(wait - SPIN_S)
    while time.monotonic() < due:
        await asyncio.sleep(0)


def table(summaries: list[EngineSummary]) -> str:
    """The engines side by side, a row per figure."""
    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1000:.0f}"

    def spread(s: Spread) -> str:
        return f"{ms(s.p50)} / {ms(s.p90)} / {ms(s.p99)}"

    def num(v: float | None, fmt: str = "{:.2f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    rows: list[tuple[str, list[str]]] = [
        ("requests ok / sent", [f"{s.ok} / {s.requests}" for s in summaries]),
        ("errors", [str(s.errors) for s in summaries]),
        ("wrong output length", [str(s.wrong_length) for s in summaries]),
        ("TTFT ms p50/p90/p99", [spread(s.ttft_s) for s in summaries]),
        ("TPOT ms p50/p90/p99", [spread(s.tpot_s) for s in summaries]),
        ("ITL ms p50/p90/p99", [spread(s.itl_s) for s in summaries]),
        ("E2E ms p50/p90/p99", [spread(s.e2el_s) for s in summaries]),
        ("decode tok/s p50", [num(s.decode_tps_p50, "{:.1f}") for s in summaries]),
        ("requests/s", [num(s.requests_per_s) for s in summaries]),
        ("output tok/s", [num(s.output_tokens_per_s, "{:.1f}") for s in summaries]),
        ("J / output token", [num(s.joules_per_token, "{:.3g}") for s in summaries]),
        ("cached share", ["n/a" if s.cached_share is None else f"{s.cached_share * 100:.1f}%"
                          for s in summaries]),
        ("send lateness ms p50/p99", [f"{ms(s.lateness_s.p50)} / {ms(s.lateness_s.p99)}" for s in summaries]),
        ("mean in flight", [num(s.mean_in_flight) for s in summaries]),
    ]
    if any(s.slo for s in summaries):
        rows.append((f"SLO {summaries[0].slo} met", ["n/a" if s.attainment is None else
                                                      f"{s.attainment * 100:.1f}%" for s in summaries]))
        rows.append(("goodput req/s", [num(s.goodput_rps) for s in summaries]))
    head = ["", *(s.engine for s in summaries)]
    width = [max(len(r[0]) for r in rows)] + [max(len(h), *(len(r[1][i]) for r in rows))
                                              for i, h in enumerate(head[1:])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, width, strict=True))]
    lines += ["  ".join([name.ljust(width[0]), *(v.rjust(w) for v, w in zip(values, width[1:], strict=True))])
              for name, values in rows]
    for s in summaries:
        if s.error:
            lines.append(f"{s.engine}: stopped early: {s.error}")
        for e in s.first_errors:
            lines.append(f"{s.engine}: error: {e}")
        for note in s.client_notes:
            lines.append(f"{s.engine}: {note}")
        if s.prompt_note:
            lines.append(f"{s.engine}: {s.prompt_note}")
        if s.energy_scope:
            lines.append(f"{s.engine}: energy {s.energy_j:.1f} J of {s.energy_scope} ({s.energy_source})")
        elif s.energy_note:
            lines.append(f"{s.engine}: energy n/a: {s.energy_note}")
    return "\n".join(lines)
