"""The drain step of a switch: wait until the old engine's resources are really free, as an independent check
would see them, before anything new starts.

Free means: the old engine's processes gone and its port closed (or, for a router that stays, its model
unloaded), and on every GPU that matters NVML's VRAM use below the profile's threshold with no old PID listed
(a dead engine's PID listed there is still its CUDA context). Without a GPU, processes and port alone.

The GPUs that matter are the old engine's (where NVML listed its processes before the stop) and the new
profile's (its CUDA_VISIBLE_DEVICES); every GPU when neither is known. Memory that another live process
holds is not counted: another engine on the machine never blocks the drain.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tui.base.process import pid_alive, port_open
from tui.lifecycle.engine import EngineInstance, StepError, timeout_message
from tui.lifecycle.profile_resolve import ResolvedProfile
from tui.lifecycle.profiles import GIB, Profile
from tui.lifecycle.switch_run import SwitchRun
from tui.model.samples import GpuReport, GpuSample

DRAIN_POLL_S = 0.5


def freed_pids(run: SwitchRun, old: EngineInstance | None, keep_router: bool) -> set[int]:
    """The processes the switch frees: the old engine's tree, or the router's child of the old model."""
    if old is None:
        return set()
    if old.profile.router_model and (keep_router or old.attached):
        return run.router(old.resolved).processes(old.profile.router_model)
    return set() if old.attached else old.tree_pids() | set(old.pids_seen)


def gpus_holding(read_gpus: Callable[[], GpuReport] | None, pids: set[int]) -> set[int]:
    """Indices of the GPUs where NVML lists one of these processes now."""
    if read_gpus is None or not pids:
        return set()
    report = read_gpus()
    return {gpu.index for gpu in report.gpus if any(p.pid in pids for p in gpu.processes)}


def wait_drained(
    run: SwitchRun, old: EngineInstance | None, resolved: ResolvedProfile, old_pids: set[int],
    old_gpus: set[int], read_gpus: Callable[[], GpuReport] | None, unloaded: bool = False,
) -> None:
    """Wait until the old engine's resources are really free, as an independent check would see."""
    run.enter("drain")
    to = resolved.profile
    threshold = to.vram_threshold_bytes
    deadline = time.monotonic() + to.drain_timeout_s
    # the old engine this switch stopped: wait for its processes and its port
    stopped = old if old is not None and not old.attached and not unloaded else None
    if stopped:
        old_pids = set(stopped.pids_seen)
    elif not unloaded:
        old_pids = set()
    what = "old processes gone, old port closed" if stopped else "no engine was running"
    if old is not None and unloaded:
        model = str(old.profile.router_model)
        run.emit("drain", "running", f"waiting for {model} to be unloaded")
        what = run.router(old.resolved).wait_unloaded(
            model, old_pids, run.cancel, lambda words: run.emit("drain", "running", words),
            timeout=to.drain_timeout_s)
    # On the GPU a PID is only a number: a dead engine's PID listed there is still its context.
    last = ""
    while True:
        run.check_cancel("drain")
        blockers: list[str] = []
        if stopped:
            alive = stopped.survivors()
            if alive:
                blockers.append(f"old PIDs still running: {', '.join(map(str, alive))}")
            if port_open(stopped.profile.connect_host, stopped.profile.port):
                blockers.append(f"old port {stopped.profile.port} still listening")
        report = read_gpus() if read_gpus is not None else None
        gpu_words = "no GPU"
        if report is not None and report.gpus:
            watched = drain_gpus(report.gpus, old_gpus, visible_devices(resolved.env))
            words = []
            for gpu in report.gpus:
                blocked, word = _gpu_blockers(gpu, gpu.index in watched, old_pids, threshold, to)
                blockers += blocked
                if word:
                    words.append(word)
            gpu_words = "; ".join(words)
        elif report is not None and report.unavailable:
            gpu_words = f"no GPU ({report.unavailable})"
        if not blockers:
            run.emit("drain", "ok", f"{what}; {gpu_words or 'GPU memory below threshold'}")
            return
        message = "; ".join(blockers)
        if message != last:
            run.emit("drain", "running", message)
            last = message
        if time.monotonic() >= deadline:
            raise StepError(
                "drain", timeout_message("drain", to.drain_timeout_s, message), timed_out=True
            )
        time.sleep(DRAIN_POLL_S)


