"""Advertised IDs, record matching and grants: pure tables."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.config.inventory import NodeInventory
from kallot.node.allocate import (
    RESOURCE_GPU,
    RESOURCE_MILLI,
    AllocationError,
    PodRecord,
    advertised,
    find_record,
    grant,
    physical,
    pod_footprint,
    preferred,
    record_footprint,
    request_footprint,
)
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend
from kallot.node.k8s import pod_milli

DATA = Path(__file__).parent / "data"


def load(name: str) -> NodeInventory:
    b = FakeBackend.from_file(DATA / name)
    return build_inventory(b.raw(), b.sharing())


def rec(*devices: RecordDevice, node: str = "n") -> DeviceRecord:
    return DeviceRecord(node=node, devices=devices)


def dev(inv: NodeInventory, slot: int, milli: int, mem: int, mode: str) -> RecordDevice:
    return RecordDevice.model_validate(
        {"index": slot, "uuid": inv.devices[slot].uuid, "milli": milli, "memMiB": mem, "mode": mode}
    )


def pod(name: str, record: DeviceRecord | None, **kw: object) -> PodRecord:
    return PodRecord(namespace="ns", name=name, uid=name, record=record, **kw)  # type: ignore[arg-type]


def test_advertised_counts_per_resource() -> None:
    pcie = load("pcie-l40s-8.yaml")
    ads = advertised(pcie)
    assert len(ads[RESOURCE_GPU]) == 8
    # 6 MPS GPUs x 1000 + 2 time-sliced GPUs x 1000 x oversubscription 2.
    per_gpu = Counter(a.uuid for a in ads[RESOURCE_MILLI])
    assert [per_gpu[d.uuid] for d in pcie.devices] == [1000] * 6 + [2000] * 2
    assert max(len(a.id) for a in ads[RESOURCE_MILLI]) <= 63
    mig = load("mig-a100-mixed.yaml")
    ads = advertised(mig, unhealthy={mig.devices[0].uuid})
    assert [a.id for a in ads[RESOURCE_GPU]] == [mig.devices[1].uuid]  # MIG GPU: not whole
    # No GPU in a shared mode, but each MIG instance's compute as milli-GPUs (for a share the
    # scheduler places on it), on the instance's own IDs: 3g 3x1000//7, 2g 285, 1g 142.
    per_instance = Counter(a.uuid for a in ads[RESOURCE_MILLI])
    assert per_instance == {
        m.uuid: n for m, n in zip(mig.devices[0].mig, (428, 285, 142), strict=True)
    }
    assert ads[RESOURCE_MILLI][0].id == f"{mig.devices[0].mig[0].uuid}::0"
    assert max(len(a.id) for a in ads[RESOURCE_MILLI]) <= 63
    assert not any(a.healthy for a in ads[RESOURCE_MILLI])  # GPU 0 is unhealthy
    # The parent GPU's health carries to its MIG instances.
    assert [a.healthy for a in ads["nvidia.com/mig-3g.40gb"]] == [False]


def test_footprints() -> None:
    inv = load("hgx-h100-8.yaml")
    u0, u1 = inv.devices[0].uuid, inv.devices[1].uuid
    assert request_footprint([u0, f"{u1}::3", f"{u1}::9"]) == Counter({u0: 1, u1: 2})
    r = rec(dev(inv, 0, 1000, 81559, "exclusive"), dev(inv, 1, 300, 100, "mps"))
    assert record_footprint(RESOURCE_GPU, r, inv) == Counter({u0: 1})
    assert record_footprint(RESOURCE_MILLI, r, inv) == Counter({u1: 300})
    assert record_footprint("nvidia.com/mig-1g.10gb", r, inv) == Counter()


def test_identical_records_take_the_oldest_waiting_pod() -> None:
    inv = load("hgx-h100-8.yaml")
    r = rec(dev(inv, 0, 250, 1000, "mps"))
    ids = [f"{inv.devices[0].uuid}::{k}" for k in range(250)]
    pods = [
        pod("done", r, allocated=True, bind_time=1),
        pod("late", r, bind_time=9),
        pod("early", r, bind_time=5),
    ]
    assert find_record(RESOURCE_MILLI, ids, pods, node="n", inv=inv).name == "early"


def test_different_records_with_the_same_footprint_are_ambiguous() -> None:
    inv = load("hgx-h100-8.yaml")
    a = rec(dev(inv, 0, 250, 1000, "mps"))
    b = rec(dev(inv, 0, 250, 2000, "mps"))  # same compute, other memory limit
    ids = [f"{inv.devices[0].uuid}::{k}" for k in range(250)]
    with pytest.raises(AllocationError, match="several pods with different devices"):
        find_record(RESOURCE_MILLI, ids, [pod("a", a), pod("b", b)], node="n", inv=inv)


def test_one_container_of_a_multi_container_pod() -> None:
    inv = load("hgx-h100-8.yaml")
    r = rec(dev(inv, 0, 1000, 81559, "exclusive"), dev(inv, 1, 1000, 81559, "exclusive"))
    p = find_record(RESOURCE_GPU, [inv.devices[1].uuid], [pod("a", r)], node="n", inv=inv)
    assert p.name == "a"
    g = grant(RESOURCE_GPU, p, [inv.devices[1].uuid], inv)
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == inv.devices[1].uuid  # only this container's GPU


def test_containment_in_two_different_records_is_ambiguous() -> None:
    inv = load("hgx-h100-8.yaml")
    a = rec(dev(inv, 0, 500, 1000, "mps"))
    b = rec(dev(inv, 0, 300, 1000, "mps"))
    ids = [f"{inv.devices[0].uuid}::{k}" for k in range(250)]
    with pytest.raises(AllocationError, match="refusing to guess"):
        find_record(RESOURCE_MILLI, ids, [pod("a", a), pod("b", b)], node="n", inv=inv)


def test_an_allocated_pod_matches_only_while_nobody_waits() -> None:
    inv = load("hgx-h100-8.yaml")
    running = pod("running", rec(dev(inv, 0, 250, 1000, "mps")), allocated=True)
    waiting = pod("waiting", rec(dev(inv, 1, 250, 1000, "mps")))
    ids = [f"{inv.devices[0].uuid}::{k}" for k in range(250)]
    # Re-admission of the running pod: its own record.
    assert find_record(RESOURCE_MILLI, ids, [running], node="n", inv=inv).name == "running"
    # But while another pod waits, GPU 0 units are not handed out on the running pod's record.
    with pytest.raises(AllocationError, match="no device record"):
        find_record(RESOURCE_MILLI, ids, [running, waiting], node="n", inv=inv)
    # And the kubelet is steered to the waiting pod's GPU.
    avail = ids + [f"{inv.devices[1].uuid}::{k}" for k in range(1000)]
    got = preferred(RESOURCE_MILLI, avail, [], 250, [running, waiting], node="n", inv=inv)
    assert {g.split("::")[0] for g in got} == {inv.devices[1].uuid}


def test_grant_for_a_mig_instance_and_time_slicing() -> None:
    mig = load("mig-a100-mixed.yaml")
    r = rec(
        RecordDevice(
            index=0,
            uuid=mig.devices[0].uuid,
            milli=1000,
            mem_mib=9856,
            mode="mig",
            mig=RecordMig(profile="1g.10gb", start=6),
        )
    )
    mig_uuid = mig.devices[0].mig[2].uuid
    g = grant("nvidia.com/mig-1g.10gb", pod("m", r), [mig_uuid], mig)
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": mig_uuid}
    assert g.cdi_devices == (f"nvidia.com/gpu={mig_uuid}",)
    pcie = load("pcie-l40s-8.yaml")
    ts = rec(dev(pcie, 7, 500, 20000, "time-slicing"))
    g = grant(RESOURCE_MILLI, pod("t", ts), [f"{pcie.devices[7].uuid}::1"], pcie)
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": pcie.devices[7].uuid}  # no MPS limits


def test_mps_grant_with_pipe_directory() -> None:
    inv = load("hgx-h100-8.yaml")
    r = rec(dev(inv, 3, 333, 10000, "mps"))
    g = grant(
        RESOURCE_MILLI, pod("p", r), [f"{inv.devices[3].uuid}::0"], inv, mps_pipe_dir="/run/mps"
    )
    assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"  # 33.3% rounded up
    assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"
    assert g.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    assert g.mounts == (("/run/mps", "/run/mps", False),)


def test_preferred_honours_must_include_and_falls_back() -> None:
    pcie = load("pcie-l40s-8.yaml")
    ids = [d.uuid for d in pcie.devices]
    # No record: topology ranking; GPU 5 must be in: its PCIe-switch sibling 4 joins it.
    got = preferred(RESOURCE_GPU, ids, [ids[5]], 2, [], node="n", inv=pcie)
    assert sorted(got) == sorted([ids[4], ids[5]])
    # Three with 5 included stay on its socket (NODE, not SYS).
    got = preferred(RESOURCE_GPU, ids, [ids[5]], 3, [], node="n", inv=pcie)
    assert {pcie.devices[ids.index(u)].numa for u in got} == {1}
    inv = load("hgx-h100-8.yaml")
    # Milli without a record: all units from one GPU.
    avail = [f"{inv.devices[2].uuid}::{k}" for k in range(10)] + [
        f"{inv.devices[4].uuid}::{k}" for k in range(50)
    ]
    got = preferred(RESOURCE_MILLI, avail, [], 20, [], node="n", inv=inv)
    assert {g.split("::")[0] for g in got} == {inv.devices[4].uuid} and len(got) == 20


# --- A share placed on a MIG instance (core.fit: a share that accepts MIG may run on the smallest
# instance that holds it; the record says mode "mig" with the instance, milli = its compute).


def on_mig(inv: NodeInventory, profile: str, start: int, *, milli: int, mem: int) -> RecordDevice:
    return RecordDevice(
        index=0,
        uuid=inv.devices[0].uuid,
        milli=milli,
        mem_mib=mem,
        mode="mig",
        mig=RecordMig(profile=profile, start=start),
    )


def instance_units(inv: NodeInventory, k: int, n: int) -> list[str]:
    """The first ``n`` milli-GPU IDs of GPU 0's ``k``-th MIG instance."""
    return [f"{inv.devices[0].mig[k].uuid}::{u}" for u in range(n)]


