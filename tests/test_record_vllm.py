"""Record the real vLLM (CPU), replay the file, and compare every figure at the same instants, TTFT and ITL
quantiles from the histogram buckets included."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_record_llama import INTERVAL, compare_every_instant, record_under_load

from tui.model.targets import EngineTarget
from tui.record.schema import SUFFIX

pytestmark = pytest.mark.engine


def test_vllm_replay_equals_live_at_every_sample(vllm_server, tmp_path: Path) -> None:
    path = tmp_path / f"vllm{SUFFIX}"
    seconds = 14.0
    live = record_under_load([EngineTarget("vllm", vllm_server.url)], vllm_server.url, path, seconds)
    stats = [v[1] for _, v in live.engine_views]
    assert len(stats) >= seconds / INTERVAL * 0.6
    assert any(s.ttft_p50_s for s in stats) and any(s.itl_p50_s for s in stats), "no latency measured"
    assert sum(1 for s in stats if s.gen_tps) >= 5
    assert compare_every_instant(path, live, "vllm") == len(live.engine_views) + len(live.gpu_views)
    # each request's life as vLLM timed it, in the live column's figures and in the recording's report
    assert any(s.requests is not None and s.requests.ended for s in stats)
    from tui.record.reader import Recording
    from tui.record.report import render_recording

    html = render_recording(Recording(path))
    section = html[html.index("Requests, as the engines timed them"):]
    assert "<td>vllm</td>" in section[:4000] and "length" in section[:4000]
    row = section.split("<td>vllm</td>", 1)[1].split("</tr>", 1)[0]
    cells = [c.rsplit("<td", 1)[1].split(">", 1)[1] for c in row.split("</td>")[:-1]]
    # finish counts since start, then (last) tokens per step and the busy share, as vLLM's counters gave them
    assert "length" in cells[3] and float(cells[-3]) > 0 and cells[-2].endswith("%")
