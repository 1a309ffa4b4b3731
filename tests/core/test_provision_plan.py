"""The scale-up planner (core.provision.plan) against a brute-force oracle on small cases.

The oracle knows nothing of the core's sessions: it enumerates node-count vectors in cost order
and, for each, searches every assignment of the tasks to GPUs (shares summing to at most one
GPU's compute and memory, whole GPUs exclusive, MIG instances where ``core.mig`` says a layout
is valid, gangs whole and inside one rack, host CPU and memory). The first vector with an
assignment is the optimum. The planner's plan is checked by the same rules (it is valid), never
costs less than the optimum (nothing cheaper exists), and on these cases reaches it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import mig, policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.plan import Planner
from kallot.core.provision.shapes import NodeShape
from kallot.core.resources import GPU_MODELS, MILLI, SharingMode
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode

H100 = "H100-80GB"
GPU_MEM = GPU_MODELS[H100].memory_mib
RACK = "kallot.io/rack"
NOT_MIG = frozenset({SharingMode.EXCLUSIVE, SharingMode.MPS})
FW = Framework(presets.PROFILES["kallot"], policies.builtin_registry())

SHAPES = (
    NodeShape(
        name="big", cpu_milli=16_000, mem_mib=64_000, gpu_model=H100, gpus=4,
        labels={RACK: "a"}, max_new=3,
    ),
    NodeShape(
        name="small", cpu_milli=8_000, mem_mib=32_000, gpu_model=H100, gpus=1,
        labels={RACK: "b"}, max_new=4,
    ),
    NodeShape(
        name="mig", cpu_milli=8_000, mem_mib=32_000, gpu_model=H100, gpus=1,
        gpu_mode=SharingMode.MIG, mig_dynamic=True, labels={RACK: "c"}, max_new=2,
    ),
)  # fmt: skip
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")


# -- the oracle ------------------------------------------------------------------------------


@dataclass
class _Gpu:
    mig: bool
    milli: int = 0
    mem: int = 0
    whole: bool = False
    instances: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class _Node:
    shape: NodeShape
    cpu: int = 0
    mem: int = 0
    gpus: list[_Gpu] = field(default_factory=list)


def _nodes(shapes: Sequence[NodeShape], counts: Sequence[int]) -> list[_Node]:
    return [
        _Node(s, gpus=[_Gpu(s.gpu_mode is SharingMode.MIG) for _ in range(s.gpus)])
        for s, k in zip(shapes, counts, strict=True)
        for _ in range(k)
    ]


def _device_options(n: _Node, g: DeviceRequest) -> list[list[tuple[int, str, int]]]:
    """Ways to take ``g`` on node ``n``: per way, (gpu index, kind, MIG start)."""
    free = [i for i, u in enumerate(n.gpus) if not u.mig]
    if g.mig_profile:
        return [
            [(i, "mig", s)]
            for i, u in enumerate(n.gpus)
            if u.mig
            for s in mig.placements(H100, u.instances, g.mig_profile)
        ]
    if g.whole:
        empty = [i for i in free if not n.gpus[i].whole and n.gpus[i].milli == 0]
        return [[(i, "whole", 0) for i in c] for c in itertools.combinations(empty, g.count)]
    mem = g.memory_for(GPU_MEM)
    return [
        [(i, "share", 0)]
        for i in free
        if not n.gpus[i].whole
        and n.gpus[i].milli + g.milli <= MILLI
        and n.gpus[i].mem + mem <= GPU_MEM
    ]


def _take(n: _Node, t: Task, way: list[tuple[int, str, int]], sign: int) -> None:
    g = t.gpu
    assert g is not None
    n.cpu += sign * t.cpu_milli
    n.mem += sign * t.mem_mib
    for i, kind, start in way:
        u = n.gpus[i]
        if kind == "mig":
            if sign > 0:
                u.instances.append((g.mig_profile, start))
            else:
                u.instances.remove((g.mig_profile, start))
        elif kind == "whole":
            u.whole = sign > 0
        else:
            u.milli += sign * g.milli
            u.mem += sign * g.memory_for(GPU_MEM)


def _assignable(nodes: list[_Node], tasks: Sequence[Task], jobs: dict[str, Job]) -> bool:
    racks: dict[str, str] = {}

    def go(k: int) -> bool:
        if k == len(tasks):
            return True
        t = tasks[k]
        assert t.gpu is not None
        seen: set[tuple[object, ...]] = set()
        for n in nodes:
            if n.cpu + t.cpu_milli > n.shape.cpu_milli or n.mem + t.mem_mib > n.shape.mem_mib:
                continue
            rack = n.shape.labels[RACK]
            job = jobs.get(t.job)
            one_rack = job is not None and job.topology.mode is TopologyMode.REQUIRED
            if one_rack and racks.get(t.job, rack) != rack:
                continue
            for way in _device_options(n, t.gpu):
                state = (n.shape.name, n.cpu, n.mem, repr(n.gpus), tuple(way))
                if state in seen:  # an identical node in an identical state: same subtree
                    continue
                seen.add(state)
                fresh = t.job and t.job not in racks
                if fresh:
                    racks[t.job] = rack
                _take(n, t, way, +1)
                if go(k + 1):
                    return True
                _take(n, t, way, -1)
                if fresh:
                    del racks[t.job]
        return False

    return go(0)


def oracle(shapes: Sequence[NodeShape], tasks: Sequence[Task], jobs: dict[str, Job]) -> float:
    """The least cost of new nodes any assignment of ``tasks`` needs (inf if none)."""
    order = sorted(tasks, key=lambda t: (t.job == "", t.job))  # gangs first: racks fixed early
    vectors = itertools.product(*(range(s.max_new + 1) for s in shapes))
    for counts in sorted(
        vectors, key=lambda c: (sum(k * s.price for s, k in zip(shapes, c, strict=True)), c)
    ):
        if _assignable(_nodes(shapes, counts), order, jobs):
            return sum(k * s.price for s, k in zip(shapes, counts, strict=True))
    return float("inf")


# -- the cases -------------------------------------------------------------------------------

share = st.builds(
    lambda m, mem: DeviceRequest(milli=m, mem_mib=mem, models=frozenset({H100}), modes=NOT_MIG),
    st.sampled_from([100, 250, 300, 500, 700]),
    st.sampled_from([0, 0, 20_000, 50_000]),
)
whole = st.builds(
    lambda c: DeviceRequest(count=c, models=frozenset({H100}), modes=NOT_MIG), st.integers(1, 3)
)
mig_req = st.builds(
    lambda p: DeviceRequest(mig_profile=p, models=frozenset({H100})), st.sampled_from(MIG_PROFILES)
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Task], dict[str, Job]]:
    reqs = draw(st.lists(st.one_of(share, whole, mig_req), min_size=1, max_size=4))
    tasks = [
        Task(id=f"t{i}", cpu_milli=draw(st.sampled_from([500, 2000, 5000])), mem_mib=1000, gpu=r)
        for i, r in enumerate(reqs)
    ]
    jobs: dict[str, Job] = {}
    if draw(st.booleans()):
        size = draw(st.integers(2, 3))
        req = DeviceRequest(count=draw(st.integers(1, 2)), models=frozenset({H100}), modes=NOT_MIG)
        topo = TopologyConstraint(mode=TopologyMode.REQUIRED, level=RACK)
        jobs["g"] = Job(id="g", min_available=size, topology=topo)
        tasks += [
            Task(id=f"g{i}", cpu_milli=1000, mem_mib=1000, gpu=req, job="g") for i in range(size)
        ]
    return tasks, jobs


def _valid(plan_nodes: dict[str, list[str]], tasks: Sequence[Task], jobs: dict[str, Job]) -> bool:
    """The plan's nodes hold their tasks under the oracle's rules."""
    by_id = {t.id: t for t in tasks}
    shape_of = {s.name: s for s in SHAPES}
    for node, ids in plan_nodes.items():
        shape = shape_of[node.removeprefix("new-").rsplit("-", 1)[0]]
        one = _nodes([shape], [1])
        if not _assignable(one, [by_id[i] for i in ids], {}):
            return False
    racks = {
        shape_of[n.removeprefix("new-").rsplit("-", 1)[0]].labels[RACK]
        for n, ids in plan_nodes.items()
        if any(by_id[i].job == "g" for i in ids)
    }
    return len(racks) <= 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_planner_matches_the_oracle(case: tuple[list[Task], dict[str, Job]]) -> None:
    tasks, jobs = case
    plan = Planner(FW, SHAPES).plan(tasks, jobs)
    left = set(plan.unplaceable)
    kept = [t for t in tasks if t.id not in left]
    for t in tasks:  # a task (with its gang) left out does not fit with the rest: maximal
        if t.id in left:
            unit = [u for u in tasks if u.id == t.id or (t.job and u.job == t.job)]
            assert oracle(SHAPES, kept + unit, jobs) == float("inf"), t
    tasks = kept
    best = oracle(SHAPES, tasks, jobs)
    assert best < float("inf")
    placed = sorted(i for n in plan.nodes for i in n.tasks)
    assert placed == sorted(t.id for t in tasks)
    assert _valid({n.name: list(n.tasks) for n in plan.nodes}, tasks, jobs)
    assert plan.cost >= best  # the oracle's optimum: nothing cheaper places them
    assert plan.cost == best, (plan, best)
