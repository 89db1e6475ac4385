"""The recording file on its own: round trip, schema refusal, damage, disk full, retention, secrets.

Samples here are made by hand (every field filled): what is tested is the file. Recording real engines and
replaying them is tests/test_record_llama.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import zstandard

from tui.live.store import Store
from tui.model.events import Event, ProbeEvent
from tui.model.samples import (
    EngineReading,
    EngineSample,
    GpuProcess,
    GpuReport,
    GpuSample,
    HostSample,
    ProcessTreeMemory,
)
from tui.probe.results import ProbeResult
from tui.probe.timings import ServerTimings
from tui.record.codec import scrub
from tui.record.reader import Recording
from tui.record.replay import ReplaySource, parse_goto
from tui.record.retention import Retention, prune
from tui.record.schema import DDL, SCHEMA_VERSION, SUFFIX, RecordingError
from tui.record.writer import Recorder

INF = float("inf")


def engine_sample(i: int, t0: float, name: str = "vllm") -> EngineSample:
    return EngineSample(
        name=name, url="http://127.0.0.1:8000", t=t0 + i, wall=1.7e9 + i, health="up", model="gemma",
        reading=EngineReading(
            dialect="vllm", running=float(i % 3), waiting=0.0, kv_cache_usage=0.25,
            prompt_tokens_processed_total=100.0 * i, prompt_tokens_computed_total=80.0 * i,
            generation_tokens_total=37.0 * i, prefix_cache_queries_total=100.0 * i,
            prefix_cache_hits_total=20.0 * i, requests_finished_total=float(i),
            ttft_buckets=((0.01, 0.0), (0.1, float(i)), (1.0, 2.0 * i), (INF, 2.0 * i)),
            itl_buckets=((0.01, 5.0 * i), (0.1, 30.0 * i), (INF, 36.0 * i))))


def gpu_report(i: int, t0: float) -> GpuReport:
    return GpuReport(t=t0 + i, driver_version="570", gpus=(GpuSample(
        index=0, t=t0 + i, name="NVIDIA H200", uuid="GPU-1", util_gpu_pct=50.0 + i % 50, power_w=300.5,
        temp_c=61.0, vram_used_bytes=10**10, vram_total_bytes=141_000_000_000,
        clock_event_mask=0x4 if i % 10 == 0 else 0, throttle_reasons=("power cap",) if i % 10 == 0 else (),
        throttled=i % 10 == 0, processes=(GpuProcess(pid=42, used_bytes=9_500_000_000, engine="vllm"),)),))


def host_sample(i: int, t0: float) -> HostSample:
    return HostSample(t=t0 + i, cpu_pct=12.5, cpu_count=16, ram_used_bytes=2**33, ram_total_bytes=2**36,
                      engines=(ProcessTreeMemory(engine="vllm", pid=42, rss_bytes=2**30, processes=3,
                                                 pids=(42, 43, 44)),))


def probe(i: int, t0: float) -> ProbeEvent:
    sent = t0 + i - 0.5
    return ProbeEvent("vllm", t0 + i, ProbeResult(
        engine="vllm", url="http://127.0.0.1:8000", workload="short", index=0, wall_start=1.7e9 + i,
        sent_at=sent, connect_s=0.001, first_token_at=sent + 0.05, last_token_at=sent + 0.4,
        ended_at=sent + 0.41, status=200, finish_reason="length", prompt_tokens=20, completion_tokens=32,
        cached_tokens=0, chunks=32, server=ServerTimings(source="vllm", ttft_ms=40.0, mean_itl_ms=11.0),
        notes=("a note",), text="the reply is not recorded"))


def write(path: Path, n: int = 400, **kw) -> tuple[list[object], Recorder]:
    t0 = 1000.0
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"}, **kw)
    items: list[object] = []
    for i in range(n):
        for item in (engine_sample(i, t0), gpu_report(i, t0), *((host_sample(i, t0),) if i % 2 else ())):
            rec(item)
            items.append(item)
        if i % 50 == 7:
            rec(probe(i, t0))
            items.append(probe(i, t0))
    rec.event("switch", "vllm", {"to": "other", "status": "ok"}, t=t0 + n)
    rec.close()
    return items, rec


def test_round_trip_gives_back_every_sample_equal(tmp_path: Path) -> None:
    items, rec = write(tmp_path / f"a{SUFFIX}")
    assert rec.error is None and rec.rows == len(items) + 1
    recording = Recording(tmp_path / f"a{SUFFIX}")
    rows = list(recording.rows())
    got = [r.item for r in rows if not isinstance(r.item, Event)]
    want = [i if not isinstance(i, ProbeEvent) else ProbeEvent(i.engine, i.t, _no_text(i.result))
            for i in items]
    assert sorted(got, key=_key) == sorted(want, key=_key)
    assert [r.t for r in rows] == sorted(r.t for r in rows)
    event = rows[-1].item
    assert isinstance(event, Event) and event.kind == "switch"
    assert event.data == {"to": "other", "status": "ok"}
    # a dictionary was trained, and rows after it use it
    assert recording.db.execute("SELECT count(*) FROM dicts").fetchone()[0] == 1
    assert recording.db.execute("SELECT count(*) FROM rows WHERE dict IS NOT NULL").fetchone()[0] > 0
    assert recording.meta["closed_wall"] and recording.meta["schema_version"] == str(SCHEMA_VERSION)
    # closed: the WAL was folded back, one file
    assert not Path(f"{tmp_path / 'a'}{SUFFIX}-wal").exists()


def _no_text(r: ProbeResult) -> ProbeResult:
    import dataclasses

    return dataclasses.replace(r, text="")


def _key(item: object) -> tuple:
    return (getattr(item, "t", 0.0), type(item).__name__)


def test_any_sqlite_client_reads_it(tmp_path: Path) -> None:
    write(tmp_path / f"a{SUFFIX}", n=50)
    out = subprocess.run(["python3", "-c", (
        "import sqlite3,sys; db=sqlite3.connect(sys.argv[1]); "
        "print(db.execute(\"select value from meta where key='schema_version'\").fetchone()[0]); "
        "print(db.execute(\"select count(*), count(distinct kind) from rows\").fetchone())"),
        str(tmp_path / f"a{SUFFIX}")], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [str(SCHEMA_VERSION), "(127, 5)"]


def test_rows_are_standard_json_and_infinities_come_back(tmp_path: Path) -> None:
    """Schema 2 writes +Inf as Prometheus does ("+Inf"), so any JSON parser reads a row; it reads back inf."""
    path = tmp_path / f"a{SUFFIX}"
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    rec(engine_sample(3, 1000.0))
    rec.event("alert", "vllm", {"title": "slow", "ratio": INF, "nested": [float("-inf")]}, t=1004.0)
    rec.close()
    with sqlite3.connect(path) as db:
        blobs = [zstandard.ZstdDecompressor().decompress(d) for (d,) in db.execute("SELECT data FROM rows")]

    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    texts = [json.loads(b, parse_constant=refuse) for b in blobs]
    assert texts[0]["reading"]["ttft_buckets"][-1] == ["+Inf", 6.0]
    rows = list(Recording(path).rows())
    assert rows[0].item == engine_sample(3, 1000.0)
    assert rows[0].item.reading.ttft_buckets[-1] == (INF, 6.0)
    assert rows[1].item.data == {"title": "slow", "ratio": "+Inf", "nested": ["-Inf"]}


def test_a_schema_1_file_still_reads(tmp_path: Path) -> None:
    """Schema 1 rows are Python's json.dumps, with a bare `Infinity`: files recorded before still open."""
    path = tmp_path / f"a{SUFFIX}"
    items = [engine_sample(i, 1000.0) for i in range(5)] + [gpu_report(1, 1000.0)]
    with sqlite3.connect(path) as db:
        db.executescript(DDL)
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("mono_to_wall", "0")])
        for item in items:
            raw = json.dumps(_v1_fields(item), separators=(",", ":")).encode()
            assert b"Infinity" in raw or isinstance(item, GpuReport)
            db.execute("INSERT INTO rows (t, wall, kind, source, dict, data) VALUES (?, ?, ?, ?, NULL, ?)",
                       (item.t, item.t, "engine" if isinstance(item, EngineSample) else "gpu",
                        getattr(item, "name", None), zstandard.ZstdCompressor().compress(raw)))
    recording = Recording(path)
    assert recording.version == 1 and recording.damage is None
    assert sorted((r.item for r in recording.rows()), key=_key) == sorted(items, key=_key)


