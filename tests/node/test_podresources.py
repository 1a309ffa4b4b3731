"""The kubelet's pod-resources API (served by the harness over a real unix socket) against the
device records: what the kubelet assigned vs what the scheduler recorded."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kallot.config.device_record import DeviceRecord, RecordDevice, RecordMig
from kallot.config.inventory import NodeInventory
from kallot.node.agent import Agent, AgentConfig
from kallot.node.allocate import RESOURCE_GPU, RESOURCE_MILLI, PodRecord
from kallot.node.deviceplugin import StaticRecordSource
from kallot.node.discovery import build_inventory
from kallot.node.fake import FakeBackend
from kallot.node.podresources import Drift, drift, list_assignments
from kallot.testing.kubelet import FakeKubelet, FakePodResources

DATA = Path(__file__).parent / "data"


def load() -> tuple[FakeBackend, NodeInventory]:
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    return backend, build_inventory(backend.raw(), backend.sharing())


def whole(inv: NodeInventory, *slots: int) -> DeviceRecord:
    return DeviceRecord(
        node="gpu-1",
        devices=tuple(
            RecordDevice(
                index=s, uuid=inv.devices[s].uuid, milli=1000, mem_mib=81559, mode="exclusive"
            )
            for s in slots
        ),
    )


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kpr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_drift_table() -> None:
    _, inv = load()
    ids = [d.uuid for d in inv.devices]
    pods = [
        PodRecord("ml", "ok", "1", whole(inv, 0, 1)),
        PodRecord("ml", "moved", "2", whole(inv, 2)),
        PodRecord("ml", "pending", "3", whole(inv, 4)),  # not running: nothing to compare
    ]
    assigned = {
        ("ml", "ok"): {RESOURCE_GPU: [ids[1], ids[0]]},
        ("ml", "moved"): {RESOURCE_GPU: [ids[3]]},
        ("ml", "stranger"): {RESOURCE_GPU: [ids[5]]},  # no record at all
        ("kube-system", "dns"): {"cpu": ["1"]},  # not ours
    }
    got = drift(assigned, pods, inv, [RESOURCE_GPU, RESOURCE_MILLI])
    assert got == [
        Drift("ml", "moved", RESOURCE_GPU, {ids[2]: 1}, {ids[3]: 1}),
        Drift("ml", "stranger", RESOURCE_GPU, {}, {ids[5]: 1}),
    ]
    assert got[0].message() == (
        f"pod ml/moved: the kubelet assigned {{{ids[3]}: 1}} of nvidia.com/gpu, "
        f"its device record names {{{ids[2]}: 1}}"
    )


def test_drift_of_a_share_on_a_mig_instance() -> None:
    # A share the scheduler put on GPU 0's 3g.40gb; the kubelet assigned 100 of its milli IDs.
    backend = FakeBackend.from_file(DATA / "mig-a100-mixed.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    gpu0 = inv.devices[0]
    mig_uuid = gpu0.mig[0].uuid
    record = DeviceRecord(
        node="gpu-1",
        devices=(
            RecordDevice(
                index=0,
                uuid=gpu0.uuid,
                milli=428,
                mem_mib=40960,
                mode="mig",
                mig=RecordMig(profile="3g.40gb", start=0),
            ),
        ),
    )
    pods = [
        PodRecord("ml", "tenant", "1", record, milli=100),
        PodRecord("ml", "moved", "2", record, milli=100),
    ]
    other = gpu0.mig[1].uuid
    assigned = {
        ("ml", "tenant"): {RESOURCE_MILLI: [f"{mig_uuid}::{k}" for k in range(100)]},
        ("ml", "moved"): {RESOURCE_MILLI: [f"{other}::{k}" for k in range(100)]},
    }
    resources = [RESOURCE_GPU, RESOURCE_MILLI, "nvidia.com/mig-3g.40gb"]
    assert drift(assigned, pods, inv, resources) == [
        Drift("ml", "moved", RESOURCE_MILLI, {mig_uuid: 100}, {other: 100}),
    ]


async def test_list_assignments_sums_containers(sockdir: Path) -> None:
    pr = FakePodResources(sockdir / "pr.sock")
    pr.pods[("ml", "two")] = {"a": {RESOURCE_GPU: ["GPU-a"]}, "b": {RESOURCE_GPU: ["GPU-b"]}}
    await pr.start()
    try:
        assert await list_assignments(pr.socket) == {
            ("ml", "two"): {RESOURCE_GPU: ["GPU-a", "GPU-b"]}
        }
    finally:
        await pr.stop()


class Recorder:
    def __init__(self) -> None:
        self.node: list[str] = []

    async def on_node(self, reason: str, message: str, *, warning: bool) -> None:
        self.node.append(reason)

    async def on_pod(self, pod: PodRecord, reason: str, message: str, *, warning: bool) -> None:
        return None


async def test_agent_reports_a_mismatch_once(sockdir: Path) -> None:
    backend, inv = load()
    kubelet = FakeKubelet(sockdir)
    await kubelet.start()
    pr = FakePodResources(sockdir / "pod-resources.sock")
    pr.pods[("ml", "moved")] = {"c": {RESOURCE_GPU: [inv.devices[3].uuid]}}
    await pr.start()
    events = Recorder()
    agent = Agent(
        AgentConfig(
            node="gpu-1",
            plugin_dir=sockdir,
            pod_resources_socket=pr.socket,
            sharing=backend.sharing(),
            refresh_s=3600,
            watch_s=3600,
            xid_wait_s=0.05,
        ),
        backend,
        StaticRecordSource([PodRecord("ml", "moved", "2", whole(inv, 2))]),
        events=events,
    )
    await agent.start(serve_metrics=False)
    try:
        assert [(d.pod, d.resource) for d in agent.state.drifts] == [("moved", RESOURCE_GPU)]
        await agent.refresh()
        assert events.node == ["DeviceRecordMismatch"]  # once, not per refresh
        families = {m.name: m for m in agent.registry.collect()}
        (sample,) = families["kallot_pod_device_record_mismatch"].samples
        assert sample.labels["pod"] == "moved" and sample.value == 1
        pr.pods[("ml", "moved")] = {"c": {RESOURCE_GPU: [inv.devices[2].uuid]}}  # fixed
        await agent.refresh()
        assert agent.state.drifts == []
    finally:
        await agent.stop()
        await pr.stop()
        await kubelet.stop()
