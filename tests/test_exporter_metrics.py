"""The exporter's /metrics body: pieces rendered per (engine, workload) by prometheus_client, joined family by
family, must read back (with prometheus_client's own parser) as one registry holding everything would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tui.exporter.metrics import TTFT_BUCKETS, ProbeMetrics, failure_reason, split_families
from tui.probe.results import ProbeResult
from tui.probe.timings import ServerTimings


def result(engine: str, workload: str, ttft: float, *, ok: bool = True, turn: int | None = None,
           token_source: str = "server", model: str = "m") -> ProbeResult:
    return ProbeResult(
        engine=engine, url="http://127.0.0.1:1", workload=workload, index=0, wall_start=1_800_000_000.0,
        sent_at=10.0, first_token_at=10.0 + ttft if ok else None, last_token_at=10.5 if ok else None,
        ended_at=10.6, status=200 if ok else 503, error=None if ok else "HTTP 503: busy",
        failure=None if ok else "http", model=model, prompt_tokens=100, completion_tokens=33,
        cached_tokens=60, token_source=token_source, turn=turn,
        server=ServerTimings(source="llamacpp", prompt_ms=ttft * 500, prompt_per_second=900.0,
                             predicted_per_second=70.0) if ok else None)


def parsed(body: bytes) -> dict[str, dict[tuple, float]]:
    families = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.name not in families, f"{family.name} appears twice"
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return families


def test_joined_pieces_read_as_one_registry() -> None:
    metrics = ProbeMetrics(process=False)
    metrics.declare("quiet", "short")
    observed = [result("a", "short", 0.02), result("a", "short", 0.07),
                result("a", "agent", 0.03, turn=1), result("a", "agent", 0.01, turn=2),
                result("b", "short", 0.2), result("b", "short", 0, ok=False),
                result('we"ird# HELP x', "short", 0.04)]
    for r in observed:
        metrics.observe(r)
    families = parsed(metrics.exposition())
    # One registry fed the same TTFTs: the same buckets, count and sum for engine a.
    reference = CollectorRegistry()
    ref = Histogram("enginetop_probe_ttft_seconds", "x", ("engine", "workload", "model"),
                    buckets=TTFT_BUCKETS, registry=reference)
    for r in observed:
        if r.ok:
            ref.labels(r.engine, r.workload, "m").observe(r.ttft_s)
    want = parsed(generate_latest(reference))["enginetop_probe_ttft_seconds"]
    assert families["enginetop_probe_ttft_seconds"] == want
    requests = families["enginetop_probe_requests"]
    key = ("enginetop_probe_requests_total", (("engine", "quiet"), ("workload", "short")))
    assert requests[key] == 0  # declared before any probe
    assert requests[("enginetop_probe_requests_total", (("engine", "b"), ("workload", "short")))] == 2
    failed = families["enginetop_probe_failed"]
    assert failed == {("enginetop_probe_failed_total",
                       (("engine", "b"), ("reason", "http_503"), ("workload", "short"))): 1.0}
    up = families["enginetop_probe_up"]
    assert up[("enginetop_probe_up", (("engine", "a"),))] == 1
    assert up[("enginetop_probe_up", (("engine", "b"),))] == 0
    # The agent's first turn is a fresh conversation: only the second counts towards the cached share.
    cached = families["enginetop_probe_cached_prompt_share"]
    count = ("enginetop_probe_cached_prompt_share_count",
             (("engine", "a"), ("model", "m"), ("workload", "agent")))
    assert cached[count] == 1
    assert metrics.sample("enginetop_probe_last_ttft_seconds",
                          {"engine": "a", "workload": "short", "model": "m"}) == observed[1].ttft_s


def test_a_new_model_or_token_source_replaces_the_last_value_series() -> None:
    metrics = ProbeMetrics(process=False)
    metrics.observe(result("a", "short", 0.02, model="old"))
    metrics.observe(result("a", "short", 0.03, model="new", token_source="chunks"))
    last = parsed(metrics.exposition())["enginetop_probe_last_decode_tokens_per_second"]
    assert [dict(labels)["model"] for _, labels in last] == ["new"]
    assert [dict(labels)["token_source"] for _, labels in last] == ["chunks"]


def test_split_families_keeps_every_line() -> None:
    text = generate_latest(CollectorRegistry())
    assert split_families(text) == {}
    metrics = ProbeMetrics()
    metrics.observe(result("a", "short", 0.02))
    body = metrics.exposition()
    assert body.endswith(b"\n") and b"\n\n" not in body
    assert b"process_resident_memory_bytes" in body


def test_failure_reasons() -> None:
    assert failure_reason(result("a", "short", 0, ok=False)) == "http_503"


def test_tokens_per_step_and_the_rate_while_serving_are_served_with_help_and_withdrawn() -> None:
    """vLLM's tokens per scheduler step and the generation rate over the time it was serving, beside the busy
    share: served while known, each family with its help text, and gone with the engine's figures."""
    from tui.model.samples import EngineStats, RequestStats

    metrics = ProbeMetrics(process=False)
    rs = RequestStats(window_s=60.0, busy_share=0.25, gen_tps_serving=120.0, tokens_per_step=7.5)
    metrics.engine("v", (), EngineStats(requests=rs))
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    served = {name: [(s.labels, s.value) for s in families[name].samples] for name in (
        "enginetop_busy_share", "enginetop_serving_generation_tokens_per_second",
        "enginetop_tokens_per_step")}
    assert served == {"enginetop_busy_share": [({"engine": "v"}, 0.25)],
                      "enginetop_serving_generation_tokens_per_second": [({"engine": "v"}, 120.0)],
                      "enginetop_tokens_per_step": [({"engine": "v"}, 7.5)]}
    assert "request was running" in families["enginetop_serving_generation_tokens_per_second"].documentation
    assert "per scheduler step" in families["enginetop_tokens_per_step"].documentation
    metrics.engine("v", (), EngineStats(requests=RequestStats(window_s=60.0, busy_share=0.0)))  # idle
    body = metrics.exposition().decode()
    assert 'enginetop_busy_share{engine="v"} 0.0' in body
    assert 'enginetop_tokens_per_step{' not in body and 'enginetop_serving_generation_tokens_per_second{' \
        not in body
    metrics.gone("v")
    assert 'engine="v"' not in metrics.exposition().decode()
