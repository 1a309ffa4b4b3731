"""Properties of every policy (hypothesis), checked by an independent brute-force oracle.

For random small clusters (mixed sharing modes, health, models, partial usage, tight CPU,
memory and pod limits) and random task lists, for every policy of ``POLICY_NAMES``:
- each placement is feasible when replayed in attempt order against the oracle's own books,
  and nothing is ever over-committed (GPU compute, memory, clients; node CPU, memory, pods);
- a task reported unschedulable really fits on no node at that point of the sequence;
- every task is decided exactly once, in queue order; the same seed gives the same Decision.
The oracle is plain Python over the snapshot's capacities: it shares no code with core.fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import frag, policies
from kallot.core.decision import Decision, DeviceAssignment, Placement, Unschedulable
from kallot.core.framework.runner import Framework
from kallot.core.resources import GPU_MODELS, MILLI, Isolation, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.status import NOT_EXPLAINED
from kallot.core.workload import DeviceRequest, Task

MODELS = ("T4", "G2", "A100-80GB")


@st.composite
def gpu_st(draw, model: str):  # type: ignore[no-untyped-def]
    mem = GPU_MODELS[model].memory_mib
    mode = draw(
        st.sampled_from(
            [SharingMode.MPS, SharingMode.MPS, SharingMode.EXCLUSIVE, SharingMode.TIMESLICE]
        )
    )
    replicas = draw(st.integers(1, 3)) if mode is SharingMode.TIMESLICE else 1
    over = draw(st.sampled_from([1.0, 2.0])) if mode is SharingMode.TIMESLICE else 1.0
    cap = int(MILLI * over)
    max_clients = {SharingMode.EXCLUSIVE: 1, SharingMode.TIMESLICE: replicas}.get(
        mode,
        draw(st.sampled_from([0, 2])),  # 0 = MPS default (48)
    )
    if mode is SharingMode.EXCLUSIVE:
        used = draw(st.sampled_from([0, 0, MILLI]))
    else:
        used = draw(
            st.sampled_from([0, 0, 0, 100, 300, 500, 810, 1000, 1500]).filter(lambda u: u <= cap)
        )
    clients = 0 if used == 0 else draw(st.integers(1, max(1, min(2, max_clients or 48))))
    return GpuSpec(
        model=model,
        mem_mib=mem,
        mode=mode,
        replicas=replicas,
        oversubscription=over,
        max_clients=max_clients,
        healthy=draw(st.integers(0, 7)) > 0,  # 7 in 8 healthy
        used_milli=used,
        used_mem=min(int(mem * over), used * mem // MILLI),
        clients=clients,
    )


@st.composite
def node_st(draw, index: int):  # type: ignore[no-untyped-def]
    cpu = draw(st.sampled_from([2000, 16_000, 64_000, 64_000]))
    mem = draw(st.sampled_from([8192, 65536]))
    max_pods = draw(st.sampled_from([1, 3, 1000, 1000]))
    model = draw(st.sampled_from(MODELS))
    n_gpus = draw(st.integers(0, 8))
    return NodeSpec(
        name=f"n{index}",
        cpu_milli=cpu,
        mem_mib=mem,
        cpu_used=draw(st.sampled_from([0, 0, cpu // 2, cpu])),
        mem_used=draw(st.sampled_from([0, mem // 2])),
        max_pods=max_pods,
        pods_used=draw(st.integers(0, max_pods - 1)) if max_pods < 1000 else 0,
        schedulable=draw(st.integers(0, 7)) > 0,
        gpus=[draw(gpu_st(model)) for _ in range(n_gpus)],
    )


@st.composite
def cluster_st(draw) -> Snapshot:  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 6))
    return SnapshotBuilder().extend(draw(node_st(i)) for i in range(n)).build()


@st.composite
def task_st(draw, index: int) -> Task:  # type: ignore[no-untyped-def]
    kind = draw(st.sampled_from(["cpu", "share", "share", "whole"]))
    gpu = None
    models = draw(
        st.sampled_from([frozenset(), frozenset(), frozenset({"T4"}), frozenset({"G2", "T4"})])
    )
    modes = draw(st.sampled_from([frozenset(SharingMode), frozenset({SharingMode.MPS})]))
    isolation = draw(st.sampled_from([Isolation.NONE, Isolation.NONE, Isolation.MEMORY]))
    if kind == "share":
        gpu = DeviceRequest(
            count=1,
            milli=draw(st.sampled_from([100, 250, 500, 810, 999])),
            mem_mib=draw(st.sampled_from([0, 0, 4096])),
            models=models,
            modes=modes,
            isolation=isolation,
        )
    elif kind == "whole":
        gpu = DeviceRequest(count=draw(st.sampled_from([1, 1, 2, 3, 4, 8])), models=models)
    return Task(
        id=f"t{index}",
        cpu_milli=draw(st.sampled_from([0, 500, 4000, 4000, 20_000])),
        mem_mib=draw(st.sampled_from([0, 1024, 1024, 40_000])),
        gpu=gpu,
        priority=draw(st.integers(0, 2)),
        created=float(index),
    )


@st.composite
def tasks_st(draw) -> list[Task]:  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, 10))
    return [draw(task_st(i)) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# The oracle.


@dataclass
class Books:
    """The oracle's own copy of the usage, updated by replaying placements."""

    cpu: list[int]
    mem: list[int]
    pods: list[int]
    gpu_milli: list[list[int]]
    gpu_mem: list[list[int]]
    clients: list[list[int]]

    @staticmethod
    def of(s: Snapshot) -> Books:
        g = [int(c) for c in s.gpu_count()]
        return Books(
            cpu=[int(x) for x in s.node_cpu_used],
            mem=[int(x) for x in s.node_mem_used],
            pods=[int(x) for x in s.node_pods_used],
            gpu_milli=[[int(s.gpu_used_milli[n, j]) for j in range(g[n])] for n in range(len(g))],
            gpu_mem=[[int(s.gpu_used_mem[n, j]) for j in range(g[n])] for n in range(len(g))],
            clients=[[int(s.gpu_clients[n, j]) for j in range(g[n])] for n in range(len(g))],
        )


