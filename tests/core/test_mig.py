"""MIG geometry (core.mig) and MIG placement (MigFit): tables, reconfiguration choice, and
hypothesis properties against a brute-force oracle that shares no code with core.mig.

Properties, for random small clusters of MIG GPUs (static and dynamic, random valid layouts with
random idle/used instances) next to MPS, time-sliced and exclusive GPUs, and random MIG, share
and whole-GPU requests with random isolation:
- replaying the Decision (reconfigurations before their task's placement) keeps every GPU's
  layout valid by NVIDIA's rules, destroys only idle instances, gives each MIG task an idle
  instance of its profile, and never over-commits compute, memory or clients;
- a MIG task reported unschedulable fits no idle instance and no reconfiguration of the idle
  instances of any dynamic GPU (the oracle tries every subset and every start);
- no placement breaks its task's isolation or accepted modes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import mig, policies
from kallot.core.decision import Decision, Placement, Unschedulable
from kallot.core.framework.runner import Framework
from kallot.core.resources import ALL_MODES, GPU_MODELS, Isolation, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import GpuSpec, NodeSpec, Scratch, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.testing.builders import make_task

# ---------------------------------------------------------------------------------------------
# The oracle's own transcription of k8s-apis.md §4: (name, compute, memory slices, starts, max,
# +me) for the two models the properties use.

_ROWS = (
    (1, 1, range(7), 7, False),
    (1, 1, range(7), 1, True),
    (1, 2, (0, 2, 4, 6), 4, False),
    (2, 2, (0, 2, 4), 3, False),
    (3, 4, (0, 4), 2, False),
    (4, 4, (0,), 1, False),
    (7, 8, (0,), 1, False),
)
NAMES = {
    "A100-80GB": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200-141GB": (
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ),
}
ORACLE = {model: dict(zip(names, _ROWS, strict=True)) for model, names in NAMES.items()}


def oracle_valid(model: str, instances: list[tuple[str, int]]) -> bool:
    """NVIDIA's rules, slice by slice."""
    table = ORACLE[model]
    occupied = [0] * 8
    compute = 0
    for name, start in instances:
        c, size, starts, _, _ = table[name]
        if start not in starts:
            return False
        for k in range(start, start + size):
            if k >= 8:
                return False
            occupied[k] += 1
        compute += c
    counts = {n: sum(1 for x, _ in instances if x == n) for n in table}
    media = sum(1 for x, _ in instances if table[x][4])
    return (
        max(occupied) <= 1
        and compute <= 7
        and all(counts[n] <= table[n][3] for n in table)
        and media <= 1
    )


def oracle_admits(model: str, instances: list[tuple[str, int, bool]], name: str) -> bool:
    """Some subset of idle instances destroyed and one start make room for ``name``."""
    used = [(n, s) for n, s, u in instances if u]
    idle = [(n, s) for n, s, u in instances if not u]
    for k in range(len(idle) + 1):
        for gone in combinations(idle, k):
            kept = used + [x for x in idle if x not in gone]
            for start in range(8):
                if oracle_valid(model, [*kept, (name, start)]):
                    return True
    return False


# ---------------------------------------------------------------------------------------------
# Tables.

