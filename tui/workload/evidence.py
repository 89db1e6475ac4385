"""What a bench or capacity run revealed about an engine: the findings (tui.findings) its own requests and the
engine's figures support. A request's shared prefix comes from the workload's hash ids, in the order the
requests were sent (the ids are chained: an id seen before means the same tokens up to that block)."""

from __future__ import annotations

from collections.abc import Sequence

from tui.findings.facts import refused_for_length, refused_tokens, spec_between, summarize
from tui.findings.judge import judge
from tui.findings.prefix import shared_by_ids
from tui.model.findings import Evidence, Finding, RequestFacts
from tui.model.samples import EngineSample
from tui.probe.results import ProbeResult
from tui.workload.schedule import Planned


def request_facts(results: Sequence[tuple[Planned, ProbeResult]],
                  block_size: int | None) -> list[RequestFacts]:
    seen: set[int] = set()
    out = []
    for planned, result in sorted(results, key=lambda x: x[1].sent_at or 0.0):
        req = planned.request
        shared = None
        if req.hash_ids and block_size and req.input_length:
            shared = shared_by_ids(seen, req.hash_ids, block_size, req.input_length)
        refused = refused_for_length(result.status, result.error)
        server = result.server
        prompt_s = None
        if server is not None and server.prompt_ms is not None:
            prompt_s = server.prompt_ms / 1000.0
        elif result.server_ttft_s is not None:
            prompt_s = result.server_ttft_s
        out.append(RequestFacts(
            ok=result.ok, prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens, shared_tokens=shared if result.ok else None,
            ttft_s=result.ttft_s,
            engine_prompt_s=prompt_s, refused_for_length=refused,
            refused_prompt_tokens=refused_tokens(result.error) if refused else None))
    return out


def run_findings(name: str, results: Sequence[tuple[Planned, ProbeResult]], block_size: int | None,
                 before: EngineSample | None, after: EngineSample | None,
                 concurrency_max: int | None = None) -> list[Finding]:
    """The findings the run supports; the configuration is the one read before it started."""
    config = before.config if before is not None else None
    facts = summarize(request_facts(results, block_size), concurrency_max)
    spec = spec_between(before.reading if before else None, after.reading if after else None)
    return judge(Evidence(name, config, facts, spec, concurrency_max=concurrency_max))
