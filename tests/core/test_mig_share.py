"""The core chooses the mechanism for a share that accepts MIG (core.plugins.mig_fit,
fit.option_key): a MIG instance (idle or created) or an MPS / time-sliced share slot, by
(opens a GPU, waste in GPU-equivalents, fraction left after placing). Arithmetic in comments.
The brute-force oracle properties are in test_mig.py (test_mig_and_isolation_properties)."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.config import presets
from kallot.core import fit, mig, policies
from kallot.core.decision import Decision
from kallot.core.framework.runner import Framework
from kallot.core.resources import GPU_MODELS, Isolation, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task

A100 = "A100-80GB"
H100 = "H100-80GB"
A100_MEM = GPU_MODELS[A100].memory_mib  # 81920
H100_MEM = GPU_MODELS[H100].memory_mib  # 81559
BOTH = frozenset({SharingMode.MPS, SharingMode.MIG})


@pytest.mark.parametrize(
    ("model", "mem", "milli", "want"),
    [
        # H100: 1g.20gb/2g.20gb hold 20096 MiB < 23592 -> 3g.40gb (40448)
        (H100, 23592, 100, "3g.40gb"),
        # 10 GiB = 10240 > 9984 (1g.10gb) -> 1g.20gb (2 slices, 1 compute, 142 milli)
        (H100, 10240, 100, "1g.20gb"),
        # 3 GiB, 200 milli: 1g 142 < 200 -> 2g.20gb (2 slices, 285 milli)
        (H100, 3072, 200, "2g.20gb"),
        # 500 milli: 3g 428 < 500 -> 4g.40gb (571)
        (A100, 1000, 500, "4g.40gb"),
        # 39132 MiB (13B fp16) <= 40192 (A100 3g.40gb)
        (A100, 39132, 50, "3g.40gb"),
        # 92 GiB on an H200: 3g/4g.71gb hold 72704 -> 7g.141gb
        ("H200-141GB", 94406, 300, "7g.141gb"),
        # over the largest instance, or a model without MIG
        (H100, 90_000, 10, ""),
        ("L40S", 1000, 10, ""),
    ],
)
def test_profile_for_share_is_the_smallest_holder(
    model: str, mem: int, milli: int, want: str
) -> None:
    p = mig.profile_for_share(model, mem, milli)
    assert (p.name if p else "") == want
    if p is not None:
        assert not p.media and p.mem_mib >= mem and p.milli >= milli


def test_profile_for_request_follows_memory_for_and_isolation() -> None:
    # no memory given: in proportion to compute, 250 * 81920 // 1000 = 20480 > 19968 -> 3g.40gb
    req = DeviceRequest(milli=250)
    assert fit.mig_profile_for(req, A100, A100_MEM) == "3g.40gb"
    # modes without MIG, whole GPUs: never a MIG instance
    assert (
        fit.mig_profile_for(
            DeviceRequest(milli=250, modes=frozenset({SharingMode.MPS})), A100, A100_MEM
        )
        == ""
    )
    assert fit.mig_profile_for(DeviceRequest(count=1), A100, A100_MEM) == ""
    # untrusted shares accept MIG (and nothing else a share can use)
    u = DeviceRequest(milli=100, mem_mib=3000, isolation=Isolation.UNTRUSTED)
    assert fit.may_use_mig(u) and fit.mig_profile_for(u, A100, A100_MEM) == "1g.10gb"
    assert not u.accepts(SharingMode.MPS) and not u.accepts(SharingMode.TIMESLICE)


def test_option_key_arithmetic() -> None:
    # a 23592 MiB / 100 milli share in a 3g.40gb of an H100: charged max(428/1000, 4/8) = 0.5,
    # needs max(0.1, 23592/81559 = 0.289263) -> waste 0.210737
    need = max(0.1, 23592 / H100_MEM)
    k = fit.option_key(opens_gpu=False, charged=0.5, needed=need, left_after=0.0)
    assert k == (0, 0.210737, 0.0)
    # an MPS share wastes nothing; opening a GPU outranks any waste
    assert fit.option_key(opens_gpu=True, charged=0, needed=0, left_after=0.7) > k
    assert fit.option_key(opens_gpu=False, charged=0, needed=0, left_after=0.9) < k


def mig_gpu(model: str, instances: list[tuple[str, int, bool]], *, dynamic: bool) -> GpuSpec:
    """A MIG GPU whose used instances are charged as fit.mig_assignment charges them."""
    mem = GPU_MODELS[model].memory_mib
    profiles = {p.name: p for p in mig.PROFILES[model]}
    used = [profiles[n] for n, _, u in instances if u]
    return GpuSpec(
        model=model,
        mem_mib=mem,
        mode=SharingMode.MIG,
        mig=instances,
        mig_dynamic=dynamic,
        used_milli=sum(p.milli for p in used),
        used_mem=sum(p.mem_slices * mem // 8 for p in used),
        clients=len(used),
    )


def node(name: str, gpus: list[GpuSpec]) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus)


def mps(used_milli: int = 0, used_mem: int = 0, clients: int = 0) -> GpuSpec:
    return GpuSpec(
        model=A100,
        mem_mib=A100_MEM,
        mode=SharingMode.MPS,
        used_milli=used_milli,
        used_mem=used_mem,
        clients=clients,
    )


def run(snap: Snapshot, *reqs: DeviceRequest, seed: int = 0) -> Decision:
    tasks = [Task(id=f"t{i}", gpu=r, created=float(i)) for i, r in enumerate(reqs)]
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    return Scheduler(fw).run_session(snap, tasks, now=0, rng=np.random.default_rng(seed))


def test_untrusted_share_gets_an_idle_static_instance_charged_its_slices() -> None:
    # MPS GPU with room, static MIG GPU with an idle 1g.10gb: untrusted -> MIG only
    snap = (
        SnapshotBuilder()
        .add(node("m", [mps()]))
        .add(node("g", [mig_gpu(A100, [("1g.10gb", 0, False)], dynamic=False)]))
        .build()
    )
    d = run(snap, DeviceRequest(milli=100, mem_mib=3000, isolation=Isolation.UNTRUSTED))
    (p,) = d.placements
    dev = p.devices[0]
    assert p.node == "g" and dev.mode is SharingMode.MIG and dev.mig is not None
    assert (dev.mig.profile, dev.mig.start) == ("1g.10gb", 0) and not d.reconfigurations
    # charged the instance: 1 * 1000 // 7 = 142 milli, 1 slice = 81920 // 8 = 10240 MiB
    assert (dev.milli, dev.mem_mib) == (142, 10240)


def test_share_fills_a_gpu_in_use_before_opening_one_whatever_the_mechanism() -> None:
    # node m: an empty MPS GPU; node g: a MIG GPU with a used 3g@4 (4 free slices, dynamic).
    # 20000 MiB / 100 milli, no isolation need: MPS opens a GPU (key (1, 0, ...)); a new 3g.40gb
    # on g opens none: (0, max(428/1000, 4/8) - max(0.1, 20000/81920 = 0.244141) = 0.255859, 0)
    snap = (
        SnapshotBuilder()
        .add(node("m", [mps()]))
        .add(node("g", [mig_gpu(A100, [("3g.40gb", 4, True)], dynamic=True)]))
        .build()
    )
    for seed in range(4):
        d = run(snap, DeviceRequest(milli=100, mem_mib=20_000, modes=BOTH), seed=seed)
        (p,) = d.placements
        assert p.node == "g" and p.devices[0].mig is not None
        # 20000 > 19968 (1g.20gb and 2g.20gb on an A100-80GB) -> 3g.40gb, at 0 next to the 3g@4
        assert (p.devices[0].mig.profile, p.devices[0].mig.start) == ("3g.40gb", 0)
        (rec,) = d.reconfigurations
        assert rec.for_task == "t0"


def test_mps_share_wins_when_no_gpu_is_opened_and_it_wastes_less() -> None:
    # node m: an MPS GPU in use (1 client); node g: the same MIG GPU as above. 19000 MiB fits a
    # 1g.20gb (19968): max(142/1000, 2/8) - max(0.1, 19000/81920 = 0.231934) = 0.018066 waste.
    # Neither opens a GPU; MPS wastes 0 < 0.018 -> MPS, on every seed
    snap = (
        SnapshotBuilder()
        .add(node("m", [mps(used_milli=100, used_mem=10_000, clients=1)]))
        .add(node("g", [mig_gpu(A100, [("3g.40gb", 4, True)], dynamic=True)]))
        .build()
    )
    for seed in range(4):
        (p,) = run(snap, DeviceRequest(milli=100, mem_mib=19_000, modes=BOTH), seed=seed).placements
        assert p.node == "m" and p.devices[0].mode is SharingMode.MPS and p.devices[0].mig is None
        assert (p.devices[0].milli, p.devices[0].mem_mib) == (100, 19_000)


def test_share_without_mig_among_its_modes_never_lands_on_mig() -> None:
    snap = (
        SnapshotBuilder()
        .add(node("g", [mig_gpu(A100, [("1g.10gb", 0, False)], dynamic=True)]))
        .build()
    )
    d = run(snap, DeviceRequest(milli=100, mem_mib=3000, modes=frozenset({SharingMode.MPS})))
    assert not d.placements and len(d.unschedulable) == 1


def test_unschedulable_share_is_explained() -> None:
    # static layout with only a used 7g: nothing for an untrusted share
    snap = (
        SnapshotBuilder()
        .add(node("g", [mig_gpu(A100, [("7g.80gb", 0, True)], dynamic=False)]))
        .build()
    )
    d = run(snap, DeviceRequest(milli=100, mem_mib=3000, isolation=Isolation.UNTRUSTED))
    (u,) = d.unschedulable
    assert "no MIG instance that holds it" in u.diagnosis.message()


def test_shares_without_mig_gpus_are_scored_as_before() -> None:
    # no MIG GPU in the snapshot: MigFit does not serve the share (the profile's score plugins
    # do, as for openb); the tightest-fit GPU takes it
    snap = (
        SnapshotBuilder()
        .add(node("m", [mps(), mps(used_milli=600, used_mem=40_000, clients=1)]))
        .build()
    )
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    assert fw.mig is not None
    d = run(snap, DeviceRequest(milli=300))
    (p,) = d.placements
    assert p.devices[0].mode is SharingMode.MPS


LAYOUTS: tuple[list[tuple[str, int, bool]], ...] = (
    [],
    [("3g.40gb", 4, True)],
    [("3g.40gb", 0, True), ("3g.40gb", 4, False)],
    [("1g.10gb", 0, True), ("2g.20gb", 2, False), ("3g.40gb", 4, True)],
    [("4g.40gb", 0, False), ("3g.40gb", 4, True)],
    [("7g.80gb", 0, True)],
)


@pytest.mark.parametrize("seed", range(12))
def test_packed_primary_key_agrees_with_the_full_option_key(seed: int) -> None:
    # The score ranks nodes by a vectorized, packed key; choose_mig by the full key per node.
    # On random mixed clusters, every node's packed key is the packed form of its full key's
    # first four terms (opens, waste, left after, mechanism), and no node is feasible in one and
    # not the other.
    from kallot.core.plugins.mig_fit import _NONE, MigFit
    from kallot.core.session.session import Session

    rng = np.random.default_rng(seed)
    b = SnapshotBuilder()
    for i in range(4):
        gpus = []
        for _ in range(2):
            if rng.random() < 0.5:
                layout = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
                gpus.append(mig_gpu(A100, list(layout), dynamic=bool(rng.random() < 0.5)))
            else:
                used = int(rng.integers(0, 4))
                gpus.append(mps(used * 200, used * 18_000, used))
        b.add(node(f"n{i}", gpus))
    snap = b.build()
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(seed), jobs={})
    plugin = fw.mig
    assert isinstance(plugin, MigFit)
    for milli, mem, iso in [(100, 3000, Isolation.NONE), (200, 30_000, Isolation.MEMORY)]:
        req = DeviceRequest(milli=milli, mem_mib=mem, modes=BOTH, isolation=iso)
        cycle = session.cycle()
        packed = plugin._primary(cycle, req)
        for n in range(snap.n_nodes):
            o = plugin.best_option(cycle, req, n)
            if o is None:
                assert packed[n] == _NONE
                continue
            opens, waste, left, mech = o.key[:4]
            want = (
                int(opens) * 10**15
                + round(float(waste) * 1e6) * 10**8
                + round(float(left) * 1e6) * 10
                + int(mech)
            )
            assert packed[n] == want, (n, o.key)
