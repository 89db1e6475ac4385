"""vLLM: what enginetop knows of it (ENGINE: its options, secrets, refusal words, the options a suggestion
names). Having and starting the bundled CPU build of vLLM and its model folders: tui.engines.install_vllm."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tui.engines import options_vllm
from tui.engines.argv import Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name


def _is_vllm(argv: Sequence[str]) -> bool:
    # `vllm serve`, `python -m vllm.entrypoints.openai.api_server`, `python -m vllm.entrypoints.cli.main`
    return bool(argv) and program_name(argv).split(".", 1)[0].lower() == "vllm"


def speculative_config(method: str | None, depth: int) -> str:
    """The --speculative-config JSON that sets a draft depth (a method is vLLM's name, e.g. "ngram")."""
    return json.dumps({"method": method or "ngram", "num_speculative_tokens": depth})


def _spec_depth(depth: int, now: int | None, method: str | None) -> str:
    return f"--speculative-config '{speculative_config(method, depth)}'" + (
        f" (num_speculative_tokens now {now})" if now is not None else "")


def _draft_kind(method: str | None) -> DraftKind:
    method = (method or "").lower()
    if method in ("ngram", "ngram_gpu", "suffix"):
        return "n-gram"
    if method in ("eagle", "eagle3", "mtp", "medusa", "mlp_speculator") or method.endswith("_mtp"):
        return "model heads"
    return "draft model" if method else "unknown"


OPTIONS = Options(
    engine="vLLM", nargs=options_vllm.NARGS, aliases=options_vllm.ALIASES, prefixes=True,
    # --api-key takes several keys; --hf-token a token or nothing (then the one stored by `hf auth login`)
    secret=frozenset(s for s, canon in options_vllm.ALIASES.items() if canon in ("--api-key", "--hf-token")),
)

ENGINE = EngineKnowledge(
    dialect="vllm", name="vLLM", program="vLLM", options=OPTIONS, is_engine=_is_vllm,
    # "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input
    # tokens" (0.32); older: "...you requested 40000 tokens"; also "longer than the maximum model length"
    refusal_words=re.compile(r"maximum context length|longer than the maximum model length|"
                             r"context length is \d+|max_model_len", re.IGNORECASE),
    prefix_cache_on="restart vLLM with --enable-prefix-caching (for a hybrid Mamba model, see its "
                    "mamba_cache_mode)",
    spec_depth=_spec_depth,
    spec_off="restart vLLM without --speculative-config",
    context_option="--max-model-len",
    slots_option="--max-num-seqs",
    memory_options="--gpu-memory-utilization, a shorter --max-model-len, --kv-cache-dtype fp8, "
                   "--enforce-eager",
    draft_kind=_draft_kind,
)