VALID = [
    # (model, instances): the user guide's examples
    ("A100-80GB", [("1g.10gb", s) for s in range(7)]),  # 7 x 1g: 7 compute, slices 0-6
    ("A100-80GB", [("1g.20gb", s) for s in (0, 2, 4, 6)]),  # 4 x ID 15: 4 compute, 8 slices
    ("A100-80GB", [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]),  # 6+1 = 7
    ("A100-80GB", [("3g.40gb", 0), ("3g.40gb", 4)]),  # 6 compute, 8 slices
    ("A100-80GB", [("4g.40gb", 0), ("3g.40gb", 4)]),  # 4+3 = 7 compute
    ("A100-80GB", [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]),  # 4+2+1 = 7
    ("A100-80GB", [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]),  # 3+2+1 = 6
    ("H200-141GB", [("7g.141gb", 0)]),
    ("A100-40GB", [("1g.5gb+me", 0), ("1g.5gb", 1)]),
]
INVALID = [
    ("A100-80GB", [("4g.40gb", 0), ("4g.40gb", 0)], "overlaps"),  # one start only
    ("A100-80GB", [("1g.10gb", 7)], "cannot start"),  # no 1g at slice 7
    ("A100-80GB", [("2g.20gb", 6)], "cannot start"),
    ("A100-80GB", [("3g.40gb", 2)], "cannot start"),
    ("A100-80GB", [("1g.10gb+me", 0), ("1g.10gb+me", 1)], "more than 1 instances"),
    # 4 x 1g.20gb (4 compute) + nothing left in memory; add 1g.10gb anywhere: overlap
    ("A100-80GB", [*(("1g.20gb", s) for s in (0, 2, 4, 6)), ("1g.10gb", 1)], "overlaps"),
    # 3 x 2g (6 compute, slices 0-5) + 2 x 1g at 6 and... 1g@6 + 1g@6 overlap
    ("A100-80GB", [("3g.40gb", 0), ("4g.40gb", 0)], "overlaps"),
    ("A100-80GB", [("7g.80gb", 0), ("1g.10gb", 0)], "overlaps"),
    ("H100-80GB", [("3g.71gb", 0)], "unknown profile"),  # an H200 name on an H100
    ("T4", [], "not MIG-capable"),
]


@pytest.mark.parametrize(("model", "instances"), VALID)
def test_valid_layouts(model: str, instances: list[tuple[str, int]]) -> None:
    assert mig.valid_layout(model, instances) == ""


@pytest.mark.parametrize(("model", "instances", "reason"), INVALID)
def test_invalid_layouts_name_the_rule(
    model: str, instances: list[tuple[str, int]], reason: str
) -> None:
    assert reason in mig.valid_layout(model, instances)