def _v1_fields(obj: object) -> object:
    """A sample's fields as schema 1 wrote them: every field, numbers as Python floats (inf included)."""
    import dataclasses

    if dataclasses.is_dataclass(obj):
        return {f.name: _v1_fields(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_v1_fields(v) for v in obj]
    return obj


def test_newer_schema_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    write(path, n=10)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(RecordingError, match=r"newer than this enginetop reads .*upgrade enginetop"):
        Recording(path)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(RecordingError, match="not an enginetop recording"):
        Recording(other)


def test_truncated_file_shows_everything_before_the_damage(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    write(path, n=1500)
    whole = Recording(path)
    all_rows = list(whole.rows())
    whole.close()
    cut = tmp_path / f"cut{SUFFIX}"
    data = path.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.6)])
    rec = Recording(cut)
    rows = list(rec.rows())
    assert rec.damage is not None and "damaged" in rec.damage and "before the damage" in rec.damage
    assert 0.3 * len(all_rows) < len(rows) < len(all_rows)
    assert [r.item for r in rows] == [r.item for r in all_rows[: len(rows)]]  # the prefix, intact


def test_corrupt_bytes_in_the_middle_are_reported_and_what_precedes_is_shown(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    write(path, n=1500)
    whole = Recording(path)
    all_rows = list(whole.rows())
    whole.close()
    data = bytearray(path.read_bytes())
    page = 4096
    middle = (len(data) // page // 2) * page
    data[middle: middle + 3 * page] = os.urandom(3 * page)
    bad = tmp_path / f"bad{SUFFIX}"
    bad.write_bytes(bytes(data))
    rec = Recording(bad)
    rows = list(rec.rows())
    assert rec.damage is not None, "random bytes over three pages went unnoticed"
    assert len(rows) < len(all_rows)
    assert [r.item for r in rows[:50]] == [r.item for r in all_rows[:50]]


def test_disk_full_stops_recording_with_a_message_and_nothing_raises(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    try:
        rec = Recorder(mnt / f"a{SUFFIX}")
        t0 = 1000.0
        for i in range(20000):
            rec(engine_sample(i, t0))
            if i % 2000 == 0:
                time.sleep(1.2)  # a commit between
            if rec.error:
                break
        deadline = time.monotonic() + 10
        while rec.error is None and time.monotonic() < deadline:
            rec(engine_sample(0, t0))
            time.sleep(0.1)
        assert rec.error is not None and "disk full" in rec.error
        rec(engine_sample(1, t0))  # the listener stays harmless after the failure
        rec.close()
        readable = Recording(mnt / f"a{SUFFIX}")
        assert readable.count > 0
        readable.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_secrets_never_reach_the_file(tmp_path: Path) -> None:
    key = "sk-very-secret-key-123"
    path = tmp_path / f"a{SUFFIX}"
    rec = Recorder(path, engines={"e": "http://admin:hunter2@10.0.0.1:8000"}, secrets=(key, "hunter2"))
    rec(EngineSample("e", "http://10.0.0.1:8000", 1.0, 1.7e9, "down",
                     health_reason=f"GET http://admin:hunter2@10.0.0.1:8000/health failed; key {key}"))
    rec.event("alert", "e", {"message": f"Bearer {key}"})
    rec.close()
    raw = path.read_bytes()
    rows = list(Recording(path).rows())
    text = raw.decode("latin-1") + repr([r.item for r in rows]) + repr(Recording(path).meta)
    assert "hunter2" not in text and key not in text
    assert "http://10.0.0.1:8000/health" in rows[0].item.health_reason
    assert scrub("https://u:p@h/x and ftp://x@y") == "https://h/x and ftp://y"


def test_the_fleet_views_engine_keys_never_reach_its_recording(tmp_path: Path) -> None:
    """The dashboard's recorder over a fleet (--prometheus): no engine targets, keys given by name."""
    import argparse

    from tui.cli.record import open_recorder

    key = "sk-fleet-engine-key-77"
    path = tmp_path / f"a{SUFFIX}"
    rec = open_recorder(path, [], argparse.Namespace(), print, {"fleet": "1"}, secrets=(key,))
    result = ProbeResult(engine="gpu-node-3:8000", url="http://10.0.0.3:8000", workload="short", index=0,
                         wall_start=1.7e9, sent_at=4.0, error=f"401 for key {key}")
    rec(ProbeEvent("gpu-node-3:8000", 5.0, result))
    rec.close()
    rows = list(Recording(path).rows())
    assert rows[0].item.result.error == "401 for key ***"
    assert key not in path.read_bytes().decode("latin-1") and Recording(path).engines == {}


def test_retention_deletes_oldest_first_and_spares_the_current_file(tmp_path: Path) -> None:
    now = time.time()
    files = []
    for i in range(5):
        f = tmp_path / f"r{i}{SUFFIX}"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (now - (5 - i) * 86400, now - (5 - i) * 86400))
        files.append(f)
    (tmp_path / "other.txt").write_bytes(b"x" * 10_000)
    deleted = prune(tmp_path, keep_days=4.5, keep_bytes=2500, spare=files[0], now=now)
    # r0 is spared though the oldest (it is being written) and counts towards the total: 5000 bytes, so r1,
    # r2 and r3 go, oldest first, until 2000 are left
    assert sorted(p.name for p in deleted) == [f"r1{SUFFIX}", f"r2{SUFFIX}", f"r3{SUFFIX}"]
    assert files[0].exists() and files[4].exists()
    assert (tmp_path / "other.txt").exists()
    assert prune(tmp_path, keep_days=1.5, keep_bytes=10**9, now=now) == [files[0]]
    assert files[4].exists()


def test_retention_runs_again_while_recording_never_on_the_file_being_written(tmp_path: Path) -> None:
    """The recorder prunes its folder every `every_s` (an hour by default; here a fraction of a second),
    from its writer thread: files made while it records are deleted by a later pass, the file it writes
    never, however far over the size limit it is."""
    def old_file(name: str, days: float) -> Path:
        f = tmp_path / f"{name}{SUFFIX}"
        f.write_bytes(b"x" * 1000)
        Path(f"{f}-wal").write_bytes(b"w" * 100)
        os.utime(f, (time.time() - days * 86400, time.time() - days * 86400))
        return f

    week_old, fresh = old_file("week-old", 8), old_file("fresh", 0.5)
    (tmp_path / "notes.txt").write_bytes(b"not a recording")
    current = tmp_path / f"current{SUFFIX}"
    deleted: list[Path] = []
    recorder = Recorder(current, retention=Retention(tmp_path, keep_days=7, keep_bytes=10**9, every_s=0.3),
                        on_delete=deleted.append)
    try:
        for i in range(3):
            recorder(engine_sample(i, 1000.0))
        deadline = time.monotonic() + 10
        while week_old.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not week_old.exists() and not Path(f"{week_old}-wal").exists()
        assert fresh.exists() and current.exists() and (tmp_path / "notes.txt").exists()
        assert deleted == [week_old]
        # a later pass: a file that grew old meanwhile, and a size limit the current file alone exceeds
        os.utime(fresh, (time.time() - 9 * 86400, time.time() - 9 * 86400))
        recorder.retention = Retention(tmp_path, keep_days=7, keep_bytes=1, every_s=0.3)
        later = old_file("later", 0.1)
        deadline = time.monotonic() + 10
        while (fresh.exists() or later.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not fresh.exists() and not later.exists()
        assert deleted == [week_old, fresh, later]
        recorder(engine_sample(3, 1000.0))
    finally:
        recorder.close()
    assert current.exists() and recorder.error is None
    assert [r.item.t for r in Recording(current).rows()] == [1000.0, 1001.0, 1002.0, 1003.0]


def test_replay_source_steps_seeks_and_goes_to_times(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    write(path, n=1200)
    rec = Recording(path)
    store = Store(horizon_s=300)
    replay = ReplaySource(rec, store)
    replay.seek(1000.0 + 700.5)
    for item in replay.take():
        store.add(item)
    assert store.engines["vllm"].sample.t == 1700.0
    assert store.engines["vllm"].probes  # the last probes, however old
    replay.step(True)
    for item in replay.take():
        store.add(item)
    assert store.engines["vllm"].sample.t == 1701.0 and replay.paused
    replay.step(False)
    for item in replay.take():
        store.add(item)
    assert store.engines["vllm"].sample.t == 1700.0
    assert parse_goto("-5m", rec) == rec.end - 300
    assert abs(parse_goto(rec.clock(1000.0 + 100)[-8:], rec) - 1100.0) < 1.0
    with pytest.raises(ValueError, match="time of day"):
        parse_goto("soon", rec)
    assert replay.faster(True) == 2 and replay.faster(True) == 5 and replay.faster(False) == 2


def test_a_zstd_frame_without_its_dictionary_is_damage_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    write(path, n=500)
    with sqlite3.connect(path) as db:
        bad = zstandard.ZstdCompressor().compress(b"{oops")
        db.execute("UPDATE rows SET data = ? WHERE id = 700", (bad,))
    rec = Recording(path)
    rows = list(rec.rows())
    assert rec.damage and len(rows) == 699


def test_report_marks_throttling_switches_crashes_and_lists_probes_verdicts_sweeps(tmp_path: Path) -> None:
    from tui.record.report import render_recording

    path = tmp_path / f"a{SUFFIX}"
    t0 = 1000.0
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    for i in range(120):
        rec(engine_sample(i, t0))
        rec(gpu_report(i, t0))
    rec(probe(30, t0))
    rec.event("switch-result", "vllm", {"to": "vllm-fp8", "ok": False, "failed_step": "wait-ready",
                                        "message": "not ready"}, t=t0 + 40)
    rec.event("engine-state", "vllm", {"state": "crashed", "message": "exited with -9"}, t=t0 + 50)
    rec.event("ab", None, {"summary": "A/B done", "verdicts": [
        {"pair": "b / a", "verdict": "b faster", "decode_ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3}]},
        t=t0 + 60)
    rec.event("sweep-level", "vllm", {"level": 4, "ok": 8, "requests": 8, "aggregate_tps": 321.5,
                                      "ttft_s_p50": 0.05}, t=t0 + 70)
    rec.event("alert", None, {"title": "t", "message": "power cap reached", "severity": "warning"}, t=t0 + 80)
    rec.close()
    html = render_recording(Recording(path))
    assert html.count("<polyline") == 2 and "<script" not in html
    assert html.count("GPU throttled") >= 12  # a shaded span each 10 s, with its times
    assert "switch to vllm-fp8: wait-ready failed" in html and "crashed: exited with -9" in html
    assert 'stroke-dasharray="4 3"' in html  # switch and crash marked on the time axis
    assert "1 probe request(s)" in html and "b faster" in html and "1.200" in html
    assert "321.5" in html and "power cap reached" in html


def test_replay_shows_a_recorded_crash_from_its_instant_on(tmp_path: Path) -> None:
    path = tmp_path / f"a{SUFFIX}"
    t0 = 1000.0
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    for i in range(100):
        rec(engine_sample(i, t0))
    rec.event("engine-state", "vllm", {"state": "ready", "message": "up"}, t=t0 + 10)
    rec.event("engine-state", "vllm", {"state": "crashed", "message": "exited with -9", "exit_code": -9,
                                       "log_tail": ["Killed"]}, t=t0 + 50)
    rec.close()
    replay = ReplaySource(Recording(path), Store())
    replay.seek(t0 + 5)
    assert replay.engine_status("vllm") is None
    replay.seek(t0 + 49)
    assert replay.engine_status("vllm").state == "ready"
    replay.seek(t0 + 80)
    status = replay.engine_status("vllm")
    assert status.state == "crashed" and status.exit_code == -9 and status.log_tail == ("Killed",)


def test_replay_finds_a_crash_however_many_events_came_after_it(tmp_path: Path) -> None:
    """The crash is the engine's last state even with hundreds of other events of that engine after it
    (a replay once looked only at the last 50 events)."""
    path = tmp_path / f"a{SUFFIX}"
    t0 = 1000.0
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    rec(engine_sample(0, t0))
    rec.event("engine-state", "vllm", {"state": "crashed", "message": "exited with -9", "exit_code": -9},
              t=t0 + 1)
    for i in range(300):
        rec.event("alert", "vllm", {"title": "t", "message": f"alert {i}", "severity": "warning"},
                  t=t0 + 2 + i * 0.01)
    rec.close()
    replay = ReplaySource(Recording(path), Store())
    replay.seek(t0 + 10)
    status = replay.engine_status("vllm")
    assert status is not None and status.state == "crashed" and status.exit_code == -9


def test_a_failed_start_is_a_state_the_report_marks(tmp_path: Path) -> None:
    """"failed" (a start or switch that failed, nothing running) is one of the lifecycle's states, and the
    recording's report marks it on the time axis like a crash."""
    from typing import get_args

    from tui.model.status import RunState
    from tui.record.report import render_recording

    assert "failed" in get_args(RunState) and "exited" not in get_args(RunState)
    path = tmp_path / f"a{SUFFIX}"
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    for i in range(20):
        rec(engine_sample(i, 1000.0))
    rec.event("engine-state", "vllm", {"state": "failed", "message": "port 8000 is held by nginx"}, t=1010.0)
    rec.close()
    html = render_recording(Recording(path))
    assert "failed: port 8000 is held by nginx" in html


def test_report_requests_table_has_tokens_per_step_busy_share_and_finish_counts_since_start(
        tmp_path: Path) -> None:
    """The per-request figures the column shows are in the report's table too: finish counts since the engine
    started beside the window's, tokens per engine step, the busy share and the rate while serving."""
    import dataclasses

    from tui.record.report import render_recording

    path = tmp_path / f"r{SUFFIX}"
    t0 = 1000.0
    rec = Recorder(path, engines={"vllm": "http://127.0.0.1:8000"})
    for i in range(11):  # 10 s; a request running at every other poll after the first
        sample = engine_sample(i, t0)
        assert sample.reading is not None
        rec(dataclasses.replace(sample, reading=dataclasses.replace(
            sample.reading, running=float(i % 2), generation_tokens_total=40.0 * i,
            finish_reasons=(("length", 100.0 + i), ("stop", 500.0 + 2 * i)),
            iteration_tokens_sum=300.0 * i, iteration_steps_total=40.0 * i)))
    rec.close()
    html = render_recording(Recording(path))
    section = html.split("Requests, as the engines timed them", 1)[1].split("</table>", 1)[0]
    for head in ("since start", "tokens/step", "busy", "gen tok/s while serving"):
        assert f"<th>{head}</th>" in section or f'">{head}</th>' in section, head
    cells = [c.rsplit("<td", 1)[1].split(">", 1)[1] for c in section.split("</td>")[:-1]]
    assert cells[0] == "vllm" and cells[3] == "length 10 stop 20" and cells[4] == "length 110 stop 520"
    # 3000 tokens over 400 steps; busy at 5 of 10 polls; 400 tokens over the 5 s it served
    assert cells[-3:] == ["7.5", "50%", "80.0"]
