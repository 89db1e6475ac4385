"""Builds the Hugging Face model folders that the bundled vLLM serves, with no downloads.

* tiny: a deterministic random-weight Llama (hidden 128, 2 layers) with a byte-level BPE tokenizer
  trained on this interpreter's standard library sources. Seconds to build, ~2 MB, hundreds of tok/s on
  CPU: the model for tests, where only the engine's behaviour matters, not the text.
* gemma: Gemma 3 270M dequantised from the same .gguf the llama.cpp demo serves, so both engines can be
  compared on one model. The GGUF carries no chat template, so Gemma's is added.

Run with the vLLM venv's python (it has torch, transformers, tokenizers, gguf); enginetop's own venv has
none of them, so those imports stay inside the build functions. Each build writes into a temporary
folder renamed into place at the end: a folder that exists is complete.

    <vllm-venv>/bin/python -m tui.engines.models tiny
    <vllm-venv>/bin/python -m tui.engines.models gemma --gguf /path/to/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from tui.base.paths import cache_dir

TINY_NAME = "enginetop-tiny-llama"
GEMMA_NAME = "gemma-3-270m-hf"
SEED = 1234

TINY_VOCAB = 2048
TINY_SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
# ChatML-style; generation stops at <|im_end|>, which is also the model's eos token.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 3's own template (text only): a system message is folded into the first user turn, the assistant
# role is called "model", and every turn ends with <end_of_turn>.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] | trim }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def models_dir() -> Path:
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tiny_dir() -> Path:
    return models_dir() / TINY_NAME


def gemma_dir() -> Path:
    return models_dir() / GEMMA_NAME


def _publish(tmp: Path, target: Path) -> Path:
    """Rename the finished folder into place, so a half-built model is never mistaken for a whole one."""
    # mkdtemp (and safetensors) make things private; the cache is shared by every clone and tool.
    tmp.chmod(0o755)
    for path in tmp.iterdir():
        path.chmod(0o644)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _stdlib_corpus(max_bytes: int = 8 * 1024 * 1024) -> list[str]:
    """Local text to train the tokenizer on: the standard library's .py files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not texts:
        raise RuntimeError(f"no Python sources found under {root} to train the tokenizer on")
    return texts


def build_tiny(target: Path | None = None) -> Path:
    target = target or tiny_dir()
    if (target / "config.json").is_file():
        print(f">> tiny model: {target} already built")
        return target
    print(f">> tiny model: training a byte-level BPE tokenizer and writing a random Llama to {target}")
    import random

    import numpy as np
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=2048,
    )
    fast.chat_template = TINY_CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    # Initialised in float32 (seeded), stored in bfloat16: the dtype vLLM's CPU backend computes in anyway.
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.eval()
    gen = GenerationConfig(
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id
    )

    return _save(target, model, gen, fast)


def build_gemma(gguf: Path, target: Path | None = None) -> Path:
    target = target or gemma_dir()
    if (target / "config.json").is_file():
        print(f">> gemma model: {target} already built")
        return target
    if not gguf.is_file():
        raise FileNotFoundError(f"the Gemma .gguf is missing: {gguf}")
    print(f">> gemma model: dequantising {gguf.name} into {target} (first time only, ~1 min, ~550 MB)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    # Gemma degenerates without <bos>; the GGUF tokenizer does not add it, so plain completions would lack it.
    # (The chat template writes it itself and vLLM does not add a second one there.)
    tokenizer.add_bos_token = True
    # dequantize=True: transformers would otherwise keep the GGUF blocks packed, which it cannot save.
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    # A chat turn ends with <end_of_turn>; without it in eos the model would talk on to max_tokens.
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    eos_ids = [i for i in (tokenizer.eos_token_id, end_of_turn) if isinstance(i, int) and i >= 0]
    gen = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id
    )

    return _save(target, model, gen, tokenizer)


def _save(target: Path, model: Any, gen: Any, tokenizer: Any) -> Path:
    """The model, its generation settings and its tokenizer written beside `target`, then moved into place
    whole (_publish): a build stopped half-way leaves no folder that looks finished."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        gen.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _publish(tmp, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the model folders the bundled vLLM serves.")
    sub = parser.add_subparsers(dest="which", required=True)
    sub.add_parser("tiny", help="deterministic random-weight Llama for tests")
    gemma = sub.add_parser("gemma", help="Gemma 3 270M dequantised from the llama.cpp demo .gguf")
    gemma.add_argument("--gguf", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        path = build_tiny() if args.which == "tiny" else build_gemma(args.gguf)
    except ImportError as exc:
        python = cache_dir() / "vllm-venv" / "bin" / "python"
        print(f"enginetop: {exc}: run this with the vLLM venv's python ({python})", file=sys.stderr)
        return 1
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"enginetop: {exc}", file=sys.stderr)
        return 1
    print(f"   {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
