"""Issue 51's CPU: Python's full collection walks every tracked object however old, so what start-up builds
and the process keeps (~100,000 objects) is frozen before the dashboard runs (tui.ui.core.AppCore.run), and
what the dashboard builds from then on is collected as before. What it saves is measured by
`bench/bench_cycle.py --only vllm` against the same with `--no-freeze`, never here."""

from __future__ import annotations

import subprocess
import sys

RUN = """
import gc
from tui.model.targets import EngineTarget
from tui.ui.app import EnginetopApp
from tui.ui.config import AppConfig

class Cycle:
    def __init__(self):
        self.me = self

app = EnginetopApp(AppConfig(targets=[EngineTarget('e', 'http://127.0.0.1:9')]))
seen = []

async def pilot(p):
    await p.pause()
    Cycle()  # garbage only the cyclic collector frees
    seen.append((gc.get_freeze_count(), gc.collect()))
    await p.exit(None)

before = gc.get_freeze_count()
app.run(headless=True, size=(120, 40), auto_pilot=pilot)
print(before, *seen[0])
"""


def test_what_start_up_built_is_frozen_and_what_comes_after_is_collected() -> None:
    done = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, frozen, collected = map(int, done.stdout.split()[-3:])
    assert before == 0 and frozen > 20_000, (before, frozen)
    assert collected >= 2, collected  # the cycle made while the app ran: the object and its __dict__
