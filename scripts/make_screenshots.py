"""Refresh screenshots/ from real engines (run after `make engine vllm chromium`). Tests never write here.

    .venv/bin/python scripts/make_screenshots.py [--only NAME]    (llama, both, report, recording, fleet,
                                                                  traffic, router, findings)

- dashboard-llama.svg: the dashboard watching a real llama-server (Gemma 3 270M) under load, probes on.
- demo-llama-vllm.svg: the README demo, llama.cpp and vLLM on the same Gemma 3 270M side by side; and the
  same screen at 80x24 and 200x55 as text (demo-llama-vllm-80x24.txt, demo-llama-vllm-200x55.txt).
- sweep-llama-vllm.svg: the concurrency sweep (key c) on both.
- fleet-table.svg / fleet-engine.svg: the fleet view (--prometheus) over a real Prometheus scraping the real
  demo llama-server and a labelled SYNTHETIC fleet (200 engines, 52 dcgm GPUs; scripts/demo_fleet.py), then
  the real llama-server opened from the table (enter) in the dashboard's layout, its plots back-filled from
  query_range, probed once with f.
- report.png: the offline HTML report of a real `enginetop ab` of the two CPU demo profiles (2 x 2), in
  headless Chromium with the network off, rendered as tests/test_report.py renders it.
- recording-report.png: `enginetop report` of a 2-minute recording of a real llama-server under load with
  probes every 10 s; the GPU is the tests' fake H200, scripted to hit its power cap now and then (this
  machine has no GPU), so throttled spans show.
- router-slots.svg / router-switch.svg: the demo router profiles (llama-server in router mode, the demo Gemma
  as gemma-a and gemma-b): the model rows and gemma-a's slot table during a probe, then the switch to gemma-b
  (key 2) with its timed steps.
- traffic-llama.svg: the dashboard running the traffic proxy (--proxy-listen) in front of the real
  llama-server, with an agent-like load sent through the proxy: the column's "traffic" rows.
- findings-llama.svg: two real llama-servers and what enginetop reads of their configuration: one started
  with -c 4096 --parallel 4 behind the proxy, sent a prompt longer than one slot (refused: the slots-split
  finding); one drafting at depth 4 with a synthetic acceptance of 0.9, 0.6, 0.3, 0.1 (the spec-depth
  finding, acceptance per draft position).
The GPU panel shows what this machine has (no NVIDIA driver here: one line saying so).
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui.base.process import free_port  # noqa: E402
from tui.lifecycle.profile_files import load_profiles, repo_profiles_dir  # noqa: E402
from tui.probe.sweep import SweepConfig  # noqa: E402
from tui.ui.app import EnginetopApp  # noqa: E402
from tui.ui.config import AppConfig  # noqa: E402

OUT = ROOT / "screenshots"


def profiles_on_free_ports(tmp: Path, *names: str):
    for name in names:
        text = (repo_profiles_dir() / f"{name}.toml").read_text()
        (tmp / f"{name}.toml").write_text(re.sub(r"(?m)^port = \d+", f"port = {free_port()}", text))
    return [load_profiles([tmp]).get(n) for n in names]


async def load(url: str, seconds: float, streams: int = 2) -> None:
    """Steady chat traffic so the live plots have something to show."""
    async def one(client: httpx.AsyncClient, i: int) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await client.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"Tell me a story about lighthouse {i}."}],
                "max_tokens": 48, "ignore_eos": True}, headers={"Connection": "close"})

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(one(client, i) for i in range(streams)), return_exceptions=True)


async def wait(pilot, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        await pilot.pause(0.5)


CHAR_W = 12.2  # rich's SVG export: a cell is 20 px high and 0.61 of that wide; each <text> sits at col × this


def screen_lines(svg: str) -> list[str]:
    """What the screen shows, line by line, each piece of text at its own column (from Textual's SVG)."""
    rows: dict[float, dict[int, str]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(float(m.group(2)), {})[round(float(m.group(1)) / CHAR_W)] = html.unescape(m.group(3))
    out = []
    for _, pieces in sorted(rows.items()):
        line: list[str] = []
        for col, text in sorted(pieces.items()):
            line += [" "] * (col - len(line))
            line[col:col + len(text)] = list(text.replace("\xa0", " "))
        out.append("".join(line).rstrip())
    return out


async def shoot(names: tuple[str, ...], stem: str, sweep_stem: str | None,
                text_sizes: tuple[tuple[int, int], ...] = ()) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        profiles = profiles_on_free_ports(Path(tmp), *names)
        app = EnginetopApp(AppConfig(
            profiles=profiles, switchable=profiles, probe_every_managed_s=5.0, probe_max_tokens=48,
            sweep=SweepConfig(levels=(1, 2, 4), requests_per_stream=2, duration_s=None),
            horizon_s=120.0, screenshot_dir=OUT))
        try:
            async with app.run_test(size=(210, 62)) as pilot:
                await wait(pilot, lambda: all(s.status and s.status.state == "ready" for s in app.slots), 300)
                await asyncio.gather(*(load(p.url, 45) for p in profiles), pilot.pause(46))
                await pilot.pause(3)
                app.save_screenshot(filename=f"{stem}.svg", path=str(OUT))
                print(f"wrote {OUT / stem}.svg")
                for w, h in text_sizes:  # the same dashboard at a laptop's and a wall screen's size, as text
                    await pilot.resize_terminal(w, h)
                    await pilot.pause(4)
                    capture = OUT / f"{stem}-{w}x{h}.txt"
                    svg = app.export_screenshot()
                    (OUT / f"{stem}-{w}x{h}.svg").write_text(svg)
                    capture.write_text("\n".join(screen_lines(svg)) + "\n")
                    print(f"wrote {capture}")
                if text_sizes:
                    await pilot.resize_terminal(210, 62)
                    await pilot.pause(2)
                if sweep_stem:
                    await pilot.press("c")
                    await wait(pilot, lambda: all(v == "done" for v in app.screen.status.values()), 600)
                    await pilot.pause(1)
                    app.save_screenshot(filename=f"{sweep_stem}.svg", path=str(OUT))
                    print(f"wrote {OUT / sweep_stem}.svg")
        finally:
            app.stop_managed()


async def agent_load(url: str, seconds: float, agents: int = 3) -> None:
    """Agents streaming through the proxy: each conversation grows by its reply and a new question."""
    async def agent(client: httpx.AsyncClient, i: int) -> None:
        messages = [{"role": "system", "content": f"You are helper {i}. Answer in one sentence."}]
        end = time.monotonic() + seconds
        turn = 0
        while time.monotonic() < end:
            turn += 1
            messages.append({"role": "user", "content": f"Question {turn}: what is lighthouse {i} for?"})
            reply = []
            async with client.stream("POST", f"{url}/v1/chat/completions", json={
                    "messages": messages, "max_tokens": 32, "stream": True}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:]).get("choices") or ():
                            reply.append((choice.get("delta") or {}).get("content") or "")
            messages.append({"role": "assistant", "content": "".join(reply)})

    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(agent(client, i) for i in range(agents)), return_exceptions=True)