@pytest.mark.parametrize(
    ("profile", "start", "charged", "asked", "units"),
    [
        # 3 of 7 compute slices: 3 x 1000 // 7 = 428 charged; the kubelet asks the pod's 100.
        ("3g.40gb", 0, 428, 100, 100),
        # 2g: 2 x 1000 // 7 = 285; a 285-milli share takes all of it.
        ("2g.20gb", 4, 285, 285, 285),
        # 1g: 142; the footprint never exceeds what the record charges.
        ("1g.10gb", 6, 142, 500, 142),
    ],
)
def test_share_on_a_mig_instance_footprint(
    profile: str, start: int, charged: int, asked: int, units: int
) -> None:
    inv = load("mig-a100-mixed.yaml")
    k = [m.start for m in inv.devices[0].mig].index(start)
    mig_uuid = inv.devices[0].mig[k].uuid
    r = rec(on_mig(inv, profile, start, milli=charged, mem=10240))
    # Under kallot.io/gpu-milli: the instance's own IDs, as many as the pod asks.
    assert record_footprint(RESOURCE_MILLI, r, inv, share_milli=asked) == Counter({mig_uuid: units})
    assert pod_footprint(RESOURCE_MILLI, pod("s", r, milli=asked), inv) == {mig_uuid: units}
    assert request_footprint(instance_units(inv, k, units)) == Counter({mig_uuid: units})
    # A pod asking nvidia.com/mig-<profile> (no milli): the instance counts only as itself;
    # a share on it does not count there.
    assert record_footprint(RESOURCE_MILLI, r, inv) == Counter()
    assert record_footprint(f"nvidia.com/mig-{profile}", r, inv) == Counter({mig_uuid: 1})
    mig_res = f"nvidia.com/mig-{profile}"
    assert record_footprint(mig_res, r, inv, share_milli=asked) == Counter()
    # Never the parent GPU.
    assert inv.devices[0].uuid not in record_footprint(RESOURCE_MILLI, r, inv, share_milli=asked)