def host_fits(s: Snapshot, b: Books, n: int, task: Task) -> bool:
    return (
        bool(s.node_schedulable[n])
        and b.pods[n] + 1 <= s.node_max_pods[n]
        and b.cpu[n] + task.cpu_milli <= s.node_cpu_milli[n]
        and b.mem[n] + task.mem_mib <= s.node_mem_mib[n]
    )


def need_mem(req: DeviceRequest, device_mem: int) -> int:
    return req.mem_mib if req.mem_mib else req.milli * device_mem // MILLI


def slot_fits(s: Snapshot, b: Books, n: int, j: int, req: DeviceRequest) -> bool:
    if not s.gpu_healthy[n, j]:
        return False
    if req.models and s.models[int(s.gpu_model[n, j])] not in req.models:
        return False
    mode = SharingMode(int(s.gpu_mode[n, j]))
    if req.whole:
        return (
            mode is not SharingMode.MIG
            and SharingMode.EXCLUSIVE in req.modes
            and b.clients[n][j] == 0
            and b.gpu_milli[n][j] == 0
        )
    if mode not in (SharingMode.MPS, SharingMode.TIMESLICE) or mode not in req.modes:
        return False
    if req.isolation is Isolation.MEMORY and mode is SharingMode.TIMESLICE:
        return False
    return bool(
        b.gpu_milli[n][j] + req.milli <= s.gpu_cap_milli[n, j]
        and b.gpu_mem[n][j] + need_mem(req, int(s.gpu_mem_mib[n, j])) <= s.gpu_cap_mem[n, j]
        and b.clients[n][j] + 1 <= s.gpu_max_clients[n, j]
    )


def fits_somewhere(s: Snapshot, b: Books, task: Task) -> list[str]:
    out = []
    for n in range(s.n_nodes):
        if not host_fits(s, b, n, task):
            continue
        req = task.gpu
        if req is None or req.count == 0:
            out.append(s.node_names[n])
            continue
        free = [j for j in range(len(b.clients[n])) if slot_fits(s, b, n, j, req)]
        if len(free) >= req.count:
            out.append(s.node_names[n])
    return out


