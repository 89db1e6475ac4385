"""Findings from what a server that loads models itself says of them (Ollama's /api/ps, through
tui.sources.native_servers): a model split between the GPU and the CPU, whose layers on the CPU set the pace
of every token; and a model loaded again for a request (Ollama's load_duration on a probe's answer), which a
keep-alive too short, or another model evicting it (OLLAMA_MAX_LOADED_MODELS), makes every user wait for."""

from __future__ import annotations

from collections.abc import Iterable

from tui.model.findings import Finding
from tui.model.samples import RoutedModel

RELOAD_MS = 100.0  # a load shorter than this is a model already in memory (Ollama's own bookkeeping)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def split_model(engine: str, models: Iterable[RoutedModel]) -> Finding | None:
    """A loaded model with part of its memory on the GPU and part in the host's RAM: its CPU layers run at
    the CPU's pace. A model wholly on the CPU is not said here (a machine without a GPU has no choice)."""
    for m in models:
        if m.status != "loaded" or m.size_bytes is None or m.vram_bytes is None:
            continue
        if 0 < m.vram_bytes < m.size_bytes:
            cpu = m.size_bytes - m.vram_bytes
            share = round(cpu / m.size_bytes * 100)
            return Finding(
                "model-split-cpu-gpu", engine, "warning",
                f"{m.id} runs {share}% on the CPU: {_gib(cpu)} of its {_gib(m.size_bytes)} did not fit on "
                "the GPU, and those layers set the pace of every token",
                "a smaller num_ctx or OLLAMA_KV_CACHE_TYPE=q8_0 (its KV cache is part of the size), a "
                "smaller quantization, or fewer models loaded at once (OLLAMA_MAX_LOADED_MODELS)",
                (f"/api/ps: size {m.size_bytes:,} B, size_vram {m.vram_bytes:,} B "
                 f"(`ollama ps` says {share}%/{100 - share}% CPU/GPU)",),
                (("model", m.id), ("size_bytes", m.size_bytes), ("vram_bytes", m.vram_bytes),
                 ("cpu_share", share / 100)))
    return None


def reloaded(engine: str, loads_ms: Iterable[tuple[str, float]]) -> Finding | None:
    """Probes whose answer says the model was loaded for them (Ollama's load_duration): (the probe's
    workload, its load time in ms), the newest last. Said when a load came after the first probe: the model
    had been unloaded since."""
    loads = list(loads_ms)
    later = [(w, ms) for w, ms in loads[1:] if ms >= RELOAD_MS]
    if not later:
        return None
    worst = max(ms for _, ms in later)
    return Finding(
        "model-reloaded", engine, "warning",
        f"the model was loaded again for {len(later)} of the last {len(loads) - 1} probes (up to "
        f"{worst / 1000:.1f} s each): it had been unloaded between requests",
        "keep it loaded longer (OLLAMA_KEEP_ALIVE, or a request's keep_alive), or load fewer models at once "
        "(OLLAMA_MAX_LOADED_MODELS) so another one does not evict it",
        tuple(f"probe {w}: load_duration {ms:,.0f} ms (Ollama's own answer)" for w, ms in later[-3:]),
        (("reloads", len(later)), ("load_ms_max", worst)))