async def shoot_traffic() -> None:
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions

    with tempfile.TemporaryDirectory() as tmp:
        (profile,) = profiles_on_free_ports(Path(tmp), "demo-cpu-threads2")
        proxy = ProxyOptions({profile.name: Listen("127.0.0.1", free_port())}, key_file=Path(tmp) / "key")
        app = EnginetopApp(AppConfig(profiles=[profile], switchable=[profile], probe_every_managed_s=10.0,
                                     probe_max_tokens=32, horizon_s=120.0, screenshot_dir=OUT, proxy=proxy))
        try:
            async with app.run_test(size=(170, 62)) as pilot:
                await wait(pilot, lambda: all(s.status and s.status.state == "ready" for s in app.slots), 300)
                via = f"http://{proxy.listens[profile.name].display}"
                await asyncio.gather(agent_load(via, 40), pilot.pause(41))
                await pilot.pause(2)
                app.save_screenshot(filename="traffic-llama.svg", path=str(OUT))
                print(f"wrote {OUT / 'traffic-llama.svg'}")
        finally:
            app.stop_managed()


FINDINGS_PROFILES = {
    "split-slots": ["--parallel", "4"],
    "spec-depth-4": ["--model-draft", "${ENGINETOP_DEMO_MODEL}", "--spec-type", "draft-simple",
                     "--spec-draft-n-max", "4", "--spec-draft-p-min", "0",
                     "--spec-synth-rates", "0.9,0.6,0.3,0.1"],
}


