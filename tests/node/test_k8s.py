"""The agent against a real kube-apiserver: publishing the node, device records for Allocate."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from kallot.config import device_record, inventory, wire
from kallot.config.device_record import DeviceRecord, RecordDevice
from kallot.config.inventory import NodeInventory
from kallot.node.allocate import RESOURCE_GPU
from kallot.node.deviceplugin import DevicePlugins, Devices, PluginOptions, socket_name
from kallot.node.discovery import build_inventory, gfd_labels
from kallot.node.fake import FakeBackend
from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet, PluginClient

pytestmark = pytest.mark.controlplane

DATA = Path(__file__).parent / "data"


def load(name: str) -> NodeInventory:
    backend = FakeBackend.from_file(DATA / name)
    return build_inventory(backend.raw(), backend.sharing())


async def make_node(client: NodeClient, name: str) -> None:
    await client.request(
        "POST",
        "/api/v1/nodes",
        body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
    )


async def test_publish_labels_and_inventory_on_change_only(client: NodeClient) -> None:
    await make_node(client, "agent-pub")
    pub = Publisher(client, "agent-pub")
    inv = load("mig-a100-mixed.yaml")
    assert await pub.publish(gfd_labels(inv), inv)
    assert not await pub.publish(gfd_labels(inv), inv)  # unchanged: nothing sent
    assert pub.applied == 1
    node = await client.request("GET", "/api/v1/nodes/agent-pub")
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-2g.20gb.count"] == "1"
    published = NodeInventory.from_json(node["metadata"]["annotations"][inventory.ANNOTATION])
    assert published == inv
    # No shared GPU here, but a share may run on one of GPU 0's MIG instances: their memory,
    # 80 GiB x (4 + 2 + 1) / 8 memory slices.
    assert node["status"]["capacity"]["kallot.io/gpu-memory"] == "70Gi"
    managers = {f["manager"] for f in node["metadata"]["managedFields"]}
    assert "kallot-agent" in managers
    # GPU 0 leaves MIG mode: the MIG labels the agent owned disappear with the next apply.
    other = load("hgx-h100-8.yaml")
    assert await pub.publish(gfd_labels(other), other)
    node = await client.request("GET", "/api/v1/nodes/agent-pub")
    assert not any(k.startswith("nvidia.com/mig-") for k in node["metadata"]["labels"])
    assert node["status"]["capacity"]["kallot.io/gpu-memory"] == f"{8 * 81559}Mi"
    await client.request("DELETE", "/api/v1/nodes/agent-pub")


async def test_allocate_reads_the_record_from_the_api_server(client: NodeClient) -> None:
    inv = load("hgx-h100-8.yaml")
    ns = "agent-alloc"
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    record = DeviceRecord(
        node="agent-n1",
        devices=tuple(
            RecordDevice(
                index=i, uuid=inv.devices[i].uuid, milli=1000, mem_mib=81559, mode="exclusive"
            )
            for i in (2, 3)
        ),
    )
    for name, node, ann in (
        (
            "train",
            "agent-n1",
            {
                device_record.ANNOTATION: record.to_json(),
                device_record.BIND_PHASE: "allocating",
                device_record.BIND_TIME: "5",
            },
        ),
        ("elsewhere", "agent-n2", {device_record.ANNOTATION: record.to_json()}),
        (
            "broken",
            "agent-n1",
            {device_record.ANNOTATION: '{"v":1,"node":"agent-n1","devices":[{"index":-1}]}'},
        ),
    ):
        await client.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "annotations": ann},
                "spec": {
                    "nodeName": node,
                    "schedulerName": "kallot",
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "2"}},
                        }
                    ],
                },
            },
        )
    source = ApiRecordSource(client, "agent-n1")
    pods = {p.name: p for p in await source.pods()}
    assert set(pods) == {"train", "broken"}
    assert pods["train"].record == record and pods["train"].bind_time == 5
    assert pods["broken"].record is None and "devices.0" in pods["broken"].error

    d = Path(tempfile.mkdtemp(prefix="kdp-", dir="/tmp"))
    kubelet = FakeKubelet(d)
    await kubelet.start()
    plugins = DevicePlugins(Devices(inv), source, PluginOptions(node="agent-n1", plugin_dir=d))
    await plugins.start()
    try:
        gpu = PluginClient(d, socket_name(RESOURCE_GPU))
        resp = await gpu.allocate([inv.devices[2].uuid, inv.devices[3].uuid])
        envs = resp.container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{inv.devices[2].uuid},{inv.devices[3].uuid}"
        pod = await client.request("GET", f"/api/v1/namespaces/{ns}/pods/train")
        assert pod["metadata"]["annotations"][device_record.BIND_PHASE] == "allocated"
        # A request no record explains names the unreadable record too.
        import grpc

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gpu.allocate([inv.devices[7].uuid])
        assert "agent-alloc/broken: unreadable record" in (info.value.details() or "")
        await gpu.close()
        events = Events(client, "agent-n1")
        await events.on_node("GPUUnhealthy", "XID 79 on GPU 7", warning=True)
        await events.on_pod(pods["broken"], "AllocationRefused", "no record", warning=True)
        node_events = await client.request(
            "GET",
            "/api/v1/namespaces/default/events",
            query=[("fieldSelector", "involvedObject.name=agent-n1")],
        )
        assert [(e["reason"], e["type"]) for e in node_events["items"]] == [
            ("GPUUnhealthy", "Warning")
        ]
        pod_events = await client.request("GET", f"/api/v1/namespaces/{ns}/events")
        assert [e["reason"] for e in pod_events["items"]] == ["AllocationRefused"]
    finally:
        await plugins.stop()
        await kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
        await client.request("DELETE", f"/api/v1/namespaces/{ns}")


async def test_pod_informer_answers_from_its_watch(
    node_cp: ControlPlane, client: NodeClient
) -> None:
    """One LIST, then the WATCH keeps the cache: creating, finishing and deleting pods on the
    node reach ``pods()`` without another request; pods of other nodes never arrive."""
    import asyncio

    ns = "agent-informer"
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    api = await NodeClient.connect(node_cp.kubeconfig_path)  # the agent's own client, counted
    source = ApiRecordSource(api, "inf-n1")
    await source.start()
    try:
        assert source.lists == 1 and await source.pods() == []

        async def create(name: str, node: str) -> None:
            await client.request(
                "POST",
                f"/api/v1/namespaces/{ns}/pods",
                body={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
                },
            )

        await create("elsewhere", "inf-n2")
        await create("here", "inf-n1")
        pods = await asyncio.wait_for(source.until(bool), 30)
        assert [p.name for p in pods] == ["here"]
        requests = api.requests
        for _ in range(100):  # what 100 Allocate / refresh calls read
            assert [p.name for p in await source.pods()] == ["here"]
        assert api.requests == requests and source.lists == 1
        await client.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/here", query=[("gracePeriodSeconds", "0")]
        )
        await asyncio.wait_for(source.until(lambda ps: not ps), 30)
        assert source.lists == 1
        # fresh=True is a LIST (Allocate's fallback when the cache cannot explain a request).
        assert await source.pods(fresh=True) == [] and source.lists == 2
    finally:
        await source.stop()
        await api.close()


async def test_the_plugins_condition_leaves_the_kubelets_conditions_alone(
    client: NodeClient,
) -> None:
    """``kallot.io/DevicePluginsReady`` is merged by type next to the kubelet's conditions
    (a strategic merge patch, as the kubelet's own status updates), flips both ways, and keeps
    its lastTransitionTime while only the message changes."""
    await make_node(client, "agent-cond")
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
    await client.request(
        "PATCH",
        "/api/v1/nodes/agent-cond/status",
        body={"status": {"conditions": [ready]}},
        content_type="application/strategic-merge-patch+json",
    )
    pub = Publisher(client, "agent-cond")
    inv = load("hgx-h100-8.yaml")
    await pub.publish(gfd_labels(inv), inv)

    async def conditions() -> dict[str, dict[str, str]]:
        node = await client.request("GET", "/api/v1/nodes/agent-cond")
        return {c["type"]: c for c in node["status"]["conditions"]}

    await pub.plugins_serving(False, "the kubelet has not listed 8 of the 8 devices yet")
    got = await conditions()
    assert got["Ready"]["status"] == "True"
    assert got[wire.CONDITION_DEVICE_PLUGINS_READY]["status"] == "False"
    assert "not listed" in got[wire.CONDITION_DEVICE_PLUGINS_READY]["message"]
    first = got[wire.CONDITION_DEVICE_PLUGINS_READY]["lastTransitionTime"]
    await pub.plugins_serving(False, "the kubelet still charges 1 devices to 1 pods that are gone")
    got = await conditions()
    assert got[wire.CONDITION_DEVICE_PLUGINS_READY]["lastTransitionTime"] == first
    assert "charges" in got[wire.CONDITION_DEVICE_PLUGINS_READY]["message"]
    await pub.plugins_serving(True, "")
    inv2 = load("mig-a100-mixed.yaml")  # capacity by apply afterwards: conditions stay
    await pub.publish(gfd_labels(inv2), inv2)
    got = await conditions()
    assert got["Ready"]["status"] == "True"
    assert got[wire.CONDITION_DEVICE_PLUGINS_READY]["status"] == "True"
    assert len([t for t in got if t == wire.CONDITION_DEVICE_PLUGINS_READY]) == 1