def test_compute_limit_rules_out_a_full_memory_layout_with_too_much_compute() -> None:
    # 4g@0 (slices 0-3, 4 compute) + 2g@4 (2) + 2g@6 is not a start; 4g@0 + 2g@4 + 1g.20gb@6:
    # memory 4+2+2 = 8 slices, compute 4+2+1 = 7: valid. 3g@0 + 2g@4 + 2g@... cannot exceed 7.
    assert mig.valid_layout("A100-80GB", [("4g.40gb", 0), ("2g.20gb", 4), ("1g.20gb", 6)]) == ""
    # 2 x 3g (6 compute) + 1g: the 1g has no memory slice left (3g@4 covers 4-7): overlap
    assert "overlaps" in mig.valid_layout(
        "A100-80GB", [("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 3)]
    )


def test_profile_tables_follow_the_reference() -> None:
    h200 = {p.name: p for p in mig.PROFILES["H200-141GB"]}
    assert h200["3g.71gb"].mem_mib == 72704 and h200["3g.71gb"].starts == (0, 4)
    assert h200["1g.18gb+me"].media and h200["1g.18gb+me"].max_count == 1
    # milli = compute * 1000 // 7: 1g 142, 2g 285, 3g 428, 4g 571, 7g 1000
    assert [p.milli for p in mig.PROFILES["A100-80GB"]] == [142, 142, 142, 285, 428, 571, 1000]
    assert mig.models_with("3g.40gb") == {"A100-80GB", "H100-80GB"}
    # every table row agrees with the oracle's transcription
    for model, table in ORACLE.items():
        for p in mig.PROFILES[model]:
            c, size, starts, count, me = table[p.name]
            assert (p.compute, p.mem_slices, p.starts, p.max_count, p.media) == (
                c,
                size,
                tuple(starts),
                count,
                me,
            )


def test_placements_and_headroom() -> None:
    # 3g@0 taken (slices 0-3, 3 compute): a 3g fits at 4 only, a 4g nowhere (start 0 only)
    assert mig.placements("A100-80GB", [("3g.40gb", 0)], "3g.40gb") == (4,)
    assert mig.placements("A100-80GB", [("3g.40gb", 0)], "4g.40gb") == ()
    # empty: 7g 1, 4g 1, 3g 2 (starts 0,4), 2g 3 (0,2,4), 1g.20gb 4, 1g 7
    assert mig.headroom("A100-80GB", []) == (1, 1, 2, 3, 4, 7)
    # 3g@0: 7g 0, 4g 0, 3g 1 (@4), 2g 1 (@4; 6 is no start), 1g.20gb 2 (@4, @6), 1g 3 (4,5,6)
    assert mig.headroom("A100-80GB", [("3g.40gb", 0)]) == (0, 0, 1, 1, 2, 3)


def test_reconfigure_keeps_the_4g_possible_and_destroys_only_when_it_must() -> None:
    # Empty GPU, 3g: @0 leaves (0,0,1,1,2,3), @4 leaves (0,1,1,2,2,4) -> loss (1,0,1,1,2,3) vs
    # (1,1,...): @4 loses less (the 4g@0 stays possible).
    plan = mig.reconfigure("A100-80GB", [], "3g.40gb")
    assert plan is not None and plan.create == ("3g.40gb", 4) and plan.destroy == ()
    # 3g@4 used, 1g@0 and 1g@2 idle: a 4g@0 needs slices 0-3 -> both idle 1g go (2 destroyed)
    inst = [("3g.40gb", 4, True), ("1g.10gb", 0, False), ("1g.10gb", 2, False)]
    plan = mig.reconfigure("A100-80GB", inst, "4g.40gb")
    assert plan is not None and sorted(plan.destroy) == [("1g.10gb", 0), ("1g.10gb", 2)]
    assert plan.key[0] == 2
    # same, but the 1g@2 is used: no plan
    inst = [("3g.40gb", 4, True), ("1g.10gb", 0, False), ("1g.10gb", 2, True)]
    assert mig.reconfigure("A100-80GB", inst, "4g.40gb") is None
    # a 1g fits in free slices 1 and 3 with nothing destroyed: free space beats destroying
    plan = mig.reconfigure("A100-80GB", inst, "1g.10gb")
    assert plan is not None and plan.destroy == () and plan.create[1] in (1, 3)
    # an impossible reported layout (two 4g) is never touched, even if all of it is idle
    assert mig.reconfigure("A100-80GB", [("4g.40gb", 0, False)] * 2, "1g.10gb") is None


# ---------------------------------------------------------------------------------------------
# Placement through the scheduler.


def mig_gpu(
    model: str, instances: list[tuple[str, int, bool]], *, dynamic: bool, uuid: str = ""
) -> GpuSpec:
    mem = GPU_MODELS[model].memory_mib
    used = [(n, s) for n, s, u in instances if u]
    profiles = {p.name: p for p in mig.PROFILES[model]}
    return GpuSpec(
        model=model,
        mem_mib=mem,
        uuid=uuid,
        mode=SharingMode.MIG,
        mig=instances,
        mig_dynamic=dynamic,
        used_milli=sum(profiles[n].milli for n, _ in used),
        used_mem=sum(profiles[n].mem_slices * mem // 8 for n, _ in used),
        clients=len(used),
    )


def mig_node(name: str, *gpus: GpuSpec) -> NodeSpec:
    """A node with enough CPU and memory for every test here, and ``gpus``."""
    return NodeSpec(name=name, cpu_milli=8000, mem_mib=1 << 16, gpus=list(gpus))


def scheduler(policy: str = "kallot") -> Scheduler:
    return Scheduler(Framework(presets.PROFILES[policy], policies.builtin_registry()))


def test_static_layout_serves_existing_instances_only() -> None:
    snap = (
        SnapshotBuilder()
        .add(
            mig_node(
                "a",
                mig_gpu("A100-80GB", [("3g.40gb", 0, False), ("3g.40gb", 4, False)], dynamic=False),
            )
        )
        .build()
    )
    tasks = [make_task(f"t{i}").gpu(mig_profile="3g.40gb").created(i).obj() for i in range(3)]
    tasks.append(make_task("s").gpu(mig_profile="1g.10gb").created(9).obj())
    d = scheduler().run_session(snap, tasks, now=0, rng=np.random.default_rng(0))
    assert sorted(p.devices[0].mig.start for p in d.placements if p.devices[0].mig) == [0, 4]
    assert not d.reconfigurations
    msgs = {u.task_id: u.diagnosis.message() for u in d.unschedulable}
    assert set(msgs) == {"t2", "s"} and "no idle MIG instance 3g.40gb" in msgs["t2"]
    # 3g charges 3 * 1000 // 7 = 428 milli and 4 of 8 memory slices: 81920 * 4 // 8 = 40960 MiB
    dev = d.placements[0].devices[0]
    assert (dev.milli, dev.mem_mib, dev.mode) == (428, 40960, SharingMode.MIG)


def test_dynamic_gpu_is_reconfigured_and_the_step_is_in_the_decision() -> None:
    # idle 1g@0 and 1g@2 block a 4g; 3g@4 is used. The 4g request destroys both idle 1g.
    inst = [("3g.40gb", 4, True), ("1g.10gb", 0, False), ("1g.10gb", 2, False)]
    snap = SnapshotBuilder().add(mig_node("a", mig_gpu("A100-80GB", inst, dynamic=True))).build()
    d = scheduler().run_session(
        snap,
        [make_task("big").gpu(mig_profile="4g.40gb").obj()],
        now=0,
        rng=np.random.default_rng(0),
    )
    (rec,) = d.reconfigurations
    assert rec.for_task == "big" and rec.uuid == "GPU-a-0"
    assert sorted((i.profile, i.start) for i in rec.destroy) == [("1g.10gb", 0), ("1g.10gb", 2)]
    assert [(i.profile, i.start) for i in rec.create] == [("4g.40gb", 0)]
    assert d.placements[0].devices[0].mig is not None
    assert d.placements[0].devices[0].mig.start == 0


def test_existing_instance_beats_reconfiguration_and_fuller_gpu_fills_first() -> None:
    # node a: dynamic empty GPU; node b: static GPU with an idle 1g@6 next to a used 3g@0.
    snap = (
        SnapshotBuilder()
        .add(mig_node("a", mig_gpu("A100-80GB", [], dynamic=True)))
        .add(
            mig_node(
                "b",
                mig_gpu("A100-80GB", [("3g.40gb", 0, True), ("1g.10gb", 6, False)], dynamic=False),
            )
        )
        .build()
    )
    for seed in range(4):  # whatever the tie order
        d = scheduler().run_session(
            snap,
            [make_task("t").gpu(mig_profile="1g.10gb").obj()],
            now=0,
            rng=np.random.default_rng(seed),
        )
        assert d.placements[0].node == "b" and not d.reconfigurations


def test_rollback_undoes_a_reconfiguration_bit_for_bit() -> None:
    inst = [("3g.40gb", 4, True), ("1g.10gb", 0, False), ("1g.10gb", 2, False)]
    snap = SnapshotBuilder().add(mig_node("a", mig_gpu("A100-80GB", inst, dynamic=True))).build()
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    keys: tuple[str, ...] = (
        "mig_node",
        "mig_slot",
        "mig_profile",
        "mig_start",
        "mig_used",
        "mig_alive",
    )
    keys += ("gpu_used_milli", "gpu_used_mem", "gpu_clients")
    before = {k: getattr(session.scratch, k).copy() for k in keys}
    names = list(session.scratch.mig_profiles)
    cp = session.statement.checkpoint()
    # 2g@0 destroys the idle 1g@0; 1g.20gb@2 then destroys the idle 1g@2 (3 + 2 + 1 = 6 compute)
    for i, p in enumerate(("2g.20gb", "1g.20gb")):
        assert isinstance(session.place(make_task(f"t{i}").gpu(mig_profile=p).obj()), Placement)
    assert len(session.statement.reconfigurations()) == 2
    assert not session.scratch.mig_alive[: before["mig_node"].size][1:].any()  # both 1g gone
    session.statement.rollback(cp)
    for k, v in before.items():
        got = getattr(session.scratch, k)
        assert got.dtype == v.dtype and np.array_equal(got, v), k
    assert session.scratch.mig_profiles == names
    assert not session.statement.reconfigurations()


# ---------------------------------------------------------------------------------------------
# Properties.

MIG_MODELS = ("A100-80GB", "H200-141GB")
ALL_NAMES = sorted({n for names in NAMES.values() for n in names})


@st.composite
def layout_st(draw, model: str) -> list[tuple[str, int, bool]]:  # type: ignore[no-untyped-def]
    out: list[tuple[str, int, bool]] = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(NAMES[model]))
        start = draw(st.integers(0, 7))
        if oracle_valid(model, [(n, s) for n, s, _ in out] + [(name, start)]):
            out.append((name, start, draw(st.booleans())))
    return out


@st.composite
def cluster_st(draw) -> Snapshot:  # type: ignore[no-untyped-def]
    b = SnapshotBuilder()
    for i in range(draw(st.integers(1, 3))):
        gpus = []
        for j in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["mig", "mig", "mps", "timeslice", "exclusive"]))
            if kind == "mig":
                model = draw(st.sampled_from(MIG_MODELS))
                gpus.append(
                    mig_gpu(
                        model,
                        draw(layout_st(model)),
                        dynamic=draw(st.booleans()),
                        uuid=f"GPU-n{i}-{j}",
                    )
                )
            else:
                mode = {
                    "mps": SharingMode.MPS,
                    "timeslice": SharingMode.TIMESLICE,
                    "exclusive": SharingMode.EXCLUSIVE,
                }[kind]
                gpus.append(
                    GpuSpec(
                        model="A100-80GB",
                        mem_mib=GPU_MODELS["A100-80GB"].memory_mib,
                        uuid=f"GPU-n{i}-{j}",
                        mode=mode,
                        replicas=4,
                    )
                )
        b.add(NodeSpec(name=f"n{i}", cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus))
    return b.build()