async def shoot_findings() -> None:
    from tui.net.listen import Listen
    from tui.proxy.options import ProxyOptions

    base = (repo_profiles_dir() / "demo-cpu-threads2.toml").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in FINDINGS_PROFILES.items():
            text = re.sub(r'(?m)^name = .*$', f'name = "{name}"', base)
            text = re.sub(r"(?m)^port = \d+", f"port = {free_port()}", text)
            added = ", ".join(f'"{a}"' for a in extra)
            text = text.replace('"--threads", "2",', f'"--threads", "2", {added},')
            (Path(tmp) / f"{name}.toml").write_text(text)
        profiles = [load_profiles([Path(tmp)]).get(n) for n in FINDINGS_PROFILES]
        proxy = ProxyOptions({"split-slots": Listen("127.0.0.1", free_port())}, key_file=Path(tmp) / "key")
        app = EnginetopApp(AppConfig(profiles=profiles, switchable=profiles, probe_every_managed_s=15.0,
                                     probe_max_tokens=32, horizon_s=120.0, screenshot_dir=OUT, proxy=proxy))
        try:
            async with app.run_test(size=(200, 62)) as pilot:
                await wait(pilot, lambda: all(s.status and s.status.state == "ready" for s in app.slots), 300)
                via = f"http://{proxy.listens['split-slots'].display}"
                spec = app.slots[1].target.url
                async with httpx.AsyncClient(timeout=120) as client:
                    long = " ".join(["apple banana cherry"] * 500)
                    for _ in range(2):  # longer than one slot's 1,024 tokens: refused
                        await client.post(f"{via}/v1/chat/completions", json={
                            "messages": [{"role": "user", "content": long}], "max_tokens": 8})
                    await asyncio.gather(agent_load(via, 30, agents=1), *(client.post(
                        f"{spec}/v1/chat/completions", json={
                            "messages": [{"role": "user", "content": f"Tell me story {i}."}],
                            "max_tokens": 96, "ignore_eos": True}) for i in range(3)))
                engines = app.store.engines
                await wait(pilot, lambda: all(engines[s.target.name].findings for s in app.slots), 60)
                await pilot.pause(3)
                app.save_screenshot(filename="findings-llama.svg", path=str(OUT))
                print(f"wrote {OUT / 'findings-llama.svg'}")
        finally:
            app.stop_managed()


def shoot_report() -> None:
    from tests.test_report import render_in_chromium  # the tests' renderer: network off, blank-page check

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        html = tmp / "report.html"
        run = subprocess.run(
            [sys.executable, "-m", "tui", "ab", "demo-cpu-threads1", "demo-cpu-threads2", "--instances", "2",
             "--blocks", "2", "--requests", "2", "--max-tokens", "24", "--warmup", "1",
             "--bandwidth", "20GB/s", "-o", str(tmp / "ab.json"), "--report", str(html)],
            cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
        if run.returncode != 0:
            raise SystemExit(f"enginetop ab failed with exit code {run.returncode} (its messages are above)")
        render_in_chromium(html, tmp / "report.png", tmp)
        OUT.mkdir(exist_ok=True)
        shutil.copyfile(tmp / "report.png", OUT / "report.png")
    print(f"wrote {OUT / 'report.png'}")


def shoot_recording_report(seconds: float = 120.0) -> None:
    import threading

    from tests.conftest import start_llama
    from tests.fake_pynvml import FakeNvml, h200
    from tests.test_report import render_in_chromium
    from tui.base.process import stop_group
    from tui.live.store import Store
    from tui.model.targets import EngineTarget
    from tui.probe.runner import ProbeRunner
    from tui.probe.workloads import WorkloadParams
    from tui.record.reader import Recording
    from tui.record.report import write_recording_report
    from tui.record.writer import Recorder
    from tui.run.record import record
    from tui.run.sources import RunOptions
    from tui.sources.gpu import GpuSampler

    engine = start_llama("screenshot", "--parallel", "4", "--threads", "2")
    nvml, stop = FakeNvml([h200()]), threading.Event()

    def throttle() -> None:
        while not stop.wait(25.0):
            nvml.set_clock_event_mask(0, 0x4)
            stop.wait(8.0)
            nvml.set_clock_event_mask(0, 0x0)

    async def run(recorder: Recorder) -> None:
        target, store, runner = EngineTarget("llama", engine.url), Store(), ProbeRunner()

        async def probes() -> None:
            while True:
                await asyncio.sleep(10)
                await runner.probe(target, "short", WorkloadParams(max_tokens=32),
                                   on_result=lambda r: store.add_probe("llama", r))

        tasks = [asyncio.create_task(probes()), asyncio.create_task(load(engine.url, seconds))]
        try:
            await record(RunOptions(watched=[target]), recorder, gpu_sampler=lambda: GpuSampler(nvml),
                         store=store, duration_s=seconds, say=lambda line: None)
        finally:
            for task in tasks:
                task.cancel()
            await runner.aclose()

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        recorder = Recorder(tmp / "run.enginetop.sqlite", {"llama": engine.url})
        threading.Thread(target=throttle, daemon=True).start()
        try:
            asyncio.run(run(recorder))
        finally:
            stop.set()
            recorder.close()
            stop_group(engine.launched)
        html = write_recording_report(Recording(recorder.path), tmp / "report.html")
        render_in_chromium(html, tmp / "report.png", tmp)
        OUT.mkdir(exist_ok=True)
        shutil.copyfile(tmp / "report.png", OUT / "recording-report.png")
    print(f"wrote {OUT / 'recording-report.png'}")


async def shoot_fleet() -> None:
    from scripts.demo_fleet import demo_fleet
    from tui.fleet.options import FleetOptions
    from tui.ui.screens.fleet import EngineScreen, FleetView

    with demo_fleet(200) as (url, instance):
        await asyncio.sleep(40)  # some history for the back-fill, some requests on the real engine
        app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=url, refresh_s=2.0), horizon_s=1800.0,
                                     screenshot_dir=OUT))
        async with app.run_test(size=(210, 62)) as pilot:
            view = app.screen.query_one(FleetView)
            await wait(pilot, lambda: view.table.row_count >= 201, 60)
            await pilot.pause(3)
            app.save_screenshot(filename="fleet-table.svg", path=str(OUT))
            print(f"wrote {OUT / 'fleet-table.svg'}")
            await pilot.press(*instance)
            await pilot.pause(1)
            await pilot.press("enter")
            await wait(pilot, lambda: isinstance(app.screen, EngineScreen) and not app.screen.backfill, 30)
            await pilot.press("f")  # a real probe of the real engine, in its panel and on its plots
            state = app.store.engines[instance]
            await wait(pilot, lambda: len(state.probes) >= 1, 60)
            await pilot.pause(3)
            app.save_screenshot(filename="fleet-engine.svg", path=str(OUT))
            print(f"wrote {OUT / 'fleet-engine.svg'}")


