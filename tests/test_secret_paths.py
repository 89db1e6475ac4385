"""No generated secret survives any output path: a command line with a secret in any spelling its engine
takes (and the target's own key anywhere on it) is read into a configuration, and every place a
configuration goes is searched for the secret: snapshot JSON and text, the engine column as drawn, a
recording's row encoded and decoded, the HTML report's configuration table, the findings and the exporter.
The real engines started with secrets are in tests/test_secret_engines.py."""

from __future__ import annotations

import json
import string

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from tui.cli.snapshot import table
from tui.engines.argv import Options
from tui.engines.known import ENGINES
from tui.exporter.metrics import ProbeMetrics
from tui.findings.judge import judge
from tui.html.config import config_section
from tui.live.store import EngineState
from tui.model.findings import Evidence
from tui.model.samples import EngineSample, EngineStats
from tui.record.codec import decode, encode
from tui.run.snapshot import engine_json
from tui.sources.config import config_json, llama_config, sglang_config, vllm_config
from widgets.engine_panel import render_engine

PROPS = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4, "model_path": "/m/gemma.gguf",
         "build_info": "b1"}
LABELS = {"kv_cache_size_tokens": "55356", "block_size": "16", "enable_prefix_caching": "True"}
MODELS = {"data": [{"id": "gemma", "max_model_len": 2048}]}
SGLANG_INFO = {"context_length": 4096, "max_total_num_tokens": 100000, "disable_radix_cache": False}

_ALPHABET = string.ascii_letters + string.digits + "-_.~+/="
# A marker start keeps a shrunk example from being a string every output has anyway ("0000...")
secrets = st.text(_ALPHABET, min_size=10, max_size=40).map(lambda s: "Zq" + s)


def _secret_spellings(table_: Options) -> list[str]:
    return sorted(s for s in table_.nargs if table_.canonical(s) in table_.secret)


def _plain_options(table_: Options) -> list[str]:
    return sorted(s for s, n in table_.nargs.items() if n == 1 and table_.canonical(s) not in table_.secret)


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[str, list[str], str, str]:
    """(engine, argv, the secret on it, the target's own key placed in some other value)."""
    engine = draw(st.sampled_from(ENGINES))
    options = engine.options
    secret, key = draw(secrets), draw(secrets)
    spelling = draw(st.sampled_from(_secret_spellings(options)))
    names = [spelling]
    if spelling.startswith("--"):
        names.append("--" + spelling[2:].replace("-", "_"))
    if options.prefixes:
        names += [spelling[:n] for n in range(3, len(spelling)) if options.resolve(spelling[:n]) == spelling]
    name = draw(st.sampled_from(names))
    if draw(st.booleans()):
        secret_args = [f"{name}={secret}"]
    else:
        extra = [draw(secrets)] if options.nargs.get(spelling) == "+" and draw(st.booleans()) else []
        secret_args = [name, secret, *extra]
    plain = _plain_options(options)
    filler = draw(st.lists(st.sampled_from(plain), max_size=6)) if plain else []
    args: list[str] = []
    for option in filler:
        args += [option, draw(st.sampled_from(["4096", "v1", "/m/x.gguf", f"pre-{key}-post"]))]
    where = draw(st.integers(0, len(args) // 2))
    # the engine as a binary, or a module run by Python with the module joined to -m
    head = draw(st.sampled_from([["/usr/bin/engine"], ["python3", "-mengine.entrypoint"],
                                 ["/v/bin/python", "-u", "-m", "engine.main"]]))
    if engine.dialect == "vllm" and draw(st.booleans()):  # a secret member of a JSON-valued option
        args += ["--model-loader-extra-config", f'{{"s3_secret_access_key": "{secret}", "uri": "s3://b"}}']
    argv = [*head, *args[:where * 2], *secret_args, *args[where * 2:], "--port", "8000"]
    return engine.dialect, argv, secret, key


def _config(dialect: str, argv: list[str], key: str):
    command = (argv, {})
    if dialect == "llamacpp":
        return llama_config(PROPS, None, command, [], pid=4242, secrets=[key])
    if dialect == "vllm":
        return vllm_config(LABELS, MODELS, "0.32.0", command, [], pid=4242, secrets=[key])
    return sglang_config(SGLANG_INFO, command, [], pid=4242, secrets=[key])


def _every_output(config) -> str:
    sample = EngineSample(name="e", url="http://127.0.0.1:8000", t=1.0, wall=1.0, health="up", model="gemma",
                          config=config)
    state = EngineState(name="e", url=sample.url, sample=sample)
    snapshot = {"engines": {"e": engine_json(state)}, "gpus": []}
    findings = judge(Evidence(engine="e", config=config))
    metrics = ProbeMetrics(process=False)
    metrics.engine("e", findings, EngineStats())
    recorded = orjson.dumps(encode(sample))
    return "\n".join([
        json.dumps(snapshot), table(snapshot), render_engine(state, width=200).plain,
        recorded.decode(), repr(decode(EngineSample, orjson.loads(recorded))),
        config_section([("arm", config_json(config))]),
        json.dumps([f.json() for f in findings]), generate_latest(metrics.shared).decode(),
    ])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_no_generated_secret_survives_any_output_path(case: tuple[str, list[str], str, str]) -> None:
    dialect, argv, secret, key = case
    config = _config(dialect, argv, key)
    assert config.argv, "the argv was read"
    out = _every_output(config)
    assert secret not in out
    assert key not in out
    assert "--port" in out  # the rest of the command line is still shown