def test_share_on_a_mig_instance_is_found_steered_and_granted_its_mig_uuid() -> None:
    inv = load("mig-a100-mixed.yaml")
    gpu0 = inv.devices[0]
    # Two shares on two instances of the same GPU, 100 milli each: told apart by the instance.
    big = pod("big", rec(on_mig(inv, "3g.40gb", 0, milli=428, mem=40960)), milli=100, bind_time=1)
    mid = pod("mid", rec(on_mig(inv, "2g.20gb", 4, milli=285, mem=20480)), milli=100, bind_time=2)
    # A MIG-request pod on the 1g instance is no candidate for milli-GPUs.
    whole_mig = pod("m", rec(on_mig(inv, "1g.10gb", 6, milli=142, mem=10240)), bind_time=0)
    pods = [whole_mig, big, mid]
    ids = instance_units(inv, 1, 100)
    assert find_record(RESOURCE_MILLI, ids, pods, node="n", inv=inv).name == "mid"
    assert (
        find_record(RESOURCE_MILLI, instance_units(inv, 0, 100), pods, node="n", inv=inv).name
        == "big"
    )
    with pytest.raises(AllocationError, match="no device record"):
        find_record(RESOURCE_MILLI, instance_units(inv, 2, 100), pods, node="n", inv=inv)
    # GetPreferredAllocation steers the kubelet to the oldest waiting share's instance.
    avail = [a.id for a in advertised(inv)[RESOURCE_MILLI]]
    got = preferred(RESOURCE_MILLI, avail, [], 100, pods, node="n", inv=inv)
    assert {physical(g) for g in got} == {gpu0.mig[0].uuid} and len(got) == 100
    # Allocate hands out the MIG instance, never the parent GPU, and no MPS limits.
    g = grant(RESOURCE_MILLI, mid, ids, inv)
    assert g.envs == {"NVIDIA_VISIBLE_DEVICES": gpu0.mig[1].uuid}
    assert g.cdi_devices == (f"nvidia.com/gpu={gpu0.mig[1].uuid}",)