@st.composite
def task_st(draw, index: int) -> Task:  # type: ignore[no-untyped-def]
    kind = draw(st.sampled_from(["mig", "mig", "mig", "share", "whole"]))
    isolation = draw(st.sampled_from(list(Isolation)))
    modes = draw(
        st.sampled_from(
            [
                ALL_MODES,
                ALL_MODES,
                frozenset({SharingMode.MIG}),
                frozenset({SharingMode.MPS, SharingMode.MIG}),
                frozenset({SharingMode.MPS, SharingMode.TIMESLICE}),
            ]
        )
    )
    if kind == "mig":
        req = DeviceRequest(
            count=1,
            mig_profile=draw(st.sampled_from(ALL_NAMES)),
            isolation=isolation,
            modes=modes,
            models=draw(st.sampled_from([frozenset(), frozenset({"A100-80GB"})])),
        )
    elif kind == "share":
        req = DeviceRequest(
            count=1,
            milli=draw(st.sampled_from([100, 250, 500])),
            mem_mib=draw(st.sampled_from([0, 3_000, 20_000, 40_000])),
            isolation=isolation,
            modes=modes,
        )
    else:
        req = DeviceRequest(count=1, isolation=isolation, modes=modes)
    return Task(id=f"t{index}", gpu=req, created=float(index))


