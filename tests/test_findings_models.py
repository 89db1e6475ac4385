"""Findings from the models a server loads itself (tui.findings.models): Ollama's own figures."""

from __future__ import annotations

from tui.findings.models import reloaded, split_model
from tui.model.samples import RoutedModel

GiB = 2**30


def test_a_model_split_between_gpu_and_cpu() -> None:
    split = RoutedModel("qwen3:32b", "loaded", size_bytes=25 * GiB, vram_bytes=13 * GiB)
    f = split_model("ollama", [RoutedModel("a", "unloaded", size_bytes=GiB), split])
    assert f is not None and f.id == "model-split-cpu-gpu" and f.severity == "warning"
    assert f.title.startswith("qwen3:32b runs 48% on the CPU: 12.0 GiB of its 25.0 GiB did not fit")
    assert "48%/52% CPU/GPU" in f.evidence[0]
    # wholly on the GPU, wholly on the CPU (no GPU: no choice), or not said: nothing
    for vram in (25 * GiB, 0, None):
        one = RoutedModel("m", "loaded", size_bytes=25 * GiB, vram_bytes=vram)
        assert split_model("ollama", [one]) is None


def test_a_model_loaded_again_between_probes() -> None:
    assert reloaded("ollama", [("chat", 2100.0), ("chat", 3.0), ("chat", 2.5)]) is None  # the first load only
    f = reloaded("ollama", [("chat", 2100.0), ("chat", 3.0), ("long", 1800.0)])
    assert f is not None and f.id == "model-reloaded"
    assert f.title.startswith("the model was loaded again for 1 of the last 2 probes (up to 1.8 s each)")
    assert "OLLAMA_KEEP_ALIVE" in f.suggestion
