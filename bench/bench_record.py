"""Recording figures: bytes per engine-hour, the recorder's CPU, replay seek time, export speed.

Targets (issue 11): under 5 MB per engine-hour at 1 Hz including GPU and host; under 0.2 % of a core for
the recorder with 4 engines; a seek under 100 ms on a 24-hour recording.

Engine readings are parsed from the real /metrics bodies in tests/data/metrics (llama.cpp, vLLM 0.32 on
CPU), then moved on every second the way a busy engine's counters and histograms move (tokens at tens
per second, a few requests finishing), so each row differs from the last as it does live. GPU reports
come from the fake NVML (an H200), host samples from psutil on this machine.

Run: .venv/bin/python bench/bench_record.py [--cpu-seconds 120] [--hours 24] [--day-file F] [--only seek]
     .venv/bin/python bench/bench_record.py --live llamacpp --live vllm [--live-minutes 5]   (real engines)
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
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psutil  # noqa: E402
from fake_pynvml import FakeNvml, h200  # noqa: E402

from tui.live.store import Store  # noqa: E402
from tui.model.samples import EngineReading, EngineSample, GpuReport, HostSample  # noqa: E402
from tui.record.export import write_csv, write_openmetrics  # noqa: E402
from tui.record.reader import Recording  # noqa: E402
from tui.record.replay import ReplaySource  # noqa: E402
from tui.record.writer import Recorder  # noqa: E402
from tui.sources.gpu import GpuSampler  # noqa: E402
from tui.sources.host import HostSampler  # noqa: E402
from tui.sources.metrics import parse_reading  # noqa: E402

DATA = ROOT / "tests" / "data" / "metrics"
BODIES = {"llamacpp": "llamacpp.txt", "vllm": "vllm_cpu_0.32_real.txt"}
DAY_ENGINES = ("llamacpp0", "llamacpp1", "vllm0", "vllm1")


def busy(base: EngineReading, rng: random.Random) -> Iterator[EngineReading]:
    """The base reading second after second on a busy engine: counters up by tens of tokens, gauges
    wobbling, a few requests landing in the histograms. Nothing cumulative ever goes down: the store reads
    that as an engine restart and starts its windows again, which a replay would then skip deriving."""
    current = base
    while True:
        yield current
        changes: dict[str, object] = {}
        for f in dataclasses.fields(current):
            v = getattr(current, f.name)
            if v is None:
                continue
            if f.name.endswith("_total"):
                changes[f.name] = v + 40.0 + rng.randint(0, 30)
            elif f.name in ("running", "waiting"):
                changes[f.name] = float(rng.randint(0, 4))
            elif f.name == "kv_cache_usage":
                changes[f.name] = rng.random() * 0.5
            elif f.name.endswith("_buckets"):
                add, out = 0.0, []
                for bound, count in v:
                    add += rng.randint(0, 1)
                    out.append((bound, count + add))
                changes[f.name] = tuple(out)
        current = dataclasses.replace(current, **changes)


def engine_hour(dialect: str, seconds: int, folder: Path) -> tuple[int, int]:
    base = parse_reading((DATA / BODIES[dialect]).read_text())
    path = folder / f"{dialect}.sqlite"
    rec = Recorder(path, {dialect: "http://127.0.0.1:8000"})
    gpu, host = GpuSampler(FakeNvml([h200()])), HostSampler()
    rng = random.Random(1)
    readings = busy(base, rng)
    t0, wall0 = time.monotonic(), time.time()
    gpu_report, host_sample = gpu.sample({}), host.sample({})
    for i in range(seconds):
        t = t0 + i
        rec(EngineSample(dialect, "http://127.0.0.1:8000", t, wall0 + i, "up", model="gemma-3-270m",
                         reading=next(readings)))
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


def live_engine_hour(kind: str, minutes: float, folder: Path) -> tuple[int, int, float, float | None]:
    """A real engine (llama-server, or vLLM on CPU) recorded the way `enginetop record` records it, at 1 Hz
    with GPU reports (the fake NVML's H200: no GPU here) and host samples, under a light steady load: a
    32-token request every 2 s, and a dashboard probe every 10 s. Returns the file's bytes once closed,
    its rows, the seconds recorded, and the bytes an hour costs once the dictionary is trained."""
    import asyncio
    import contextlib

    import httpx
    from conftest import start_engine, start_llama

    from tui.base.process import stop_group
    from tui.live.store import Store
    from tui.model.targets import EngineTarget
    from tui.probe.runner import ProbeRunner
    from tui.probe.workloads import WorkloadParams
    from tui.run.record import record
    from tui.run.sources import RunOptions

    if kind == "llamacpp":
        engine = start_llama("bench-record", "--parallel", "4", "--threads", "2")
        launched, url = engine.launched, engine.url
    else:
        from tui.engines.install_vllm import tiny_model_dir, vllm_argv, vllm_env

        engine = start_engine("bench-record-vllm", "vLLM",
                              lambda port: vllm_argv(tiny_model_dir(), port, "--enforce-eager"),
                              env=vllm_env(), timeout=300)
        launched, url = engine.launched, engine.url
    path = folder / f"live-{kind}.sqlite"
    target = EngineTarget(kind, url)
    recorder = Recorder(path, {kind: url})
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.wait(2.0):
                # a keep-alive connection the server closed raises: the next request opens a new one
                with contextlib.suppress(httpx.HTTPError):
                    client.post(f"{url}/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 32})

    async def main() -> None:
        store = Store()
        runner = ProbeRunner()

        async def probes() -> None:
            while True:
                await asyncio.sleep(10.0)
                await runner.probe(target, "short", WorkloadParams(max_tokens=32),
                                   on_result=lambda r: store.add_probe(kind, r))

        task = asyncio.create_task(probes())
        try:
            await record(RunOptions(watched=[target]), recorder,
                         gpu_sampler=lambda: GpuSampler(FakeNvml([h200()])),
                         say=lambda line: None, store=store, duration_s=minutes * 60)
        finally:
            task.cancel()
            await runner.aclose()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        recorder.close()
        stop_group(launched)
    rec = Recording(path)
    assert rec.start is not None and rec.end is not None
    size = path.stat().st_size
    # The first rows are plain zstd frames, until a dictionary is trained on them (writer.TRAIN_AT): the
    # rate after it is what an hour costs. Estimated from the rows' own bytes, scaled by the file's
    # overhead over them (pages, index).
    (data_all,) = rec.db.execute("SELECT sum(length(data)) FROM rows").fetchone()
    data_after, t0, t1 = rec.db.execute(
        "SELECT sum(length(data)), min(t), max(t) FROM rows WHERE dict IS NOT NULL").fetchone()
    steady = None if not data_after or t1 <= t0 else data_after * size / data_all / (t1 - t0) * 3600
    rec.close()
    return size, recorder.rows, rec.end - rec.start, steady


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
    moving = [busy(base, rng) for _ in range(engines)]
    readings = [[next(m) for m in moving] for _ in range(int(seconds) + 1)]
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


def day_recording(hours: float, path: Path) -> Path:
    """A day of 4 engines as the dashboard records them: 2 llama.cpp and 2 vLLM readings a second, a GPU
    report a second and a host sample every 2 s (AppConfig's intervals)."""
    rng = random.Random(3)
    moving = {name: busy(parse_reading((DATA / BODIES[name.rstrip("01")]).read_text()), rng)
              for name in DAY_ENGINES}
    rec = Recorder(path, {name: "http://127.0.0.1:8000" for name in DAY_ENGINES})
    gpu = GpuSampler(FakeNvml([h200()])).sample({})
    host = HostSampler().sample({})
    t0, wall0 = 10_000.0, time.time() - hours * 3600
    for i in range(int(hours * 3600)):
        t = t0 + i
        for name, readings in moving.items():
            rec(EngineSample(name, "http://127.0.0.1:8000", t, wall0 + i, "up", model="m",
                             reading=next(readings)))
        rec(dataclasses.replace(gpu, t=t, gpus=(dataclasses.replace(
            gpu.gpus[0], t=t, util_gpu_pct=float(rng.randint(0, 100)), power_w=200 + rng.random() * 400,
            throttled=i % 600 < 30),)))  # a power cap for 30 s every 10 min: throttle spans to rebuild
        if i % 2 == 0:
            rec(dataclasses.replace(host, t=t, cpu_pct=rng.random() * 100))
        if i % 500 == 0:
            while not rec._queue.empty():  # let the writer keep up: the queue is not meant to hold a day
                time.sleep(0.01)
    rec.close()
    return path


def seek_times(path: Path, seeks: int, horizon_s: float) -> list[float]:
    """What ReplayApp._moved does on `g`, less the drawing: move the cursor, rebuild the store from the
    file, and look up each column's launcher state (redraw asks the file for it)."""
    rec = Recording(path)
    assert rec.start is not None and rec.end is not None
    source = ReplaySource(rec, Store(horizon_s=horizon_s))
    rng = random.Random(4)
    times = []
    for _ in range(seeks):
        began = time.perf_counter()
        source.seek(rng.uniform(rec.start, rec.end))
        for item in source.take():
            source.store.add(item)
        for name in source.store.engines:
            source.engine_status(name)
        times.append(time.perf_counter() - began)
    rec.close()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 120 s: past the zstd dictionary training at 300 rows (about 50 s in), which a 30 s run never reached
    parser.add_argument("--cpu-seconds", type=float, default=120.0)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--seeks", type=int, default=30)
    parser.add_argument("--day-file", type=Path, default=None,
                        help="keep the day recording here and reuse it when it exists (it takes minutes)")
    parser.add_argument("--only", choices=["size", "cpu", "seek", "export"], action="append",
                        help="run only these parts (repeatable; default all)")
    parser.add_argument("--live", choices=["llamacpp", "vllm"], action="append",
                        help="also record this real engine for --live-minutes (repeatable)")
    parser.add_argument("--live-minutes", type=float, default=5.0)
    args = parser.parse_args(argv)
    parts = set(args.only or (["size", "cpu", "seek", "export"] if not args.live else []))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if "size" in parts:
            for dialect in BODIES:
                size, rows = engine_hour(dialect, 3600, folder)
                print(f"{dialect}: {size / 1e6:.2f} MB per engine-hour at 1 Hz with GPU and host "
                      f"({rows} rows, {size / rows:.0f} B/row; target < 5 MB)")
        for kind in args.live or []:
            size, rows, seconds, steady = live_engine_hour(kind, args.live_minutes, folder)
            after = "no dictionary trained yet" if steady is None else \
                f"{steady / 1e6:.2f} MB once the dictionary is trained"
            print(f"live {kind}: {size / seconds * 3600 / 1e6:.2f} MB per engine-hour at 1 Hz with GPU and "
                  f"host, extrapolated from {seconds / 60:.1f} min of the real engine under light load "
                  f"({rows} rows, {size / rows:.0f} B/row, the rows before the dictionary included); "
                  f"{after} (target < 5 MB)")
        if "cpu" in parts:
            cpu, listener = recorder_cpu(args.cpu_seconds, folder)
            print(f"recorder CPU, 4 engines + GPU + host at 1 Hz: {cpu:.3f} % of a core "
                  f"(listener on the UI loop {listener:.4f} %; target < 0.2 %)")
        if not parts & {"seek", "export"}:
            return 0
        path = args.day_file or folder / "day.sqlite"
        if not path.exists():
            began = time.perf_counter()
            day_recording(args.hours, path)
            print(f"{args.hours:g} h recording of {len(DAY_ENGINES)} engines: "
                  f"{path.stat().st_size / 1e6:.1f} MB, written in {time.perf_counter() - began:.0f} s")
        rec = Recording(path)
        assert rec.start is not None and rec.end is not None
        hours = (rec.end - rec.start) / 3600
        if "seek" in parts:
            times = sorted(seek_times(path, args.seeks, 300.0))
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            print(f"replay seek on {hours:.1f} h, {len(rec.engines)} engines (300 s horizon rebuilt), "
                  f"{len(times)} random seeks: median {statistics.median(times) * 1e3:.1f} ms, "
                  f"p95 {p95 * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms (target < 100 ms)")
        if "export" in parts:
            for name, write in (("openmetrics", write_openmetrics), ("csv", write_csv)):
                sink = io.StringIO()
                began = time.perf_counter()
                lines = write(rec, sink)
                took = time.perf_counter() - began
                print(f"export {name}: {rec.count} rows -> {lines} lines in {took:.1f} s "
                      f"({rec.count / took:,.0f} rows/s, {len(sink.getvalue()) / 1e6:.0f} MB)")
        rec.close()
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