@dataclass
class Gpu:
    model: str
    mode: SharingMode
    dynamic: bool
    healthy: bool
    milli: int
    mem: int
    clients: int
    cap_milli: int
    cap_mem: int
    max_clients: int
    layout: list[list[object]] = field(default_factory=list)  # [name, start, used]


def books_of(s: Snapshot) -> dict[tuple[int, int], Gpu]:
    out = {}
    for n in range(s.n_nodes):
        for j in range(int(s.gpu_count()[n])):
            mode = SharingMode(int(s.gpu_mode[n, j]))
            rows = [r for r in range(s.mig.node.size) if s.mig.node[r] == n and s.mig.slot[r] == j]
            out[(n, j)] = Gpu(
                model=s.models[int(s.gpu_model[n, j])],
                mode=mode,
                dynamic=bool(s.gpu_mig_dynamic is not None and s.gpu_mig_dynamic[n, j]),
                healthy=bool(s.gpu_healthy[n, j]),
                milli=int(s.gpu_used_milli[n, j]),
                mem=int(s.gpu_used_mem[n, j]),
                clients=int(s.gpu_clients[n, j]),
                cap_milli=int(s.gpu_cap_milli[n, j]),
                cap_mem=int(s.gpu_cap_mem[n, j]),
                max_clients=int(s.gpu_max_clients[n, j]),
                layout=[
                    [
                        s.mig.profiles[int(s.mig.profile[r])],
                        int(s.mig.start[r]),
                        bool(s.mig.used[r]),
                    ]
                    for r in rows
                ],
            )
    return out


