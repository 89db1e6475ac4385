"""Recording figures: bytes per engine-hour, the recorder's CPU, replay seek time, export speed.

Targets (issue 11): under 5 MB per engine-hour at 1 Hz including GPU and host; under 0.2 % of a core for
the recorder with 4 engines; a seek under 100 ms on a 24-hour recording.

Engine readings are parsed from the real /metrics bodies in tests/data/metrics (llama.cpp, vLLM 0.32 on
CPU), then moved on every second the way a busy engine's counters and histograms move (tokens at tens
per second, a few requests finishing), so each row differs from the last as it does live. GPU reports
come from the fake NVML (an H200), host samples from psutil on this machine.

Run: .venv/bin/python bench/bench_record.py [--cpu-seconds 30] [--hours 24]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psutil  # noqa: E402
from fake_pynvml import FakeNvml, h200  # noqa: E402

from tui.record.export import write_csv, write_openmetrics  # noqa: E402
from tui.record.reader import Recording  # noqa: E402
from tui.record.replay import ReplaySource  # noqa: E402
from tui.record.writer import Recorder  # noqa: E402
from tui.sources.gpu import GpuSampler  # noqa: E402
from tui.sources.host import HostSampler  # noqa: E402
from tui.sources.metrics import parse_reading  # noqa: E402
from tui.sources.samples import EngineReading, EngineSample, GpuReport, HostSample  # noqa: E402
from tui.store import Store  # noqa: E402

DATA = ROOT / "tests" / "data" / "metrics"
BODIES = {"llamacpp": "llamacpp.txt", "vllm": "vllm_cpu_0.32_real.txt"}


def reading_at(base: EngineReading, i: int, rng: random.Random) -> EngineReading:
    """The base reading i seconds later on a busy engine: counters up, gauges wobbling, histograms filling."""
    changes: dict[str, object] = {}
    for f in dataclasses.fields(base):
        v = getattr(base, f.name)
        if v is None:
            continue
        if f.name.endswith("_total"):
            changes[f.name] = v + i * 40.0 + rng.randint(0, 30)
        elif f.name in ("running", "waiting"):
            changes[f.name] = float(rng.randint(0, 4))
        elif f.name == "kv_cache_usage":
            changes[f.name] = rng.random() * 0.5
        elif f.name.endswith("_buckets"):
            add, out = 0.0, []
            for bound, count in v:
                add += rng.randint(0, 2) * i / 8
                out.append((bound, count + round(add)))
            changes[f.name] = tuple(out)
    return dataclasses.replace(base, **changes)


def engine_hour(dialect: str, seconds: int, folder: Path) -> tuple[int, int]:
    base = parse_reading((DATA / BODIES[dialect]).read_text())
    path = folder / f"{dialect}.sqlite"
    rec = Recorder(path, {dialect: "http://127.0.0.1:8000"})
    gpu, host = GpuSampler(FakeNvml([h200()])), HostSampler()
    rng = random.Random(1)
    t0, wall0 = time.monotonic(), time.time()
    gpu_report, host_sample = gpu.sample({}), host.sample({})
    for i in range(seconds):
        t = t0 + i
        rec(EngineSample(dialect, "http://127.0.0.1:8000", t, wall0 + i, "up", model="gemma-3-270m",
                         reading=reading_at(base, i, rng)))
        if i % 60 == 0:  # NVML and psutil are slow to call: a fresh reading every minute, moved every second
            gpu_report, host_sample = gpu.sample({}), host.sample({})
        g = gpu_report.gpus[0]
        rec(dataclasses.replace(gpu_report, t=t, gpus=(dataclasses.replace(
            g, t=t, util_gpu_pct=float(rng.randint(0, 100)), power_w=200 + rng.random() * 400,
            temp_c=float(rng.randint(40, 80)), sm_clock_mhz=float(rng.choice((1980, 1755, 1410)))),)))
        if i % 2 == 0:
            rec(dataclasses.replace(host_sample, t=t, cpu_pct=rng.random() * 100,
                                    ram_used_bytes=(host_sample.ram_used_bytes or 0) + rng.randint(0, 2**20)))
    rec.close()
    gpu.close()
    return path.stat().st_size, rec.rows


def recorder_cpu(seconds: float, folder: Path, engines: int = 4) -> tuple[float, float]:
    """4 engines, a GPU and the host at 1 Hz, in real time: CPU of the writer thread plus the listener
    calls."""
    base = parse_reading((DATA / BODIES["vllm"]).read_text())
    rec = Recorder(folder / "cpu.sqlite", {f"e{k}": "http://127.0.0.1:8000" for k in range(engines)})
    proc = psutil.Process()
    thread_id = rec._thread.native_id
    rng = random.Random(2)
    gpu = GpuReport(t=0.0, gpus=GpuSampler(FakeNvml([h200()])).sample({}).gpus)
    host = HostSample(t=0.0, cpu_pct=1.0, ram_used_bytes=1, ram_total_bytes=2)
    # readings made before the clock starts: what is timed is the recorder, not this benchmark's fakes
    readings = [[reading_at(base, i, rng) for _ in range(engines)] for i in range(int(seconds) + 1)]
    listener = 0.0
    start = time.monotonic()
    for i in range(int(seconds)):
        t = time.monotonic()
        items = [EngineSample(f"e{k}", "http://127.0.0.1:8000", t, time.time(), "up", model="m",
                              reading=readings[i][k]) for k in range(engines)]
        items += [dataclasses.replace(gpu, t=t), dataclasses.replace(host, t=t)]
        c = time.thread_time()
        for item in items:
            rec(item)
        listener += time.thread_time() - c
        time.sleep(max(0.0, start + i + 1 - time.monotonic()))
    writer = next(th for th in proc.threads() if th.id == thread_id)
    writer_cpu = writer.user_time + writer.system_time
    rec.close()
    return (writer_cpu + listener) / seconds * 100, listener / seconds * 100


def day_recording(hours: float, folder: Path) -> Path:
    base = parse_reading((DATA / BODIES["vllm"]).read_text())
    path = folder / "day.sqlite"
    rec = Recorder(path, {"vllm": "http://127.0.0.1:8000"})
    rng = random.Random(3)
    gpu = GpuSampler(FakeNvml([h200()])).sample({})
    t0, wall0 = 10_000.0, time.time() - hours * 3600
    for i in range(int(hours * 3600)):
        rec(EngineSample("vllm", "http://127.0.0.1:8000", t0 + i, wall0 + i, "up", model="m",
                         reading=reading_at(base, i, rng)))
        rec(dataclasses.replace(gpu, t=t0 + i, gpus=(dataclasses.replace(gpu.gpus[0], t=t0 + i),)))
        if i % 2000 == 0:
            while not rec._queue.empty():  # let the writer keep up: the queue is not meant to hold a day
                time.sleep(0.01)
    rec.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for dialect in BODIES:
            size, rows = engine_hour(dialect, 3600, folder)
            print(f"{dialect}: {size / 1e6:.2f} MB per engine-hour at 1 Hz with GPU and host "
                  f"({rows} rows, {size / rows:.0f} B/row; target < 5 MB)")
        cpu, listener = recorder_cpu(args.cpu_seconds, folder)
        print(f"recorder CPU, 4 engines + GPU + host at 1 Hz: {cpu:.3f} % of a core "
              f"(listener on the UI loop {listener:.4f} %; target < 0.2 %)")
        began = time.perf_counter()
        path = day_recording(args.hours, folder)
        print(f"{args.hours:g} h recording: {path.stat().st_size / 1e6:.1f} MB, written in "
              f"{time.perf_counter() - began:.0f} s")
        rec = Recording(path)
        assert rec.start is not None and rec.end is not None
        source = ReplaySource(rec, Store(horizon_s=300))
        rng = random.Random(4)
        times = []
        for _ in range(20):
            began = time.perf_counter()
            source.seek(rng.uniform(rec.start, rec.end))
            for item in source.take():
                source.store.add(item)
            times.append(time.perf_counter() - began)
        print(f"replay seek on {args.hours:g} h (300 s horizon rebuilt): median "
              f"{statistics.median(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms (target < 100 ms)")
        for name, write in (("openmetrics", write_openmetrics), ("csv", write_csv)):
            sink = io.StringIO()
            began = time.perf_counter()
            lines = write(rec, sink)
            took = time.perf_counter() - began
            print(f"export {name}: {rec.count} rows -> {lines} lines in {took:.1f} s "
                  f"({rec.count / took:,.0f} rows/s, {len(sink.getvalue()) / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
