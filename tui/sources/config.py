"""Read an engine's effective configuration from the running engine (tui.model.config.EngineConfig).

- llama-server: GET /props (the per-slot n_ctx, total_slots, model, build, modalities), GET /slots (each
  slot's n_ctx, whether a draft is configured) and, for an engine on this machine, the listening process's
  argv and its LLAMA_ARG_* environment: the total context, -np, --kv-unified, the KV cache types, flash
  attention, GPU layers, batch sizes, the speculative type, depth, p-min and draft model. /props gives the
  context of one slot; whether the slots share one KV pool or split -c between them is only on the command
  line (or the start-up log): `-np N` without `--kv-unified` splits it, `-np` left at auto (4 slots) shares
  it.
- vLLM: the labels of `vllm:cache_config_info` in /metrics (the KV pool in tokens, block size, prefix caching,
  cache dtype, ...), max_model_len from /v1/models, the version from /version, and the argv when local.
- SGLang: GET /get_server_info (server args and the scheduler's max_total_num_tokens). It also carries the
  server's API keys in clear: only the named fields below are read from it, never shown whole.

The argv is read only from the engine's own process (not a tunnel, proxy or port-forward listening in front
of it), parsed and masked with the engine's own option table (tui.engines: every secret in every spelling its
parser takes; an `--api-key-file` keeps its path, its content is never read). A setting the command line left
to the engine's default is marked so (`defaults`). What cannot be read is said in `lacks`. Nothing here
imports Textual.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tui.engines import llamacpp, options_llamacpp, sglang, vllm
from tui.engines.argv import mask_argv, parse, says_secret
from tui.engines.knowledge import EngineKnowledge, program_name
from tui.engines.known import by_dialect
from tui.model.config import EngineConfig
from tui.model.slots import SlotsReading
from tui.sources.config_ollama import Post, ollama_config
from tui.sources.json_answers import Fetch, fetch_json, lenient_float, lenient_int, parse_json

CACHE_INFO = "vllm:cache_config_info"
_SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"  # registered only when speculative decoding is configured
# llama-server's environment twins of its options (LLAMA_ARG_*, from its --help), secrets left out: they are
# never read, not even to be masked
_LLAMA_ENV = {name: option for name, option in options_llamacpp.ENV.items()
              if option not in llamacpp.OPTIONS.secret and not says_secret(option)}
_OFF = ("0", "false", "off", "no")

Command = tuple[list[str], dict[str, str]]  # a process's argv and its LLAMA_ARG_* environment


# ---------------------------------------------------------------- the local process


def local_command(pid: int, engine: EngineKnowledge | None = None) -> Command | str:
    """The process's argv and its LLAMA_ARG_* environment, or why they cannot be read. With `engine`, only
    when the process is that engine: an ssh tunnel, docker-proxy, a port-forward or `enginetop proxy` on the
    engine's port is not read as the engine (its argv would say nothing of the engine's settings)."""
    try:
        proc = psutil.Process(pid)
        argv = proc.cmdline()
    except psutil.NoSuchProcess:
        return f"argv: the process listening on its port (PID {pid}) has exited"
    except psutil.AccessDenied:
        return f"argv: PID {pid} belongs to another user"
    if engine is not None and not engine.is_engine(argv):
        return (f"argv: not read: the listener on its port is {program_name(argv)} (PID {pid}), not "
                f"{engine.program}")
    try:
        env = {k: v for k, v in proc.environ().items() if k in _LLAMA_ENV}
    except psutil.Error:
        env = {}
    return argv, env


# ---------------------------------------------------------------- llama-server


def _llama_model(models: Any, fields: dict[str, Any]) -> bool:
    """The model's facts from llama-server's /v1/models `meta` (n_params, size, n_ctx_train)."""
    data = models.get("data") if isinstance(models, dict) else None
    meta = data[0].get("meta") if isinstance(data, list) and data and isinstance(data[0], dict) else None
    if not isinstance(meta, dict):
        return False
    fields.update(params=lenient_int(meta.get("n_params")), model_bytes=lenient_int(meta.get("size")),
                  train_context=lenient_int(meta.get("n_ctx_train")))
    if not fields.get("quantization") and isinstance(meta.get("ftype"), str):
        fields["quantization"] = meta["ftype"]
    return True


def llama_config(props: dict[str, Any] | None, slots: SlotsReading | None,
                 command: Command | str | None, lacks: list[str],
                 pid: int | None = None, secrets: Sequence[str] = (), models: Any = None) -> EngineConfig:
    sources: list[str] = []
    fields: dict[str, Any] = {}
    if props is not None:
        sources.append("/props")
        settings = props.get("default_generation_settings")
        n_ctx = lenient_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if n_ctx is None:
            lacks.append("/props has no default_generation_settings.n_ctx (an older llama-server)")
        fields["context_tokens"] = n_ctx
        fields["slots"] = lenient_int(props.get("total_slots"))
        if fields["slots"] is None:
            lacks.append("/props has no total_slots (an older llama-server)")
        fields["model"] = props.get("model_path") or props.get("model_alias")
        build = props.get("build_info")
        fields["version"] = build if isinstance(build, str) and build else None
        modalities = props.get("modalities")
        if isinstance(modalities, dict):
            fields["modalities"] = tuple(k for k, v in modalities.items() if v is True)
        if isinstance(props.get("model_ftype"), str):
            fields["quantization"] = props["model_ftype"]
        params = settings.get("params") if isinstance(settings, dict) else None
        if isinstance(params, dict):  # the sampling defaults, where this build publishes them
            fields["sampling"] = tuple((k, f"{v:g}" if isinstance(v, float) else str(v))
                                       for k, v in params.items()
                                       if k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty"))
    if _llama_model(models, fields):
        sources.append("/v1/models")
    if slots is not None and slots.error is None and slots.slots:
        sources.append("/slots")
        if fields.get("context_tokens") is None:
            fields["context_tokens"] = slots.slots[0].n_ctx
        if fields.get("slots") is None:
            fields["slots"] = len(slots.slots)
        if not any(s.speculative for s in slots.slots):
            fields["spec_type"] = "off"  # /slots says no slot can draft; the argv below may name the type
    elif slots is not None and slots.error:
        lacks.append(f"/slots: {slots.error}")
    argv: tuple[str, ...] = ()
    if isinstance(command, str):
        lacks.append(command)
    elif command is not None:
        raw, env = command
        argv = mask_argv(raw, llamacpp.OPTIONS, secrets)
        sources.append(f"argv (PID {pid})" if pid is not None else "argv")
        # read from the masked argv: a value that held a secret must not come back as a setting
        fields["defaults"] = _llama_argv(list(argv), env, fields, slots)
    return EngineConfig(engine="llama.cpp", read_wall=time.time(), argv=argv, pid=pid if argv else None,
                        sources=tuple(sources), lacks=tuple(lacks), **fields)


def _llama_argv(raw: list[str], env: dict[str, str], fields: dict[str, Any],
                slots: SlotsReading | None) -> tuple[str, ...]:
    """The settings llama-server's command line (and LLAMA_ARG_* environment) gives, into `fields`; returns
    the fields that hold llama-server's default because neither set them."""
    read = parse(raw, llamacpp.OPTIONS)
    from_env: dict[str, str] = {}
    for key, value in env.items():
        option = _LLAMA_ENV.get(key)
        if option is None:
            continue
        if llamacpp.OPTIONS.nargs.get(option) == 0:  # a switch: LLAMA_ARG_CACHE_PROMPT=0 is its negation
            negation = "--no-" + option[2:]
            if value.strip().lower() in _OFF and negation in llamacpp.OPTIONS.nargs:
                option = negation
            value = ""
        from_env[option] = value
    for option in read.options:  # the command line wins over the environment, as in llama-server
        from_env.pop(option[:2] + option[5:] if option.startswith("--no-") else "--no-" + option[2:], None)
    opts = {**from_env, **read.options}
    defaults: list[str] = []
    total = lenient_int(opts.get("--ctx-size"))
    parallel = lenient_int(opts.get("--parallel"))
    unified: bool | None
    off = ("0", "false", "off")
    if "--kv-unified" in opts and opts["--kv-unified"] not in off:
        unified = True
    elif "--no-kv-unified" in opts or opts.get("--kv-unified") in off:
        unified = False
    else:
        # llama-server: slots left at auto (-np -1) share one pool; -np N alone splits -c into N parts
        unified = parallel is None or parallel < 0
        if unified:
            defaults.append("kv_unified")  # -np left at auto; an explicit -np N splits, as asked
    fields["kv_unified"] = unified
    if total:
        fields["kv_pool_tokens"] = total
    ctk, ctv = opts.get("--cache-type-k"), opts.get("--cache-type-v")
    if ctk or ctv:
        k, v = ctk or "f16", ctv or "f16"
        fields["kv_cache_dtype"] = k if k == v else f"K {k} / V {v}"
    else:
        fields["kv_cache_dtype"] = "f16"  # llama-server's default for both
        defaults.append("kv_cache_dtype")
    # llama-server caches each slot's prompt unless told not to (a request may still opt out: cache_prompt)
    fields["prefix_caching"] = "--no-cache-prompt" not in opts
    if "--no-cache-prompt" not in opts and "--cache-prompt" not in opts:
        defaults.append("prefix_caching")
    fields["flash_attn"] = opts.get("--flash-attn")
    fields["gpu_layers"] = opts.get("--gpu-layers")
    fields["batch_size"] = lenient_int(opts.get("--batch-size"))
    fields["ubatch_size"] = lenient_int(opts.get("--ubatch-size"))
    draft = opts.get("--spec-draft-model")
    spec = opts.get("--spec-type")
    speculates = slots is not None and any(s.speculative for s in slots.slots)
    if spec is None and draft:
        spec = "draft-simple"
    if spec is None:
        spec = "off" if not speculates else None
    fields["spec_type"] = spec if spec != "none" else "off"
    if fields["spec_type"] not in (None, "off"):
        option = llamacpp.depth_option(fields["spec_type"])
        depth = lenient_int(opts.get(option)) if option else None
        if depth is None and option == "--spec-draft-n-max":
            depth = 3  # llama-server's default depth of a draft model
            defaults.append("spec_n_max")
        fields["spec_n_max"] = depth  # an n-gram type's own default is not assumed: None, not a guess
        fields["spec_n_min"] = lenient_int(opts.get("--spec-draft-n-min"))
        fields["spec_p_min"] = lenient_float(opts.get("--spec-draft-p-min"))
        fields["spec_draft_model"] = draft.rsplit("/", 1)[-1] if draft else None
        rates, length = opts.get("--spec-synth-rates"), opts.get("--spec-synth-len")
        fields["spec_synthetic"] = f"rates {rates}" if rates else f"len {length}" if length else None
    return tuple(defaults)