# Instance memory (MiB, NVML) of each profile in NAMES order: the oracle's own transcription of
# k8s-apis.md §4, used to pick the MIG instance a share must get.
ORACLE_MIB = {
    "A100-80GB": (9856, 9856, 19968, 19968, 40192, 40192, 80384),
    "H200-141GB": (18432, 18432, 35840, 35840, 72704, 72704, 144384),
}


def oracle_share_profile(model: str, mem_mib: int, milli: int) -> str:
    """The smallest (memory slices, then compute) non-+me profile with instance memory >= the
    share's and compute x 1000 // 7 >= its milli; '' if none."""
    best: tuple[int, int, str] | None = None
    for name, mib in zip(NAMES[model], ORACLE_MIB[model], strict=True):
        c, size, _, _, media = ORACLE[model][name]
        fits = not media and mib >= mem_mib and c * 1000 // 7 >= milli
        if fits and (best is None or (size, c) < best[:2]):
            best = (size, c, name)
    return "" if best is None else best[2]


def share_profile(req: DeviceRequest, gpu: Gpu) -> str:
    """The profile a share takes on ``gpu`` (memory in proportion to compute when not given)."""
    total = GPU_MODELS[gpu.model].memory_mib
    mem = req.mem_mib or req.milli * total // 1000
    return oracle_share_profile(gpu.model, mem, req.milli)


def wants_mig_profile(req: DeviceRequest, gpu: Gpu) -> str:
    """The MIG profile ``req`` needs on ``gpu``: its own, or a share's smallest holder."""
    if req.mig_profile:
        return req.mig_profile
    if req.whole or not req.isolation.allows(SharingMode.MIG):
        return ""
    return share_profile(req, gpu)


def mig_allowed(req: DeviceRequest, gpu: Gpu) -> bool:
    name = wants_mig_profile(req, gpu)
    return (
        gpu.mode is SharingMode.MIG
        and gpu.healthy
        and SharingMode.MIG in req.modes
        and name in ORACLE.get(gpu.model, {})
        and (not req.models or gpu.model in req.models)
    )


def share_slot_fits(req: DeviceRequest, gpu: Gpu) -> bool:
    """A share fits this MPS or time-sliced GPU right now (the oracle's own arithmetic)."""
    mem = req.mem_mib or req.milli * GPU_MODELS[gpu.model].memory_mib // 1000
    return (
        gpu.mode in (SharingMode.MPS, SharingMode.TIMESLICE)
        and gpu.mode in req.modes
        and req.isolation.allows(gpu.mode)
        and gpu.healthy
        and (not req.models or gpu.model in req.models)
        and gpu.cap_milli - gpu.milli >= req.milli
        and gpu.cap_mem - gpu.mem >= mem
        and gpu.clients < gpu.max_clients
    )