def check_and_apply(s: Snapshot, b: Books, p: Placement, task: Task) -> None:
    n = p.node_row
    assert s.node_names[n] == p.node, p
    assert host_fits(s, b, n, task), f"{task.id}: host resources of {p.node} exhausted"
    req = task.gpu
    if req is None or req.count == 0:
        assert p.devices == (), p
    else:
        slots = [d.slot for d in p.devices]
        assert len(slots) == req.count and len(set(slots)) == req.count, p
        for d in p.devices:
            j = d.slot
            assert 0 <= j < len(b.clients[n]), f"{task.id}: slot {j} is not a GPU of {p.node}"
            assert slot_fits(s, b, n, j, req), f"{task.id}: GPU {p.node}/{j} cannot take it"
            assert d.uuid == s.gpu_uuid[n][j]
            if req.whole:
                assert (d.milli, d.mem_mib, d.mode) == (
                    s.gpu_cap_milli[n, j],
                    s.gpu_cap_mem[n, j],
                    SharingMode.EXCLUSIVE,
                )
            else:
                assert (d.milli, d.mem_mib, d.mode) == (
                    req.milli,
                    need_mem(req, int(s.gpu_mem_mib[n, j])),
                    SharingMode(int(s.gpu_mode[n, j])),
                )
    b.cpu[n] += task.cpu_milli
    b.mem[n] += task.mem_mib
    b.pods[n] += 1
    for d in p.devices:
        b.gpu_milli[n][d.slot] += d.milli
        b.gpu_mem[n][d.slot] += d.mem_mib
        b.clients[n][d.slot] += 1


def assert_not_overcommitted(s: Snapshot, b: Books) -> None:
    for n in range(s.n_nodes):
        assert b.cpu[n] <= s.node_cpu_milli[n]
        assert b.mem[n] <= s.node_mem_mib[n]
        assert b.pods[n] <= s.node_max_pods[n]
        for j in range(len(b.clients[n])):
            assert 0 <= b.gpu_milli[n][j] <= s.gpu_cap_milli[n, j], (n, j)
            assert 0 <= b.gpu_mem[n][j] <= s.gpu_cap_mem[n, j], (n, j)
            assert 0 <= b.clients[n][j] <= s.gpu_max_clients[n, j], (n, j)


def cpu_reserve(s: Snapshot, target: frag.TargetWorkload) -> float:
    """The oracle's own CpuReserve ratio (plugins.cpu_reserve): the target's GPU shapes' milli-CPU
    per milli-GPU when the target asks more CPU at GPU capacity than the cluster has, else 0."""
    shapes = list(zip(target.shapes, target.weight, strict=True))
    gpu_milli = sum(w * sh.gpu_milli * sh.gpu_count for sh, w in shapes)
    cpu = sum(w * sh.cpu_milli for sh, w in shapes)
    gpu_cpu = sum(w * sh.cpu_milli for sh, w in shapes if sh.gpu_milli)
    capacity = float(s.gpu_cap_milli[s.gpu_valid].sum())
    if gpu_milli <= 0 or s.node_cpu_milli.sum() <= 0:
        return 0.0
    rho = capacity / gpu_milli * cpu / float(s.node_cpu_milli.sum())
    return gpu_cpu / gpu_milli if rho >= 1 else 0.0


def reserve_keeps_off(s: Snapshot, b: Books, n: int, task: Task, ratio: float) -> bool:
    """True when CpuReserve at ``ratio`` keeps CPU-only ``task`` off node ``n``: the node would
    keep less free CPU than its idle GPUs (healthy, not MIG) need."""
    if ratio <= 0 or task.gpu is not None or task.cpu_milli <= 0:
        return False
    idle = sum(
        max(0, int(s.gpu_cap_milli[n, j]) - b.gpu_milli[n][j])
        for j in range(len(b.gpu_milli[n]))
        if s.gpu_healthy[n, j] and s.gpu_mode[n, j] != SharingMode.MIG
    )
    return int(s.node_cpu_milli[n]) - b.cpu[n] - task.cpu_milli < idle * ratio


