"""The agent serves a device record only where the scheduler could have written it, and hands a
device out once across its resource names (docs/security.md, "What the node agent trusts").

Attacks from a tenant who may create pods in one namespace: a pod created with ``spec.nodeName``
set and a forged ``kallot.io/devices`` record. Admission refuses such a write; these checks are
the agent's own, independent of admission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kallot.config import device_record
from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.config.inventory import NodeInventory
from kallot.config.record_trust import pod_gpu_requests
from kallot.node.allocate import (
    RESOURCE_GPU,
    RESOURCE_MILLI,
    AllocationError,
    PodRecord,
    find_record,
    instance_id,
)
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend
from kallot.node.k8s import pod_record

DATA = Path(__file__).parent / "data"


def load(name: str) -> NodeInventory:
    b = FakeBackend.from_file(DATA / name)
    return build_inventory(b.raw(), b.sharing())


def whole(inv: NodeInventory, *slots: int) -> DeviceRecord:
    return DeviceRecord(
        node="n",
        devices=tuple(
            RecordDevice(index=s, uuid=inv.devices[s].uuid, milli=1000, mem_mib=1, mode="exclusive")
            for s in slots
        ),
    )


def k8s_pod(
    record: DeviceRecord,
    limits: dict[str, str],
    *,
    scheduler: str | None = "kallot",
    init: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "n",
        "containers": [{"name": "c", "resources": {"limits": limits}}],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if init is not None:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    return {
        "metadata": {
            "namespace": "team-b",
            "name": "p",
            "uid": "u",
            "annotations": {device_record.ANNOTATION: record.to_json()},
        },
        "spec": spec,
    }


def test_a_record_the_pod_could_have_been_given_is_served() -> None:
    inv = load("hgx-h100-8.yaml")
    got = pod_record(k8s_pod(whole(inv, 0, 1), {RESOURCE_GPU: "2"}))
    assert got.record == whole(inv, 0, 1) and got.error == ""
    # The largest init container counts, as the scheduler sums it.
    got = pod_record(k8s_pod(whole(inv, 0, 1), {RESOURCE_GPU: "1"}, init={RESOURCE_GPU: "2"}))
    assert got.record is not None


@pytest.mark.parametrize(
    ("limits", "scheduler", "why"),
    [
        pytest.param({RESOURCE_GPU: "2"}, None, "schedulerName 'default-scheduler'", id="default"),
        pytest.param({RESOURCE_GPU: "2"}, "other", "schedulerName 'other'", id="other-scheduler"),
        pytest.param({}, "kallot", "requests no GPU resource", id="asks-nothing"),
        pytest.param({"cpu": "1"}, "kallot", "requests no GPU resource", id="asks-cpu-only"),
        pytest.param({RESOURCE_GPU: "1"}, "kallot", "2 whole GPUs for 1", id="more-than-asked"),
        pytest.param({RESOURCE_MILLI: "500"}, "kallot", "2 whole GPUs for 0", id="share-asks"),
    ],
)
def test_a_forged_record_is_refused_and_charged_nothing(
    limits: dict[str, str], scheduler: str | None, why: str
) -> None:
    inv = load("hgx-h100-8.yaml")
    got = pod_record(k8s_pod(whole(inv, 0, 1), limits, scheduler=scheduler))
    assert got.record is None
    assert why in got.error and device_record.ANNOTATION in got.error
    # Charged nothing: no Allocate matches it.
    with pytest.raises(AllocationError, match="no device record"):
        find_record(
            RESOURCE_GPU, [inv.devices[0].uuid, inv.devices[1].uuid], [got], node="n", inv=inv
        )


def test_a_share_record_is_bounded_by_the_share_asked() -> None:
    inv = load("pcie-l40s-8.yaml")  # GPU 0 runs MPS
    d = inv.devices[0]
    rec = DeviceRecord(
        node="n", devices=(RecordDevice(index=0, uuid=d.uuid, milli=700, mem_mib=1, mode=d.mode),)
    )
    assert pod_record(k8s_pod(rec, {RESOURCE_MILLI: "700"})).record is not None
    got = pod_record(k8s_pod(rec, {RESOURCE_MILLI: "300"}))
    assert got.record is None and "700 milli-GPU for 300" in got.error


def test_a_mig_record_is_bounded_by_the_profiles_asked() -> None:
    inv = load("mig-a100-mixed.yaml")
    g = inv.devices[0]
    m = g.mig[0]
    rec = DeviceRecord(
        node="n",
        devices=(
            RecordDevice(
                index=g.index,
                uuid=g.uuid,
                milli=428,
                mem_mib=1,
                mode="mig",
                mig=RecordMig(profile=m.profile, start=m.start),
            ),
        ),
    )
    res = f"nvidia.com/mig-{m.profile}"
    assert pod_record(k8s_pod(rec, {res: "1"})).record is not None
    got = pod_record(k8s_pod(rec, {"nvidia.com/mig-1g.5gb": "1"}))
    assert got.record is None and f"1 x {m.profile} for 0" in got.error
    assert instance_id(g, m)  # the instance the record names exists


def test_pod_gpu_requests_reads_every_gpu_resource() -> None:
    pod = k8s_pod(whole(load("hgx-h100-8.yaml"), 0), {RESOURCE_GPU: "1", "cpu": "2"})
    pod["spec"]["containers"].append(
        {"name": "d", "resources": {"requests": {RESOURCE_GPU: "2"}, "limits": {RESOURCE_GPU: "2"}}}
    )
    assert pod_gpu_requests(pod) == {RESOURCE_GPU: 3}


def record_pod(name: str, record: DeviceRecord, *, allocated: bool, milli: int = 0) -> PodRecord:
    return PodRecord(
        namespace="ns", name=name, uid=name, record=record, allocated=allocated, milli=milli
    )


def test_a_gpu_held_by_one_pod_is_not_handed_to_another() -> None:
    inv = load("hgx-h100-8.yaml")
    held = record_pod("team-a", whole(inv, 3), allocated=True)
    thief = record_pod("team-b", whole(inv, 3), allocated=False)
    with pytest.raises(AllocationError, match="which pod ns/team-a holds"):
        find_record(RESOURCE_GPU, [inv.devices[3].uuid], [held, thief], node="n", inv=inv)
    # The holder's own re-admission (kubelet restart) still gets its GPU.
    assert find_record(RESOURCE_GPU, [inv.devices[3].uuid], [held], node="n", inv=inv) is held


def test_one_gpu_is_not_handed_out_under_two_resource_names() -> None:
    """The kubelet counts nvidia.com/gpu and kallot.io/gpu-milli apart: a whole GPU given to
    one pod must not also be given as milli-GPUs to another (and the other way round)."""
    inv = load("pcie-l40s-8.yaml")  # GPU 0 runs MPS: advertised under both names
    d = inv.devices[0]
    share = DeviceRecord(
        node="n", devices=(RecordDevice(index=0, uuid=d.uuid, milli=250, mem_mib=1, mode=d.mode),)
    )
    ids = [f"{d.uuid}::{k}" for k in range(250)]
    holder = record_pod("whole", whole(inv, 0), allocated=True)
    sharer = record_pod("share", share, allocated=False, milli=250)
    with pytest.raises(AllocationError, match="whichever resource name"):
        find_record(RESOURCE_MILLI, ids, [holder, sharer], node="n", inv=inv)
    held_share = record_pod("share", share, allocated=True, milli=250)
    taker = record_pod("whole", whole(inv, 0), allocated=False)
    with pytest.raises(AllocationError, match="whichever resource name"):
        find_record(RESOURCE_GPU, [d.uuid], [held_share, taker], node="n", inv=inv)
    # Two shares of one MPS GPU are what sharing is for.
    other = record_pod("share-2", share, allocated=False, milli=250)
    assert find_record(RESOURCE_MILLI, ids, [held_share, other], node="n", inv=inv) is other
