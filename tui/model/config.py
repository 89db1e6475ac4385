"""What an engine is really set to, as the running engine publishes it (llama-server's /props, /slots and the
listening process's argv; vLLM's `cache_config_info`, /v1/models and /version; SGLang's /get_server_info).

Never taken from a profile: a profile says what was asked, this says what runs. A figure the engine does not
publish is None, and `lacks` says in words what could not be read and why, so nothing is guessed and shown as
measured. `sources` names where the figures came from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    engine: str  # "llama.cpp", "vLLM", "SGLang"
    read_wall: float  # time.time() when it was read
    version: str | None = None  # llama.cpp build_info, vLLM /version, SGLang version
    model: str | None = None
    # The context one request really gets: llama.cpp's per-slot n_ctx, vLLM's max_model_len, SGLang's
    # context_length.
    context_tokens: int | None = None
    # The KV cache in tokens: vLLM's kv_cache_size_tokens, llama.cpp's -c (every slot's context together),
    # SGLang's max_total_num_tokens.
    kv_pool_tokens: int | None = None
    slots: int | None = None  # llama.cpp total_slots; vLLM max_num_seqs where the argv says it
    kv_unified: bool | None = None  # llama.cpp: the slots share one KV pool (else each gets its share of -c)
    prefix_caching: bool | None = None  # vLLM enable_prefix_caching, SGLang not disable_radix_cache
    kv_cache_dtype: str | None = None  # llama.cpp -ctk/-ctv ("q8_0", "f16/q4_0"), vLLM cache_dtype
    block_size: int | None = None  # vLLM's KV block, in tokens
    gpu_memory_utilization: float | None = None
    kv_max_concurrency: float | None = None  # vLLM: requests of max_model_len that fit in the pool
    mamba_cache_mode: str | None = None  # vLLM, hybrid models
    flash_attn: str | None = None
    gpu_layers: str | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    # Speculative decoding: its type ("off" when the engine says none runs), depth, p-min, draft model
    spec_type: str | None = None
    spec_n_max: int | None = None
    spec_n_min: int | None = None
    spec_p_min: float | None = None
    spec_draft_model: str | None = None
    spec_synthetic: str | None = None  # llama.cpp's benchmarking mode: "rates 0.9,0.6" or "len 1.8"
    modalities: tuple[str, ...] = ()
    # The model's facts a watcher wants beside the figures: llama.cpp's /props model_ftype and /v1/models meta
    # (n_params, size, n_ctx_train), vLLM's served names and --dtype / --quantization
    quantization: str | None = None  # "Q4_K - Medium" (llama.cpp), vLLM's --quantization
    dtype: str | None = None  # vLLM's --dtype
    params: int | None = None  # parameters
    model_bytes: int | None = None  # the weights' file size
    train_context: int | None = None  # the context the model was trained for
    served_names: tuple[str, ...] = ()  # the names the engine answers to (/v1/models)
    sampling: tuple[tuple[str, str], ...] = ()  # the engine's sampling defaults, as published
    argv: tuple[str, ...] = ()  # the local process's command line, secrets masked; () when not readable
    pid: int | None = None  # the local process whose argv this is
    published: tuple[tuple[str, str], ...] = ()  # vLLM's cache_config_info labels, as published
    sources: tuple[str, ...] = ()  # where the figures came from: "/props", "/slots", "argv (PID 123)"...
    lacks: tuple[str, ...] = ()  # what could not be read, and why
    # the fields that hold the engine's default because its command line did not set them (llama.cpp's KV
    # f16, prefix cache, unified slots, draft depth): said as defaults, never as read values
    defaults: tuple[str, ...] = ()

    @property
    def split_slots(self) -> bool:
        """llama.cpp slots that each get a share of the context instead of sharing one pool."""
        return self.kv_unified is False and (self.slots or 0) > 1

    def summary(self) -> str:
        """One line: 'context 32,768 of a 94,208-token KV pool · prefix cache OFF · KV q8_0 · spec draft-mtp
        n=2 · 16 slots × 16,384 split'. Unknown parts are left out (`lacks` says why); a part that is the
        engine's default because the command line did not set it says "(default)"."""
        parts: list[str] = []

        def default(field: str) -> str:
            return " (default)" if field in self.defaults else ""

        if self.context_tokens is not None:
            ctx = f"context {self.context_tokens:,}"
            if self.kv_pool_tokens is not None and self.kv_pool_tokens != self.context_tokens:
                ctx += f" of a {self.kv_pool_tokens:,}-token KV pool"
            parts.append(ctx)
        if self.prefix_caching is not None:
            parts.append(("prefix cache on" if self.prefix_caching else "prefix cache OFF")
                         + default("prefix_caching"))
        if self.kv_cache_dtype is not None:
            parts.append(f"KV {self.kv_cache_dtype}{default('kv_cache_dtype')}")
        if self.spec_type is not None:
            spec = "spec off" if self.spec_type == "off" else f"spec {self.spec_type}"
            if self.spec_type != "off" and self.spec_n_max is not None:
                spec += f" n={self.spec_n_max}{default('spec_n_max')}"
            if self.spec_type != "off" and self.spec_p_min is not None:
                spec += f" p-min {self.spec_p_min:g}"
            if self.spec_synthetic:
                spec += f" (synthetic {self.spec_synthetic})"
            parts.append(spec)
        if self.slots is not None and self.slots > 1:
            each = f" × {self.context_tokens:,}" if self.context_tokens is not None else ""
            how = "" if self.kv_unified is None else " unified" if self.kv_unified else " split"
            how += default("kv_unified") if how else ""
            parts.append(f"{self.slots} slots{each}{how}")
        elif self.slots == 1:
            parts.append("1 slot")
        return " · ".join(parts)

    def facts(self) -> str:
        """The model and engine in one line: 'Q4_K - Medium · 268.1M params · 235 MiB · trained for 32,768 ·
        build b7000', 'bfloat16 · served as gemma-3-270m · vLLM 0.11.0'. Unknown parts are left out."""
        parts: list[str] = []
        if self.quantization:
            parts.append(self.quantization)
        if self.dtype:
            parts.append(self.dtype)
        if self.params:
            parts.append(f"{_count(self.params)} params")
        if self.model_bytes:
            parts.append(f"{self.model_bytes / 2**20:,.0f} MiB" if self.model_bytes < 2**30
                         else f"{self.model_bytes / 2**30:.1f} GiB")
        if self.train_context:
            parts.append(f"trained for {self.train_context:,}")
        if self.served_names:  # as the model row names it: a path's last part; a long list, its count
            names = [n.rsplit("/", 1)[-1] for n in self.served_names[:2]]
            more = f" +{len(self.served_names) - 2}" if len(self.served_names) > 2 else ""
            parts.append(f"served as {', '.join(names)}{more}")
        if self.version:
            parts.append(f"{self.engine} {self.version}")
        return " · ".join(parts)

    def figures(self) -> dict[str, object]:
        """The named figures a report's configuration table compares across arms (None: not published)."""
        return {
            "engine": self.engine, "version": self.version, "model": self.model,
            "context_tokens": self.context_tokens, "kv_pool_tokens": self.kv_pool_tokens, "slots": self.slots,
            "kv_unified": self.kv_unified, "prefix_caching": self.prefix_caching,
            "kv_cache_dtype": self.kv_cache_dtype, "block_size": self.block_size,
            "gpu_memory_utilization": self.gpu_memory_utilization, "flash_attn": self.flash_attn,
            "gpu_layers": self.gpu_layers, "batch_size": self.batch_size, "ubatch_size": self.ubatch_size,
            "spec_type": self.spec_type, "spec_n_max": self.spec_n_max, "spec_p_min": self.spec_p_min,
            "spec_draft_model": self.spec_draft_model, "spec_synthetic": self.spec_synthetic,
            "quantization": self.quantization, "dtype": self.dtype, "params": self.params,
            "model_bytes": self.model_bytes, "train_context": self.train_context,
        }


def _count(n: int) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
