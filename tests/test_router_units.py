"""A router's load progress from its event stream (GET /models/sse, as the real llama-server router wrote it
here while loading the demo model: tests/data/router/models_sse.txt), and a routed model's row as drawn:
its status, how far its load is and for how long it has loaded, its requests in flight, last used."""

from __future__ import annotations

from pathlib import Path

from tui.live.store import Store
from tui.model.samples import EngineSample, RoutedModel
from tui.sources.router import LoadProgress
from widgets.engine_panel import render_engine

STREAM = (Path(__file__).parent / "data" / "router" / "models_sse.txt").read_bytes()


def test_load_progress_follows_the_stream_in_pieces_of_any_size():
    for size in (1, 7, 64, 300):
        progress = LoadProgress()
        seen = []
        for i in range(0, len(STREAM), size):
            assert progress.feed(STREAM[i:i + size]) is False  # a stream is never "enough"
            seen.append(dict(progress.of))
        assert {"gemma-a": 0.0} in seen and {"gemma-a": 1.0} in seen  # 0.0, then 1.0 (one stage)
        assert progress.of == {}  # loaded, then unloaded: no progress left


def test_a_loading_model_shows_its_progress_and_time_and_a_swap_model_its_requests():
    store = Store()
    loading = RoutedModel("gemma-b", "loading", progress=0.4)
    store.add(EngineSample("r", "http://x", 1.0, 100.0, "up", model="router: 2 models, 0 loaded",
                           models=(RoutedModel("gemma-a", "unloaded"), loading)))
    store.add(EngineSample("r", "http://x", 4.0, 103.0, "up", model="router: 2 models, 0 loaded",
                           models=(RoutedModel("gemma-a", "unloaded"), loading)))
    text = render_engine(store.engines["r"]).plain
    assert "router" in text and "gemma-b" in text and "loading 40% for 3 s" in text
    store.add(EngineSample("s", "http://y", 1.0, 100.0, "up", model="llama-swap: 1 model, 1 ready",
                           models=(RoutedModel("m", "ready", in_flight=2, oldest_ms=3100),)))
    text = render_engine(store.engines["s"]).plain
    assert "llama-swap" in text and "ready  2 in flight, oldest 3.1 s" in text
    assert "not used while watched" in text
