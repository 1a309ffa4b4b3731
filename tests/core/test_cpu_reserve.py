"""CpuReserve (plugins.cpu_reserve): a CPU-only task keeps off the CPU a node's idle GPUs need
once the target runs out of CPU first. Hand-computed cases, and a session where the filter
changes what is placed."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.config import presets
from kallot.core import frag, policies
from kallot.core.framework.cycle import PENDING, Cycle
from kallot.core.framework.runner import Framework
from kallot.core.helpers.kallot_frag import cpu_scarcity
from kallot.core.plugins.cpu_reserve import CpuReserve
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task
from kallot.testing.builders import make_node, make_task, snapshot

# Half the target's tasks are 1 GPU + 8 CPUs (c = 8 milli-CPU per milli-GPU), half CPU-only
# with 16 CPUs: per 500 milli-GPU of demand the target asks 12,000 milli-CPU.
GPU_SHAPE = frag.Shape(8000, 1000, 1)
TARGET = frag.TargetWorkload.of([(GPU_SHAPE, 0.5), (frag.Shape(16000, 0, 0), 0.5)])


def cycle_of(snap: Snapshot, pending: tuple[Task, ...] | None = None) -> Cycle:
    """A cycle whose session has ``pending`` tasks (default: one GPU task)."""
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0.0, rng=np.random.default_rng(0), jobs={})
    if pending is None:
        pending = (make_task("waiting").cpu(8000).gpu(count=1).obj(),)
    session.shared.put(PENDING, pending)
    return session.cycle()


def cpu_only(cpu: int) -> Task:
    return make_task("t").cpu(cpu).obj()


def scarce() -> Snapshot:
    """Two 1-GPU nodes with 16 CPUs (one GPU idle, one fully used) and one with 8 CPUs used of
    16 and an idle GPU. rho = 3000 milli-GPU / 500 * 12,000 milli-CPU / 48,000 = 1.5."""
    return snapshot(
        make_node("idle").cpu(16000).gpus(1, model="T4"),
        make_node("full").cpu(16000).gpus(1, model="T4", used_milli=[1000]),
        make_node("half").cpu(16000, used=8000).gpus(1, model="T4"),
    )


def test_rho_is_the_targets_cpu_at_gpu_capacity_over_the_clusters_cpu() -> None:
    snap = scarce()
    inputs = frag.FragInputs.build(TARGET, snap.models)
    # 3 GPUs: 3000 / 500 * 12000 / 48000
    assert cpu_scarcity(inputs, snap) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [
        # idle: 16000 - cpu must stay >= 1000 * 8 = 8000; full: no idle GPU, no reserve;
        # half: 8000 free - cpu must stay >= 8000, so nothing fits there.
        (8000, [True, True, False]),
        (8001, [False, True, False]),
        (16000, [False, True, False]),
    ],
)
def test_cpu_only_task_keeps_off_the_cpu_idle_gpus_need(cpu: int, expected: list[bool]) -> None:
    snap = scarce()
    got = CpuReserve(TARGET).filter(cycle_of(snap), cpu_only(cpu))
    assert got is not None
    assert got.tolist() == expected


def test_gpu_tasks_and_tasks_without_cpu_are_never_filtered() -> None:
    snap = scarce()
    plugin = CpuReserve(TARGET)
    gpu_task = make_task("g").cpu(15000).gpu(milli=500).obj()
    # None: no opinion, the framework skips the filter (every node passes it).
    assert plugin.filter(cycle_of(snap), gpu_task) is None
    assert plugin.filter(cycle_of(snap), make_task("m").mem(1024).obj()) is None


def test_no_reserve_while_cpu_does_not_run_out_first() -> None:
    # A fourth node with 64 CPUs and no GPU: rho = 3000 / 500 * 12000 / 112000 = 0.64.
    snap = snapshot(
        make_node("idle").cpu(16000).gpus(1, model="T4"),
        make_node("full").cpu(16000).gpus(1, model="T4", used_milli=[1000]),
        make_node("half").cpu(16000, used=8000).gpus(1, model="T4"),
        make_node("cpu").cpu(64000),
    )
    assert cpu_scarcity(frag.FragInputs.build(TARGET, snap.models), snap) < 1
    assert CpuReserve(TARGET).filter(cycle_of(snap), cpu_only(8001)) is None


def test_no_reserve_without_a_gpu_task_pending() -> None:
    snap = scarce()
    cycle = cycle_of(snap, pending=(cpu_only(9000),))
    assert CpuReserve(TARGET).filter(cycle, cpu_only(9000)) is None


def test_explain_names_the_reserve() -> None:
    snap = scarce()
    plugin = CpuReserve(TARGET)
    cycle = cycle_of(snap)
    task = cpu_only(9000)
    kept = plugin.filter(cycle, task)
    assert kept is not None
    rejected = ~kept
    (why,) = plugin.explain(cycle, task, rejected)
    # idle: 16000 - 8000 reserved = 8000 unreserved; half: 8000 - 8000 = 0.
    assert why.message == (
        "cpu kept for the node's idle GPUs (CPU runs out before GPU): need 9000m, "
        "largest unreserved is 8000m"
    )
    assert why.nodes.tolist() == [True, False, True]


def place(policy: str, tasks: list[Task], cpu: int = 16000) -> dict[str, str | None]:
    snap = snapshot(
        make_node("a").cpu(cpu).gpus(1, model="T4"),
        make_node("b").cpu(cpu).gpus(1, model="T4"),
    )
    framework = Framework(presets.profile(policy, target=TARGET), policies.builtin_registry())
    decision = Scheduler(framework, explain=False).run_session(
        snap, tasks, now=0.0, rng=np.random.default_rng(0)
    )
    got: dict[str, str | None] = {t.id: None for t in tasks}
    for p in decision.placements:
        got[p.task_id] = p.node
    return got


def test_kallot_keeps_the_cpu_for_the_gpu_task_that_comes_later() -> None:
    # rho = 2000 / 500 * 12000 / 32000 = 1.5. Two 12-CPU CPU-only tasks first: each fits on a
    # node only by leaving it 4 CPUs for its idle GPU (8 needed), so kallot places neither and
    # both GPU tasks get a node; FGD, which places every task it can, places both CPU-only
    # tasks and then neither GPU task fits.
    tasks = [
        make_task("c1").cpu(12000).created(0).obj(),
        make_task("c2").cpu(12000).created(1).obj(),
        make_task("g1").cpu(8000).gpu(count=1).created(2).obj(),
        make_task("g2").cpu(8000).gpu(count=1).created(3).obj(),
    ]
    kallot = place("kallot", tasks)
    assert kallot["c1"] is None and kallot["c2"] is None
    assert {kallot["g1"], kallot["g2"]} == {"a", "b"}
    fgd = place("fgd", tasks)
    assert fgd["c1"] is not None and fgd["c2"] is not None
    assert fgd["g1"] is None and fgd["g2"] is None


def test_the_reserve_follows_the_gpus_as_they_fill() -> None:
    # Two nodes of 24 CPUs and 1 GPU: rho = 2000 / 500 * 12000 / 48000 = 1.0, reserve on.
    # c0 (1 CPU) fits anywhere; g1 takes a node's GPU, so that node reserves nothing more and
    # c1 (18 CPUs) fits there (19-23 free); on the other node it would leave 6 CPUs for an
    # idle GPU that needs 8. The idle GPUs seen for c0 must be refreshed for c1.
    tasks = [
        make_task("c0").cpu(1000).created(0).obj(),
        make_task("g1").cpu(4000).gpu(count=1).created(1).obj(),
        make_task("c1").cpu(18000).created(2).obj(),
    ]
    got = place("kallot", tasks, cpu=24000)
    assert got["g1"] is not None and got["c1"] == got["g1"]