def test_share_on_a_missing_mig_instance_is_refused_naming_it() -> None:
    inv = load("mig-a100-mixed.yaml")
    # The node has 3g@0, 2g@4, 1g@6: no 3g.40gb at start 4.
    p = pod("ghost", rec(on_mig(inv, "3g.40gb", 4, milli=428, mem=40960)), milli=100)
    # Keyed so that no advertised ID matches it.
    assert pod_footprint(RESOURCE_MILLI, p, inv) == {f"{inv.devices[0].uuid}@3g.40gb@4": 100}
    with pytest.raises(AllocationError) as info:
        find_record(RESOURCE_MILLI, instance_units(inv, 0, 100), [p], node="n", inv=inv)
    msg = str(info.value)
    assert "pod ns/ghost names MIG instance 3g.40gb at start 4 of GPU 0" in msg
    assert inv.devices[0].uuid in msg and "does not have" in msg
    assert "3g.40gb@0 of GPU 0, 2g.20gb@4 of GPU 0, 1g.10gb@6 of GPU 0" in msg


def test_physical_strips_only_the_unit_number() -> None:
    assert physical("GPU-a::12") == "GPU-a"
    assert physical("MIG-b::0") == "MIG-b"
    assert physical("GPU-a::mig4") == "GPU-a::mig4"  # an instance NVML gave no UUID
    assert physical("GPU-a::mig4::3") == "GPU-a::mig4"
    assert physical("GPU-a") == "GPU-a"


def test_pod_milli_sums_as_the_scheduler_does() -> None:
    def c(milli: object | None, **kw: object) -> dict[str, object]:
        limits = {} if milli is None else {RESOURCE_MILLI: milli}
        return {"name": "c", "resources": {"limits": limits}, **kw}

    assert pod_milli({"spec": {"containers": [c("250")]}}) == 250
    assert pod_milli({"spec": {"containers": [c("100"), c(None), c("1k")]}}) == 1100
    # A sidecar runs next to the app containers; a plain init container only before them.
    sidecar = c("50", restartPolicy="Always")
    assert pod_milli({"spec": {"containers": [c("100")], "initContainers": [sidecar]}}) == 150
    assert pod_milli({"spec": {"containers": [c("100")], "initContainers": [c("300")]}}) == 300
    assert pod_milli({"spec": {"containers": [{"name": "x"}]}}) == 0
    assert pod_milli({"spec": {"containers": [c("junk")]}}) == 0
