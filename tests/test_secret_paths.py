"""No generated secret survives any output path: a command line with a secret in any spelling its engine
takes (and the target's own key anywhere on it) is read into a configuration, and every place a
configuration goes is searched for the secret: snapshot JSON and text, the engine column as drawn, a
recording's row encoded and decoded, the HTML report's configuration table, the findings and the exporter.
The command line may be run by a shell (`sh -c "exec ..."`, `bash -lc`, `env ... sh -c`), hold a URL that
carries a credential, and options named for tokens that hold numbers, which are kept. The A/B result and
its report, which keep each arm's argv, are searched the same way. The real engines started with secrets
are in tests/test_secret_engines.py."""

from __future__ import annotations

import json
import shlex
import string
from collections.abc import Callable

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from tests.sse_server import SSEServer
from tui.cli.snapshot import table
from tui.compare.ab import ABConfig, Arm, run_comparison
from tui.compare.engines import Started, Target
from tui.compare.report import render_html
from tui.engines.argv import Options
from tui.engines.known import ENGINES
from tui.exporter.metrics import ProbeMetrics
from tui.findings.judge import judge
from tui.html.config import config_section
from tui.live.engine_state import EngineState
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


def _token_options(table_: Options) -> list[str]:
    """Options named for tokens that hold a number or a name (vLLM's --long-prefill-token-threshold)."""
    return [s for s in _plain_options(table_) if "token" in s]


# How a shell or a wrapper runs a command line (given as one string, and the secret, which some of them also
# put in an environment variable)
Wrapper = Callable[[str, str], list[str]]
WRAPPERS: list[Wrapper] = [
    lambda cmd, _: ["sh", "-c", f"exec {cmd}"],
    lambda cmd, _: ["/bin/sh", "-c", cmd],
    lambda cmd, _: ["bash", "-lc", f"cd /srv && {cmd}"],
    lambda cmd, _: ["bash", "-o", "pipefail", "-ec", f"{cmd} 2>&1 | tee engine.log"],
    lambda cmd, secret: ["env", f"HF_TOKEN={secret}", "sh", "-c", f"echo starting\nexec {cmd}"],
    lambda cmd, secret: ["sh", "-c", f"HF_TOKEN={shlex.quote(secret)} exec {cmd}"],
    lambda cmd, _: ["env", "LANG=C", "/usr/bin/env", "-S", cmd],
    lambda cmd, _: ["sh", "-c", f"sh -c {shlex.quote('exec ' + cmd)}"],
]
# A model's URL that carries a credential (the secret is URL-safe)
URLS = [
    "https://{}@huggingface.co/org/m/resolve/main/m.gguf",
    "https://me:{}@host/m.gguf",
    "https://{}:x-oauth-basic@github.com/org/m",
    "https://host/m.gguf?download=1&token={}",
    "https://host/m.gguf#access_token={}&state=1",
    "https://b.s3.amazonaws.com/m.gguf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20250101"
    "&X-Amz-Security-Token={0}&X-Amz-Signature={0}",
    "https://storage.googleapis.com/b/m.gguf?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature={}",
    "https://acct.blob.core.windows.net/c/m.gguf?sv=2022-11-02&sp=r&sig={}",
    "s3://b/m.gguf?key={}",
]
url_secrets = st.text(string.ascii_letters + string.digits + "-_.~", min_size=10, max_size=40).map(
    lambda s: "Zu" + s)
