"""The fleet's pure parts: engine names, Prometheus' special values, dcgm's blanks, the command line's
refusals. (Everything that talks to Prometheus is tested against a real one: test_fleet_synthetic.py.)"""

from __future__ import annotations

import subprocess
import sys

from waiting import until_async

from tui.fleet.dcgm import is_blank
from tui.fleet.prometheus import _duration_s, value
from tui.fleet.source import engine_names, host_of


def test_names_are_the_instance_unless_two_jobs_share_it_or_it_serves_several_engines() -> None:
    keys = [("vllm", "node-1:8000", "llama-70b", "0"), ("vllm", "node-1:8000", "llama-70b", "1"),
            ("sglang", "node-2:30000", "qwen", ""), ("a", "node-3:80", "", ""), ("b", "node-3:80", "", ""),
            ("vllm", "node-4:8000", "m1", "0"), ("vllm", "node-4:8000", "m2", "0")]
    names = engine_names(keys)
    assert names[keys[0]] == "node-1:8000 dp0" and names[keys[1]] == "node-1:8000 dp1"
    assert names[keys[2]] == "node-2:30000"
    assert (names[keys[3]], names[keys[4]]) == ("a/node-3:80", "b/node-3:80")
    assert (names[keys[5]], names[keys[6]]) == ("node-4:8000 m1", "node-4:8000 m2")
    assert len(set(names.values())) == len(keys)
    assert host_of("node-7:9400") == "node-7" and host_of("[::1]:8000") == "::1" and host_of("node") == "node"


def test_nan_and_infinities_read_as_not_available() -> None:
    assert [value(v) for v in ("NaN", "+Inf", "-Inf", "1.5", "0", None, "x")] == \
        [None, None, None, 1.5, 0.0, None, None]
    assert [_duration_s(t) for t in ("15s", "1m", "1m30s", "500ms", "", "x")] == [15, 60, 90, 0.5, None, None]


def test_dcgm_blank_sentinels_read_as_not_available() -> None:
    assert is_blank(9223372036854775794.0) and is_blank(float(2**63 - 16)) and is_blank(140737488355328.0)
    assert not is_blank(700.0) and not is_blank(141000.0 * 1024)  # a large framebuffer in MiB is a value


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui", *args], capture_output=True, text=True, timeout=60)


def test_the_command_line_refuses_what_cannot_work() -> None:
    lone = run("--match", '{job="x"}')
    assert lone.returncode == 2 and "need --prometheus" in lone.stderr
    mixed = run("--prometheus", "http://127.0.0.1:9", "--engine", "a=http://127.0.0.1:8080")
    assert mixed.returncode == 2 and "fleet table" in mixed.stderr
    missing = run("--prometheus", "http://127.0.0.1:9", "--prometheus-key-file", "/nonexistent/key")
    assert missing.returncode == 2 and "/nonexistent/key does not exist" in missing.stderr
    keyless = run("--prometheus", "http://127.0.0.1:9", "--api-key-file", "*=/nonexistent/engine-key")
    assert keyless.returncode == 2 and "/nonexistent/engine-key does not exist" in keyless.stderr
    snap = run("snapshot", "--json", "--no-discover")  # (without it: the engines running on this machine)
    assert snap.returncode == 2 and "--prometheus URL" in snap.stderr


def test_in_app_alerts_need_their_condition_to_hold_for_the_stated_time() -> None:
    from tui.fleet.alerts import QUEUE_GROWING, STALLED, THROTTLED_DROP, AlertTracker
    from tui.model.samples import EngineReading, EngineStats

    tracker = AlertTracker()

    def at(t: float, running=1.0, waiting=0.0, gen=50.0, throttled=False) -> tuple[str, ...]:
        return tracker.update("e", t, "up", EngineReading("vllm", running=running, waiting=waiting),
                              EngineStats(gen_tps=gen), throttled)

    assert at(0, gen=0) == () and at(59, gen=0) == ()
    assert STALLED in at(60, gen=0)
    assert at(61) == ()  # a token came: no longer stalled
    tracker = AlertTracker()
    grow = [at(100 + 10 * i, waiting=5 + i) for i in range(31)]  # 5 minutes of a queue that keeps growing
    assert QUEUE_GROWING not in grow[20] and QUEUE_GROWING in grow[30]
    assert at(420, waiting=0) == ()  # the queue emptied
    tracker = AlertTracker()
    for i in range(10):
        assert at(i * 5, gen=100.0, throttled=True) == ()  # throttled, but as fast as ever
    assert THROTTLED_DROP in at(55, gen=40.0, throttled=True)
    assert at(60, gen=40.0, throttled=False) == ()  # slower, but no throttled GPU under it