# ---------------------------------------------------------------- vLLM


def cache_config_labels(metrics_text: str) -> dict[str, str] | None:
    """The labels of vllm:cache_config_info in a /metrics body (None: the engine does not publish it)."""
    start = metrics_text.find(CACHE_INFO + "{")
    if start < 0:
        return None
    end = metrics_text.find("\n", start)
    line = metrics_text[start:end if end >= 0 else None]
    try:
        for family in text_string_to_metric_families(line + "\n"):
            for sample in family.samples:
                return dict(sample.labels)
    except ValueError:
        return None
    return None


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"true": True, "false": False}.get(value.strip().lower())


def vllm_config(labels: dict[str, str] | None, models: Any, version: str | None,
                command: Command | str | None, lacks: list[str],
                spec_counters: bool | None = None, pid: int | None = None, secrets: Sequence[str] = ()
                ) -> EngineConfig:
    sources: list[str] = []
    fields: dict[str, Any] = {"version": version}
    if version is not None:
        sources.append("/version")
    if labels is not None:
        sources.append("cache_config_info")
        fields.update(
            kv_pool_tokens=lenient_int(labels.get("kv_cache_size_tokens")),
            block_size=lenient_int(labels.get("block_size")),
            prefix_caching=_truthy(labels.get("enable_prefix_caching")),
            kv_cache_dtype=labels.get("cache_dtype"),
            gpu_memory_utilization=lenient_float(labels.get("gpu_memory_utilization")),
            kv_max_concurrency=lenient_float(labels.get("kv_cache_max_concurrency")),
            mamba_cache_mode=labels.get("mamba_cache_mode") if labels.get("mamba_cache_mode") not in (
                None, "none", "None") else None,
            published=tuple(sorted(labels.items())))
        if fields["kv_pool_tokens"] is None:
            lacks.append("cache_config_info has no kv_cache_size_tokens (a vLLM before it was published)")
    else:
        lacks.append("/metrics has no vllm:cache_config_info: KV pool and prefix caching not published")
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        sources.append("/v1/models")
        fields["model"] = data[0].get("id")
        fields["served_names"] = tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id"))
        fields["context_tokens"] = lenient_int(data[0].get("max_model_len"))
        if fields["context_tokens"] is None:
            lacks.append("/v1/models gives no max_model_len")
    if spec_counters is not None:
        fields["spec_type"] = "on" if spec_counters else "off"
    argv: tuple[str, ...] = ()
    if isinstance(command, str):
        lacks.append(command)
    elif command is not None:
        raw = command[0]
        argv = mask_argv(raw, vllm.OPTIONS, secrets)
        sources.append(f"argv (PID {pid})" if pid is not None else "argv")
        opts = parse(argv, vllm.OPTIONS).options  # the masked argv: no secret comes back as a setting
        if (seqs := lenient_int(opts.get("--max-num-seqs"))) is not None:
            fields["slots"] = seqs
        fields["dtype"] = opts.get("--dtype")
        fields["quantization"] = opts.get("--quantization")
        spec = opts.get("--speculative-config")
        if spec is not None:
            parsed = parse_json(spec.encode())
            if isinstance(parsed, dict):
                fields["spec_type"] = str(parsed.get("method") or parsed.get("model") or "on")
                fields["spec_n_max"] = lenient_int(parsed.get("num_speculative_tokens"))
                fields["spec_draft_model"] = parsed.get("model")
    return EngineConfig(engine="vLLM", read_wall=time.time(), argv=argv, pid=pid if argv else None,
                        sources=tuple(sources), lacks=tuple(lacks), **fields)