KEPT = "4711"  # the value of an option named for tokens: a number, never masked


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[str, list[str], list[str], str, bool]:
    """(engine, argv, the secrets on it, the target's own key placed in some other value, whether an option
    named for tokens holds KEPT)."""
    engine = draw(st.sampled_from([e for e in ENGINES if e.options.secret]))  # Ollama's runner takes none
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
    hidden = [secret]
    if plain and draw(st.booleans()):  # a URL that carries a credential, as any option's value
        url_secret = draw(url_secrets)
        args += [draw(st.sampled_from(plain)), draw(st.sampled_from(URLS)).format(url_secret)]
        hidden.append(url_secret)
    tokens = _token_options(options)
    kept = bool(tokens) and draw(st.booleans())
    if kept:
        args += [draw(st.sampled_from(tokens)), KEPT]
    argv = [*head, *args[:where * 2], *secret_args, *args[where * 2:], "--port", "8000"]
    if draw(st.booleans()):  # run by a shell, or behind env
        argv = draw(st.sampled_from(WRAPPERS))(shlex.join(argv), secret)
    return engine.dialect, argv, hidden, key, kept


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
def test_no_generated_secret_survives_any_output_path(case: tuple[str, list[str], list[str], str, bool]
                                                     ) -> None:
    dialect, argv, hidden, key, kept = case
    config = _config(dialect, argv, key)
    assert config.argv, "the argv was read"
    out = _every_output(config)
    for secret in hidden:
        assert secret not in out
    assert key not in out
    assert "--port" in out  # the rest of the command line is still shown
    assert not kept or KEPT in out  # an option named for tokens that holds a number keeps it


class _Launched:
    """An arm that says it launched `argv` and serves from a shared fake server."""

    attached = False

    def __init__(self, name: str, url: str, argv: list[str]) -> None:
        self.name, self.url, self.argv = name, url, argv

    def start(self) -> Started:
        return Started(Target(self.name, self.url), 0.0, None, None, argv=tuple(self.argv))

    def stop(self) -> None:
        pass


HF = "hf_ab_secret_3c9e"
# (engine kind, what the arm launched, what must still be in the result): each a secret in a spelling its
# engine takes, inside a shell's string or a URL; the A/B result masks the argv by the arm's engine kind
AB_ARMS = [
    ("llama.cpp", ["sh", "-c", f"exec llama-server -hft {HF} --port 8080"], "-hft"),
    ("llama.cpp", ["bash", "-lc", f"llama-server --hf-token={HF}"], "--hf-token"),
    (None, ["/bin/sh", "-c", f"exec llama-server -hft {HF}"], "-hft"),
    ("vllm", ["env", f"HF_TOKEN={HF}", "sh", "-c", f"exec vllm serve m --api-key {HF} --port 8000"],
     "--api-key"),
    ("vllm", ["vllm", "serve", "m", "--long-prefill-token-threshold", KEPT, "--tokenizer-mode", "slow"],
     f"--long-prefill-token-threshold {KEPT}"),
    ("vllm", ["sh", "-c", f"exec vllm serve m --dbo-prefill-token-threshold {KEPT}"],
     f"--dbo-prefill-token-threshold {KEPT}"),
    ("llama.cpp", ["llama-server", "-mu", f"https://b.s3.amazonaws.com/m.gguf?X-Amz-Expires=900&"
                                          f"X-Amz-Signature={HF}"], "X-Amz-Expires=900"),
    ("llama.cpp", ["llama-server", "--hf-repo", f"https://{HF}@huggingface.co/org/m"],
     "huggingface.co/org/m"),
]


def test_the_ab_result_and_its_report_keep_no_secret_of_any_arm() -> None:
    server = SSEServer().start()
    try:
        arms = [Arm(f"arm{i}", _Launched(f"arm{i}", server.url, argv), engine_kind=kind)
                for i, (kind, argv, _) in enumerate(AB_ARMS)]
        config = ABConfig(instances=1, blocks=1, requests_per_block=1, max_tokens=4, warmup_requests=0,
                          mode="coresident", bootstrap_samples=50)
        result = run_comparison(arms, config)
    finally:
        server.stop()
    kept_argv = {arm["name"]: " ".join(arm["argv"]) for arm in result["arms"]}
    for i, (_, _, kept) in enumerate(AB_ARMS):
        assert kept in kept_argv[f"arm{i}"], kept_argv[f"arm{i}"]
    for out in (json.dumps(result), render_html(result)):
        assert HF not in out