def replay(s: Snapshot, tasks: list[Task], d: Decision) -> None:
    by_id = {t.id: t for t in tasks}
    books = books_of(s)
    rows = {s.node_names[n]: n for n in range(s.n_nodes)}
    events: list[Placement | Unschedulable] = [*d.placements, *d.unschedulable]
    for ev in sorted(events, key=lambda e: e.attempt):
        task = by_id[ev.task_id]
        req = task.gpu
        assert req is not None
        if isinstance(ev, Unschedulable):
            # completeness: no mechanism could serve it on any GPU
            if req.mig_profile or req.is_fractional:
                for gpu in books.values():
                    if req.is_fractional:
                        assert not share_slot_fits(req, gpu), (ev, gpu)
                    if not mig_allowed(req, gpu):
                        continue
                    name = wants_mig_profile(req, gpu)
                    inst = [(str(a), int(b), bool(c)) for a, b, c in gpu.layout]  # type: ignore[call-overload]
                    assert not any(n == name and not u for n, _, u in inst), ev
                    if gpu.dynamic:
                        assert not oracle_admits(gpu.model, inst, name), ev
            continue
        for rec in [r for r in d.reconfigurations if r.for_task == ev.task_id]:
            gpu = books[(rows[rec.node], rec.slot)]
            assert gpu.dynamic and gpu.mode is SharingMode.MIG
            for gone in rec.destroy:
                match = [x for x in gpu.layout if x[0] == gone.profile and x[1] == gone.start]
                assert len(match) == 1 and match[0][2] is False, "destroyed a used instance"
                gpu.layout.remove(match[0])
            gpu.layout += [[c.profile, c.start, False] for c in rec.create]
            assert oracle_valid(gpu.model, [(str(a), int(b)) for a, b, _ in gpu.layout])  # type: ignore[call-overload]
        for dev in ev.devices:
            gpu = books[(ev.node_row, dev.slot)]
            # isolation and accepted modes, whatever the request shape
            assert dev.mode in req.modes and req.isolation.allows(dev.mode), (req, dev)
            if req.mig_profile or (req.is_fractional and gpu.mode is SharingMode.MIG):
                # a share on MIG gets the smallest instance that holds its memory and compute
                assert dev.mig is not None and dev.mig.profile == wants_mig_profile(req, gpu)
                assert mig_allowed(req, gpu)
                if not req.mig_profile:
                    i = NAMES[gpu.model].index(dev.mig.profile)
                    total = GPU_MODELS[gpu.model].memory_mib
                    assert ORACLE_MIB[gpu.model][i] >= (req.mem_mib or req.milli * total // 1000)
                    assert ORACLE[gpu.model][dev.mig.profile][0] * 1000 // 7 >= req.milli
                    # charged the instance's slices, not the share
                    assert dev.milli == ORACLE[gpu.model][dev.mig.profile][0] * 1000 // 7
                    assert dev.mem_mib == total * ORACLE[gpu.model][dev.mig.profile][1] // 8
                match = [x for x in gpu.layout if x[0] == dev.mig.profile and x[1] == dev.mig.start]
                assert len(match) == 1 and match[0][2] is False
                match[0][2] = True
            else:
                assert gpu.mode is not SharingMode.MIG and dev.mig is None
                if req.whole:
                    assert dev.mode is SharingMode.EXCLUSIVE and gpu.clients == 0
                else:
                    assert dev.mode is gpu.mode
            gpu.milli += dev.milli
            gpu.mem += dev.mem_mib
            gpu.clients += 1
            assert gpu.milli <= gpu.cap_milli and gpu.mem <= gpu.cap_mem
            assert gpu.clients <= gpu.max_clients
    for gpu in books.values():
        if gpu.mode is SharingMode.MIG:
            assert oracle_valid(gpu.model, [(str(a), int(b)) for a, b, _ in gpu.layout])  # type: ignore[call-overload]


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MIG_MODELS), data=st.data())
def test_reconfigure_agrees_with_the_oracle(model: str, data: st.DataObject) -> None:
    inst = data.draw(layout_st(model))
    name = data.draw(st.sampled_from(NAMES[model]))
    plan = mig.reconfigure(model, inst, name)
    assert (plan is not None) == oracle_admits(model, inst, name)
    assert mig.valid_layout(model, [(n, s) for n, s, _ in inst]) == ""
    if plan is not None:
        used = {(n, s) for n, s, u in inst if u}
        assert not used & set(plan.destroy)
        after = [(n, s) for n, s, _ in inst if (n, s) not in plan.destroy] + [plan.create]
        assert oracle_valid(model, after)
        # no plan that destroys fewer instances exists (the oracle tries the smaller subsets)
        idle = [(n, s) for n, s, u in inst if not u]
        kept_used = [(n, s) for n, s, u in inst if u]
        for gone in combinations(idle, len(plan.destroy) - 1) if plan.destroy else ():
            kept = kept_used + [x for x in idle if x not in gone]
            assert not any(oracle_valid(model, [*kept, (name, st_)]) for st_ in range(8))