# ---------------------------------------------------------------- SGLang


def sglang_config(info: Any, command: Command | str | None,
                  lacks: list[str], pid: int | None = None, secrets: Sequence[str] = ()) -> EngineConfig:
    """Only named fields of /get_server_info: the same answer holds the server's API keys."""
    sources: list[str] = []
    fields: dict[str, Any] = {}
    if isinstance(info, dict):
        sources.append("/get_server_info")
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}

        def get(key: str) -> Any:
            return info.get(key, state.get(key))

        radix = get("disable_radix_cache")
        algorithm = get("speculative_algorithm")
        fields.update(
            version=get("version") if isinstance(get("version"), str) else None,
            model=get("served_model_name") if isinstance(get("served_model_name"), str) else None,
            context_tokens=lenient_int(get("context_length")),
            kv_pool_tokens=lenient_int(get("max_total_num_tokens")),
            slots=lenient_int(get("max_running_requests")),
            prefix_caching=None if not isinstance(radix, bool) else not radix,
            kv_cache_dtype=get("kv_cache_dtype") if isinstance(get("kv_cache_dtype"), str) else None,
            block_size=lenient_int(get("page_size")),
            gpu_memory_utilization=lenient_float(get("mem_fraction_static")),
            spec_type=str(algorithm) if algorithm else "off",
            spec_n_max=lenient_int(get("speculative_num_draft_tokens")) if algorithm else None)
        if fields["context_tokens"] is None:
            lacks.append("/get_server_info gives no context_length")
    argv: tuple[str, ...] = ()
    if isinstance(command, str):
        lacks.append(command)
    elif command is not None:
        argv = mask_argv(command[0], sglang.OPTIONS, secrets)
        sources.append(f"argv (PID {pid})" if pid is not None else "argv")
    return EngineConfig(engine="SGLang", read_wall=time.time(), argv=argv, pid=pid if argv else None,
                        sources=tuple(sources), lacks=tuple(lacks), **fields)