def verify(s: Snapshot, tasks: list[Task], d: Decision, reserve: float = 0.0) -> None:
    by_id = {t.id: t for t in tasks}
    events: list[tuple[int, str, Placement | None]] = [
        (p.attempt, p.task_id, p) for p in d.placements
    ] + [(u.attempt, u.task_id, None) for u in d.unschedulable]
    events.sort(key=lambda e: e[0])
    # every task decided exactly once, attempts 0..n-1, in queue order (priority, created, id)
    assert [e[0] for e in events] == list(range(len(tasks)))
    queue = sorted(tasks, key=lambda t: (-t.priority, t.created, t.id))
    assert [e[1] for e in events] == [t.id for t in queue]
    books = Books.of(s)
    assert_not_overcommitted(s, books)  # the generated start state is valid
    for _, tid, placement in events:
        task = by_id[tid]
        if placement is None:
            # kallot's CpuReserve may keep a CPU-only task off every node it fits on
            fits = [
                name
                for name in fits_somewhere(s, books, task)
                if not reserve_keeps_off(s, books, s.node_names.index(name), task, reserve)
            ]
            assert fits == [], f"{tid} was rejected but fits"
        else:
            check_and_apply(s, books, placement, task)
        assert_not_overcommitted(s, books)


def framework(policy: str, tasks: list[Task], learned: bool) -> Framework:
    target = None if learned else frag.TargetWorkload.typical(tasks)
    return Framework(presets.profile(policy, target=target), policies.builtin_registry())


@pytest.mark.parametrize("policy", presets.POLICY_NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snap=cluster_st(),
    tasks=tasks_st(),
    seed=st.integers(0, 2**32 - 1),
    learned=st.booleans(),
)
def test_policy_decisions_are_feasible_complete_and_deterministic(  # type: ignore[no-untyped-def]
    policy, snap, tasks, seed, learned
) -> None:
    fw = framework(policy, tasks, learned)
    first = Scheduler(fw).run_session(snap, tasks, now=0.0, rng=np.random.default_rng(seed))
    reserve = 0.0
    if policy == "kallot" and any(t.gpu is not None for t in tasks):
        running = [a.task for a in snap.running]
        target = frag.TargetWorkload.typical(running + tasks if learned else tasks)
        reserve = cpu_reserve(snap, target) if target.size else 0.0
    verify(snap, tasks, first, reserve)
    # same seed, same Decision (also with the framework reused, as a live scheduler does)
    again = Scheduler(fw).run_session(snap, tasks, now=0.0, rng=np.random.default_rng(seed))
    assert again == first


def test_oracle_catches_an_overcommitted_placement() -> None:
    # The oracle itself must be able to fail: a placement on a full GPU is rejected.
    snap = (
        SnapshotBuilder()
        .add(
            NodeSpec(
                name="a",
                cpu_milli=1000,
                mem_mib=1024,
                gpus=[GpuSpec("T4", 15360, used_milli=900, used_mem=13824, clients=1)],
            )
        )
        .build()
    )
    task = Task(id="t", gpu=DeviceRequest(milli=500))
    bad = Placement(
        task_id="t",
        node="a",
        node_row=0,
        devices=(
            # an illegal device: the GPU has 100 milli left
            DeviceAssignment(
                slot=0, uuid=snap.gpu_uuid[0][0], milli=500, mem_mib=7680, mode=SharingMode.MPS
            ),
        ),
    )
    with pytest.raises(AssertionError, match="cannot take it"):
        verify(snap, [task], Decision(placements=(bad,)))
    rejected = Unschedulable(task_id="t", diagnosis=NOT_EXPLAINED)
    with pytest.raises(AssertionError, match="rejected but fits"):
        verify(snap, [Task(id="t", cpu_milli=10)], Decision(unschedulable=(rejected,)))
