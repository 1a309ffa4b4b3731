"""MemoryFit (core.plugins.memory_fit): best fit by GPU memory for memory-sized shares, and
nothing at all for shares sized by compute (openb) or whole GPUs."""

from __future__ import annotations

import numpy as np

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.resources import SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task

MEM = 81920


def gpu(used_milli: int, used_mem: int) -> GpuSpec:
    return GpuSpec(
        model="A100-80GB",
        mem_mib=MEM,
        mode=SharingMode.MPS,
        used_milli=used_milli,
        used_mem=used_mem,
        clients=1 if used_milli or used_mem else 0,
    )


def place(gpus: list[GpuSpec], req: DeviceRequest, seed: int = 0) -> int:
    snap = (
        SnapshotBuilder()
        .add(NodeSpec(name="a", cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus))
        .build()
    )
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    d = Scheduler(fw).run_session(
        snap, [Task(id="t", gpu=req)], now=0, rng=np.random.default_rng(seed)
    )
    (p,) = d.placements
    return p.devices[0].slot


def test_memory_sized_share_takes_the_gpu_it_leaves_least_memory_on() -> None:
    # GPU 0: 900 milli free, 20000 MiB free -> 20000 - 19000 = 1000 MiB left after placing
    # GPU 1: 100 milli free, 70000 MiB free -> 51000 MiB left. Compute-tightest would pick 1.
    gpus = [gpu(100, MEM - 20_000), gpu(900, MEM - 70_000)]
    for seed in range(3):
        assert place(gpus, DeviceRequest(milli=50, mem_mib=19_000), seed) == 0
        # and in the other slot order
        assert place(gpus[::-1], DeviceRequest(milli=50, mem_mib=19_000), seed) == 1


def test_compute_sized_share_is_left_to_kallot_score() -> None:
    # the same GPUs, a share without memory: MemoryFit abstains (score 0, no GPU choice)
    from kallot.core.plugins.memory_fit import MemoryFit

    gpus = [gpu(100, MEM - 20_000), gpu(900, MEM - 70_000)]
    snap = (
        SnapshotBuilder()
        .add(NodeSpec(name="a", cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus))
        .build()
    )
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    from kallot.core.session.session import Session

    cycle = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={}).cycle()
    task = Task(id="t", gpu=DeviceRequest(milli=50))
    plugin = MemoryFit()
    assert plugin.choose(cycle, task, 0, np.array([0, 1])) is None
    assert plugin.score(cycle, task, np.array([0])) is None  # no opinion: adds nothing