def config_json(config: EngineConfig | None) -> dict[str, Any] | None:
    """The configuration as a result keeps it: every field, and its one-line summary."""
    if config is None:
        return None
    return {**dataclasses.asdict(config), "published": dict(config.published), "summary": config.summary(),
            "facts": config.facts()}


def config_from_json(data: dict[str, Any] | None) -> EngineConfig | None:
    """A configuration a result kept (config_json), back as the value (fields of a later version ignored)."""
    if not data:
        return None
    known = {f.name: f for f in dataclasses.fields(EngineConfig)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            continue
        if key == "published" and isinstance(value, dict):
            value = tuple(sorted(value.items()))
        elif isinstance(value, list):
            value = tuple(value)
        values[key] = value
    try:
        return EngineConfig(**values)
    except TypeError:
        return None


# ---------------------------------------------------------------- reading it


async def read_config(fetch: Fetch, dialect: str, *, slots: SlotsReading | None = None,
                      metrics_text: str | None = None, pid: int | None = None,
                      remote: bool = False, secrets: Sequence[str] = (), no_pid: str | None = None,
                      post: Post | None = None) -> EngineConfig | None:
    """The configuration of a running engine of `dialect` (as /metrics named it), asked with `fetch`.
    `metrics_text`: a /metrics body just read (vLLM's cache_config_info is in it). `pid`: the local process
    that listens on the engine's port; `remote`: the engine is on another machine (its argv cannot be read);
    `secrets`: the target's own key (and password), masked wherever they appear in the argv; `no_pid`: why no
    process is the engine's when one holds its port (tui.sources.port_holder). None for an engine of no known
    dialect."""
    lacks: list[str] = []
    command: Command | str | None
    if remote:
        command = "argv: the engine runs on another machine"
    elif pid is None:
        command = f"argv: not read: {no_pid}" if no_pid else \
            "argv: no process of this machine was found listening on its port"
    else:
        command = local_command(pid, by_dialect(dialect))

    async def get_json(path: str) -> Any:
        return await fetch_json(fetch, path, lacks)

    if dialect == "ollama":
        return await ollama_config(fetch, None if isinstance(command, str) else pid,
                                   command if isinstance(command, str) else None, secrets, post)
    if dialect == "llamacpp":
        props = await get_json("/props")
        return llama_config(props if isinstance(props, dict) else None, slots, command, lacks, pid, secrets,
                            await get_json("/v1/models"))
    if dialect == "vllm":
        # prometheus_client's own exposition at /metrics/ honours name[]: two lines instead of thousands
        filtered = "/metrics/?" + urlencode([("name[]", CACHE_INFO), ("name[]", _SPEC_DRAFTS)])
        for path in (filtered, "/metrics"):
            if metrics_text is not None and CACHE_INFO in metrics_text:
                break
            try:
                status, body = await fetch(path)
                metrics_text = body.decode("utf-8", "replace") if status == 200 else metrics_text
            except ValueError as exc:
                lacks.append(f"/metrics: {exc}")
                break
        labels = cache_config_labels(metrics_text) if metrics_text is not None else None
        models = await get_json("/v1/models")
        version = await get_json("/version")
        spec = None if metrics_text is None else _SPEC_DRAFTS in metrics_text
        return vllm_config(labels, models, version.get("version") if isinstance(version, dict) else None,
                           command, lacks, spec, pid, secrets)
    if dialect == "sglang":
        return sglang_config(await get_json("/get_server_info"), command, lacks, pid, secrets)
    return None