def test_gpus_of_an_engine_by_pod_where_both_name_one_else_by_host() -> None:
    from tui.fleet.dcgm import build_report
    from tui.fleet.match import gpus_of
    from tui.model.samples import EngineSample

    def gpu(host: str, index: int, **k8s: str) -> tuple[str, dict[str, str], float]:
        labels = {"Hostname": host, "gpu": str(index), "UUID": f"{host}-{index}", **k8s}
        return "DCGM_FI_DEV_GPU_UTIL", labels, 1.0

    report = build_report([
        gpu("node-1", 0, namespace="llm", pod="a"),
        # scraped without honor_labels: `pod` is dcgm-exporter's own, the GPU's pod is in exported_pod
        gpu("node-1", 1, namespace="gpu-operator", pod="dcgm-x", exported_namespace="llm", exported_pod="b"),
        gpu("node-1", 2),
        gpu("node-2", 0)])

    def engine(instance: str, **k8s: str) -> EngineSample:
        return EngineSample(name=instance, url="", t=0.0, wall=0.0, health="up", instance=instance,
                            host=instance.split(":")[0], labels=tuple(k8s.items()))

    def where(e: EngineSample) -> list[tuple[str | None, int]]:
        return [(g.host, g.index) for g in gpus_of(e, report.gpus)]

    assert where(engine("10.0.0.7:8000", namespace="llm", pod="a")) == [("node-1", 0)]
    assert where(engine("node-1:8000", namespace="llm", pod="b")) == [("node-1", 1)]
    # a pod no GPU names (dcgm-exporter without pod mapping): its host's GPUs; another namespace's "a" too
    assert where(engine("node-2:8000", namespace="llm", pod="c")) == [("node-2", 0)]
    assert where(engine("node-2:8000", namespace="other", pod="a")) == [("node-2", 0)]
    assert where(engine("node-1:8000")) == [("node-1", 0), ("node-1", 1), ("node-1", 2)]
    assert where(engine("10.0.0.7:8000")) == []


async def test_an_engine_screen_drawn_before_it_is_composed_waits_for_the_next_redraw() -> None:
    """A redraw or a finished back-fill can reach a just-pushed engine screen before its widgets exist (seen
    in CI: NoMatches for GpuPanel ended the app); it must draw nothing then, and draw at the next call."""
    import time

    from tui.base.process import free_port
    from tui.fleet.options import FleetOptions
    from tui.model.samples import EngineSample, GpuReport
    from tui.ui.app import EnginetopApp
    from tui.ui.config import AppConfig
    from tui.ui.screens.fleet import EngineScreen
    from widgets.gpu_panel import GpuPanel

    dead = f"http://127.0.0.1:{free_port()}"  # no Prometheus: the table says so, the app runs on
    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=dead), horizon_s=300.0))
    async with app.run_test(size=(160, 50)) as pilot:
        now = time.monotonic()
        app.store.add(EngineSample(name="node-1:8000", url="http://node-1:8000", t=now, wall=time.time(),
                                   health="up", host="node-1"))
        app.store.add(GpuReport(t=now, unavailable="no dcgm-exporter series"))
        screen = EngineScreen("node-1:8000", 300.0)
        app.push_screen(screen)
        screen.show(app.store, now)  # before compose: nothing to draw into, and no error
        await until_async(lambda: screen.is_mounted and screen.query(GpuPanel), "the screen composed",
                          timeout=10, pause=pilot.pause)
        screen.show(app.store, time.monotonic())
        assert screen.query_one(GpuPanel).border_title == "GPUs of node-1"
        assert app.is_running


async def test_a_redraw_after_the_screens_are_gone_draws_nothing() -> None:
    """The redraw timer can fire once more while the app quits, after its screens are popped (seen in CI:
    ScreenStackError from the fleet's redraw ended a test): it must draw nothing then."""
    from tui.base.process import free_port
    from tui.fleet.options import FleetOptions
    from tui.ui.app import EnginetopApp
    from tui.ui.config import AppConfig

    app = EnginetopApp(AppConfig(fleet=FleetOptions(prometheus=f"http://127.0.0.1:{free_port()}")))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
    assert not app._screen_stack
    app.redraw(force=True)


def test_fleet_engine_keys_by_name_else_the_star() -> None:
    from tui.fleet.options import FleetOptions

    options = FleetOptions(prometheus="http://p:9090", engine_keys={"a:8000": "key-a", "*": "key-all"})
    assert options.key_for("a:8000") == "key-a" and options.key_for("b:8000") == "key-all"
    assert FleetOptions(engine_keys={"a:8000": "key-a"}).key_for("b:8000") is None
    assert "key-a" not in repr(options)