# ---------------------------------------------------------------- which GPUs the drain waits on


def visible_devices(env: dict[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES as the new engine will see it (its profile's env over ours), None when unset."""
    return env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))


def cuda_visible_indices(value: str, gpus: tuple[GpuSample, ...]) -> set[int] | None:
    """NVML indices of the GPUs a CUDA_VISIBLE_DEVICES value names; None when that cannot be told for sure.

    Entries are indices or (prefixes of) GPU UUIDs; CUDA stops at the first invalid one. CUDA numbers GPUs
    fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML in PCI order: the two agree when the GPUs are
    all the same model, so an index is trusted only then. A MIG UUID names no whole GPU here: unknown."""
    pci_order = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    same_model = len({gpu.name for gpu in gpus}) <= 1
    picked: set[int] = set()
    for item in (part.strip() for part in value.split(",")):
        if item.lstrip("-").isdigit():
            index = int(item)
            if index < 0 or index >= len(gpus):
                break
            if not (pci_order or same_model):
                return None
            picked.add(index)
            continue
        if not item or item.startswith("MIG-"):
            return None if item else picked
        uuid = item if item.startswith("GPU-") else f"GPU-{item}"
        matches = [gpu.index for gpu in gpus if gpu.uuid and gpu.uuid.startswith(uuid)]
        if len(matches) != 1:
            break  # unknown or ambiguous: CUDA stops here too
        picked.add(matches[0])
    return picked


def drain_gpus(gpus: tuple[GpuSample, ...], old_gpus: set[int], visible: str | None) -> set[int]:
    """The GPUs whose memory must drain before the new engine starts: where the old engine's processes
    were seen, plus those the new one will use; every GPU when neither is known."""
    targets = cuda_visible_indices(visible, gpus) if visible is not None else None
    if not old_gpus and targets is None:
        return {gpu.index for gpu in gpus}
    return old_gpus | (targets or set())


def _gpu_blockers(
    gpu: GpuSample, watched: bool, old_pids: set[int], threshold: int, to: Profile
) -> tuple[list[str], str | None]:
    """(what still blocks on this GPU, words for the final message)."""
    label = f"GPU {gpu.index}"
    if gpu.error:
        return ([f"{label}: {gpu.error}"] if watched else []), None
    blockers = []
    holders = sorted(p.pid for p in gpu.processes if p.pid in old_pids)
    if holders:  # on any GPU: a dead engine's PID listed there is still its context
        blockers.append(f"{label}: old engine PIDs {', '.join(map(str, holders))} still hold GPU memory")
    if not watched:
        return blockers, f"{label} not waited on (neither the old engine's nor the new one's)"
    if gpu.vram_used_bytes is None:
        return blockers, f"{label} VRAM used unknown"
    # Memory of other live processes (another engine on this machine) is theirs, not the old engine's.
    others = [p for p in gpu.processes if p.pid not in old_pids and p.used_bytes and pid_alive(p.pid)]
    other_bytes = sum(p.used_bytes or 0 for p in others)
    besides = (
        f", {other_bytes / GIB:.1f} GiB of it held by other processes "
        f"(PIDs {', '.join(str(p.pid) for p in others)}), not counted"
        if others
        else ""
    )
    used = f"VRAM used {gpu.vram_used_bytes / GIB:.1f} GiB{besides}"
    if gpu.vram_used_bytes - other_bytes >= threshold:
        blockers.append(f"{label}: {used} (threshold {to.vram_threshold_gib:g} GiB)")
    return blockers, f"{label} {used}"