async def shoot_router() -> None:
    """The demo router (two models, one llama-server in router mode) under a long probe, then the switch."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        for name in ("demo-router-gemma-a", "demo-router-gemma-b"):
            text = (repo_profiles_dir() / f"{name}.toml").read_text()
            (Path(tmp) / f"{name}.toml").write_text(re.sub(r"(?m)^port = \d+", f"port = {port}", text))
        loaded = load_profiles([Path(tmp)])
        a, b = loaded.get("demo-router-gemma-a"), loaded.get("demo-router-gemma-b")
        app = EnginetopApp(AppConfig(profiles=[a], switchable=[a, b], probe_max_tokens=300, horizon_s=120.0,
                                     poll_interval_s=0.5, screenshot_dir=OUT))
        try:
            async with app.run_test(size=(170, 62)) as pilot:
                await wait(pilot, lambda: all(s.status and s.status.state == "ready" for s in app.slots), 300)
                state = app.store.engines[a.name]

                def decoding() -> bool:
                    models = state.sample.models if state.sample else None
                    return any(m.slots and any(s.processing for s in m.slots.slots) for m in models or ())

                await pilot.press("f")
                await wait(pilot, decoding, 30)
                await pilot.pause(2)
                app.save_screenshot(filename="router-slots.svg", path=str(OUT))
                print(f"wrote {OUT / 'router-slots.svg'}")
                await wait(pilot, lambda: bool(app.store.engines[a.name].probes), 60)
                await pilot.press("2")  # demo-router-gemma-b, the second switchable profile
                await pilot.pause(0.5)
                await pilot.press("y")
                await wait(pilot, lambda: getattr(app.screen, "done", None) is not None, 120)
                await pilot.pause(0.5)
                app.save_screenshot(filename="router-switch.svg", path=str(OUT))
                print(f"wrote {OUT / 'router-switch.svg'}")
        finally:
            app.stop_managed()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["llama", "both", "report", "recording", "fleet", "traffic",
                                           "router", "findings"])
    args = parser.parse_args()
    if args.only in (None, "llama"):
        asyncio.run(shoot(("demo-cpu-threads2",), "dashboard-llama", None))
    if args.only in (None, "both"):
        asyncio.run(shoot(("demo-cpu-threads2", "demo-vllm-gemma"), "demo-llama-vllm", "sweep-llama-vllm",
                          text_sizes=((80, 24), (200, 55))))
    if args.only in (None, "report"):
        shoot_report()
    if args.only in (None, "recording"):
        shoot_recording_report()
    if args.only in (None, "fleet"):
        asyncio.run(shoot_fleet())
    if args.only in (None, "traffic"):
        asyncio.run(shoot_traffic())
    if args.only in (None, "router"):
        asyncio.run(shoot_router())
    if args.only in (None, "findings"):
        asyncio.run(shoot_findings())


if __name__ == "__main__":
    main()
