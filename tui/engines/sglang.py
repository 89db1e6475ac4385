"""SGLang: what enginetop knows of it (no SGLang runs here; read from its source, python/sglang/srt/
server_args.py). Its option table is partial: SGLang derives hundreds of options from ServerArgs' fields, and
only the common ones are listed here. An option not listed is one whose value is masked (it is not known
whether it holds a secret) and not read."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tui.engines.argv import ONE, SWITCH, Options
from tui.engines.knowledge import DraftKind, EngineKnowledge, program_name

_VALUES = ("--model-path", "--model", "--tokenizer-path", "--host", "--port", "--tp-size",
           "--tensor-parallel-size", "--dp-size", "--data-parallel-size", "--ep-size",
           "--mem-fraction-static",
           "--context-length", "--max-running-requests", "--max-total-tokens", "--chunked-prefill-size",
           "--max-prefill-tokens", "--schedule-policy", "--kv-cache-dtype", "--page-size", "--dtype",
           "--quantization", "--served-model-name", "--chat-template", "--speculative-algorithm",
           "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
           "--speculative-num-draft-tokens", "--attention-backend", "--log-level", "--cuda-graph-max-bs",
           "--random-seed", "--stream-interval", "--watchdog-timeout", "--device", "--grammar-backend",
           "--tool-call-parser", "--reasoning-parser", "--load-format", "--revision", "--download-dir",
           "--base-gpu-id", "--nnodes", "--node-rank", "--dist-init-addr", "--api-key", "--admin-api-key",
           "--config")
_SWITCHES = ("--disable-radix-cache", "--trust-remote-code", "--enable-metrics", "--disable-cuda-graph",
             "--enable-torch-compile", "--enable-mixed-chunk", "--skip-server-warmup",
             "--enable-cache-report", "--help", "-h")

OPTIONS = Options(
    engine="SGLang", nargs={**dict.fromkeys(_VALUES, ONE), **dict.fromkeys(_SWITCHES, SWITCH)},
    aliases={"--model": "--model-path", "--tensor-parallel-size": "--tp-size",
             "--data-parallel-size": "--dp-size", "-h": "--help"},
    # SGLang's argparse takes prefixes too, but a partial table cannot say which prefix is unambiguous: a
    # prefix is read as an unknown option, whose value is masked
    prefixes=False, secret=frozenset({"--api-key", "--admin-api-key"}),
)


def _is_sglang(argv: Sequence[str]) -> bool:
    # `python -m sglang.launch_server`, `sglang serve`
    return bool(argv) and program_name(argv).split(".", 1)[0].lower() == "sglang"


def _spec_depth(depth: int, now: int | None, spec_type: str | None = None) -> str:
    return (f"--speculative-num-steps {depth} --speculative-num-draft-tokens {depth + 1} (with "
            f"--speculative-eagle-topk 1)" + (f" (now {now})" if now is not None else ""))


def _draft_kind(algorithm: str | None) -> DraftKind:
    algorithm = (algorithm or "").upper()
    if algorithm in ("NGRAM", "LOOKAHEAD"):
        return "n-gram"
    if algorithm in ("EAGLE", "EAGLE3", "NEXTN", "MTP", "DFLASH", "DSPARK"):
        return "model heads"
    return "draft model" if algorithm else "unknown"


ENGINE = EngineKnowledge(
    dialect="sglang", name="SGLang", program="SGLang", options=OPTIONS, is_engine=_is_sglang,
    # "The input (N tokens) is longer than the model's context length (M tokens)."
    refusal_words=re.compile(r"longer than the model's context length", re.IGNORECASE),
    prefix_cache_on="restart SGLang without --disable-radix-cache",
    spec_depth=_spec_depth,
    spec_off="restart SGLang without --speculative-algorithm",
    context_option="--context-length",
    slots_option="--max-running-requests",
    memory_options="--mem-fraction-static, a shorter --context-length",
    draft_kind=_draft_kind,
)