@st.composite
def dynamic_cluster_st(draw) -> Snapshot:  # type: ignore[no-untyped-def]
    """Dynamic MIG GPUs only, mostly idle instances: reconfigurations that destroy are common."""
    b = SnapshotBuilder()
    for i in range(draw(st.integers(1, 2))):
        gpus = []
        for j in range(draw(st.integers(1, 2))):
            model = draw(st.sampled_from(MIG_MODELS))
            layout: list[tuple[str, int, bool]] = []
            for _ in range(12):  # dense: most slices taken, most instances idle
                name = draw(st.sampled_from(NAMES[model]))
                start = draw(st.sampled_from(ORACLE[model][name][2]))
                if oracle_valid(model, [(n, s) for n, s, _ in layout] + [(name, start)]):
                    layout.append((name, start, draw(st.integers(0, 3)) == 0))
            gpus.append(mig_gpu(model, layout, dynamic=True, uuid=f"GPU-n{i}-{j}"))
        b.add(NodeSpec(name=f"n{i}", cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus))
    return b.build()


@st.composite
def mig_task_st(draw, index: int) -> Task:  # type: ignore[no-untyped-def]
    # mostly large profiles: they need idle instances destroyed on a dense layout
    model = draw(st.sampled_from(MIG_MODELS))
    name = NAMES[model][draw(st.sampled_from([2, 3, 4, 4, 5, 6]))]
    return Task(id=f"m{index}", gpu=DeviceRequest(mig_profile=name), created=float(index))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=st.one_of(cluster_st(), dynamic_cluster_st()), data=st.data())
def test_rollback_is_bit_exact_after_any_mig_placements(
    snap: Snapshot, data: st.DataObject
) -> None:
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    first = [data.draw(task_st(i)) for i in range(data.draw(st.integers(0, 3)))]
    for t in first:
        session.place(t)
    x = session.scratch
    keys = [
        k
        for k in Scratch.__dataclass_fields__
        if k not in ("node_version", "changes", "last_touch", "mig_profiles", "pod_log", "_since")
    ]
    before = {k: getattr(x, k).copy() for k in keys}
    names = list(x.mig_profiles)
    log = list(x.pod_log)
    cp = session.statement.checkpoint()
    for i in range(data.draw(st.integers(1, 6))):
        maker = data.draw(st.sampled_from([task_st, mig_task_st, mig_task_st]))
        session.place(data.draw(maker(10 + i)))
    session.statement.rollback(cp)
    for k, v in before.items():
        got = getattr(x, k)
        assert got.dtype == v.dtype and np.array_equal(got, v), k
    assert x.mig_profiles == names
    assert x.pod_log == log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snap=st.one_of(cluster_st(), dynamic_cluster_st()),
    data=st.data(),
    policy=st.sampled_from(["kallot", "first-fit", "fgd"]),
)
def test_mig_and_isolation_properties(snap: Snapshot, data: st.DataObject, policy: str) -> None:
    makers = st.sampled_from([task_st, task_st, mig_task_st])
    tasks = [data.draw(data.draw(makers)(i)) for i in range(data.draw(st.integers(1, 8)))]
    d = scheduler(policy).run_session(snap, tasks, now=0, rng=np.random.default_rng(0))
    assert len(d.placements) + len(d.unschedulable) == len(tasks)
    replay(snap, tasks, d)


def test_the_mig_chooser_is_the_one_the_profile_declares() -> None:
    # MigFit among the filters is not enough: the profile names its MIG chooser (Profile.mig).
    # Undeclared, a MIG request fits nowhere; a declared chooser must be one of the filters.
    import dataclasses

    from kallot.core.errors import ConfigError

    inst = [("3g.40gb", 4, False)]
    gpu = mig_gpu("A100-80GB", inst, dynamic=False)
    snap = SnapshotBuilder().add(mig_node("a", gpu)).build()
    task = make_task("t").gpu(mig_profile="3g.40gb").obj()
    declared = presets.PROFILES["first-fit"]
    assert "MigFit" in declared.filter and declared.mig == "MigFit"
    for prof, placed in ((declared, 1), (dataclasses.replace(declared, mig=""), 0)):
        fw = Framework(prof, policies.builtin_registry())
        d = Scheduler(fw).run_session(snap, [task], now=0, rng=np.random.default_rng(0))
        assert len(d.placements) == placed
    outside = dataclasses.replace(declared, mig="NodeSelector", filter=("DeviceFit",))
    with pytest.raises(ConfigError, match=r"profile\.mig"):
        Framework(outside, policies.builtin_registry())