async def test_the_fleet_table_draws_each_row_on_one_line_of_fixed_width_cells() -> None:
    """The table's lines as Textual gets them (its line API): cells padded or cut with an ellipsis to their
    column's width, a newline inside a cell (an error text) kept on the row's line, the cursor's row
    reversed, nothing below the last row."""
    from rich.text import Text
    from textual.app import App

    from widgets.fleet_table import COLUMNS, WHY, WIDTHS, FleetTable, Row

    def row(name: str, why: str) -> Row:
        cells = [Text("down", style="bold red"), name, "vllm", "Qwen3-8B", "node-1", "12.3", "1.2k", "34 ms",
                 "120 ms", "8 ms", "2", "0", "45%", "40%", "97%", "700", "0.35", "71", "8 node", "",
                 Text(why, style="red")]
        return Row(name, ("down", name, *[None] * 19), tuple(cells), name)

    class Bare(App):
        def compose(self):
            yield FleetTable()

    width = 247  # wide enough for the last column to show 40 cells
    long_name = "engine-with-a-name-longer-than-its-column"
    async with Bare().run_test(size=(width, 8)) as pilot:
        table = Bare.query_one(pilot.app, FleetTable)
        table.show([row("engine-a", "connection refused\nby the host"), row(long_name, "")])
        table.cursor = 1
        await pilot.pause()
        lines = [table.render_line(y) for y in range(7)]
    texts = [line.text for line in lines]
    assert all(line.cell_length == width for line in lines) and not any("\n" in t for t in texts)
    def cells(*texts: str) -> str:
        return "".join(t.ljust(w) + " " for t, w in zip(texts, WIDTHS, strict=False))

    assert texts[0].startswith(cells(*(c.label for c in COLUMNS[:5]), "gen tok/↓"))  # the sorted column
    assert texts[1].startswith(cells("down", "engine-a", "vllm", "Qwen3-8B", "node-1", "12.3", "1.2k"))
    start = sum(WIDTHS[:WHY]) + WHY  # the "alerts / why" column, cut at the screen's edge
    assert texts[1][start:] == "connection refused by the host".ljust(width - start - 1) + " "
    assert texts[2][7:7 + WIDTHS[1] + 1] == long_name[:WIDTHS[1] - 1] + "… "
    assert texts[3:] == [" " * width] * 4
    assert "".join(seg.text for seg in lines[2] if seg.style and seg.style.reverse) == texts[2]
    assert not any(seg.style and seg.style.reverse for seg in lines[1])


def test_gpu_figures_say_whether_they_are_the_engines_or_its_nodes() -> None:
    """15 engines on one 8-GPU node: without labels that name their GPUs, each row's GPU figures are the
    node's (said "8 node", dimmed), never presented as each engine's own; an engine matched by pod, GPU
    UUID or GPU index shows only its own GPUs ("1 own")."""
    from tui.fleet.match import GpuMatcher
    from tui.live.engine_state import EngineState
    from tui.model.samples import EngineSample, GpuSample
    from widgets.fleet_table import COLUMNS, GPUS, build_rows

    gpus = [GpuSample(t=0.0, index=i, name="H200", uuid=f"GPU-{i}", power_w=165.0, host="node-1",
                      **({"namespace": "ml", "pod": "vllm-0"} if i == 7 else {})) for i in range(8)]

    def engine(name: str, labels: tuple[tuple[str, str], ...] = ()) -> EngineState:
        state = EngineState(name, "http://10.0.0.1:8000")
        state.sample = EngineSample(name=name, url=state.url, t=0.0, wall=0.0, health="up", host="node-1",
                                    labels=labels)
        return state

    engines = {f"shared-{i}": engine(f"shared-{i}") for i in range(12)}
    engines["by-pod"] = engine("by-pod", (("namespace", "ml"), ("pod", "vllm-0")))
    engines["by-uuid"] = engine("by-uuid", (("gpu_uuid", "GPU-3"),))
    engines["by-index"] = engine("by-index", (("gpu", "4,5"),))
    rows = {r.name: r for r in build_rows(engines, gpus)}
    watts = next(i for i, c in enumerate(COLUMNS) if c.label == "GPU W")
    assert rows["shared-0"].values[GPUS] == "8 node" and rows["shared-0"].values[watts] == 8 * 165.0
    assert rows["shared-0"].cells[watts].style == "dim"
    assert rows["by-pod"].values[GPUS] == "1 own" and rows["by-pod"].values[watts] == 165.0
    assert rows["by-uuid"].values[GPUS] == "1 own" and rows["by-uuid"].values[watts] == 165.0
    assert rows["by-index"].values[GPUS] == "2 own" and rows["by-index"].values[watts] == 330.0
    assert GpuMatcher(gpus).share(engines["by-uuid"].sample).gpus == (gpus[3],)
