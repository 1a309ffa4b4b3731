"""A tenant's forged device record, end to end on the real API server, agent side only
(docs/security.md, "device record"; admission is off here, to show the agent's own check).

The live scheduler places a team's pod on a whole GPU and the agent's device plugin hands it
that GPU when the kubelet (the stand-in, over the plugin's socket) allocates it. A tenant then
creates a pod straight onto the node (``spec.nodeName`` set, ``schedulerName: kallot``) that
asks 1000 ``kallot.io/gpu-milli`` and carries its own record naming the same GPU: the kubelet
counts that resource apart from ``nvidia.com/gpu``, so it admits the pod and allocates, and the
agent refuses (the GPU is held under the other name). A pod that asks no GPU but carries a
record naming every GPU is charged nothing: the next pod the scheduler places is served.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from kallot.config import device_record
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import NodeInventory
from kallot.node.allocate import RESOURCE_GPU, RESOURCE_MILLI
from kallot.node.deviceplugin import DevicePlugins, Devices, PluginOptions, socket_name
from kallot.node.k8s import ApiRecordSource, NodeClient
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet, PluginClient
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane


def _forged(node: str, uuids: list[str]) -> str:
    return json.dumps(
        {
            "v": 1,
            "node": node,
            "devices": [
                {"index": i, "uuid": u, "milli": 1000, "memMiB": 1, "mode": "exclusive"}
                for i, u in enumerate(uuids)
            ],
        }
    )


def _direct(cluster: Cluster, name: str, node: str, resources: dict[str, str], rec: str) -> None:
    """A pod created onto the node by the tenant, with its own record (no scheduler)."""
    body: dict[str, Any] = pod_body(
        name, resources=resources, annotations={device_record.ANNOTATION: rec}
    )
    body["spec"]["nodeName"] = node
    cluster.create_pods([body])


def _mine(name: str, cluster: Cluster) -> dict[str, Any]:
    """A pod that tolerates this test's node taint and asks for that node (the control plane is
    shared: other tests' pods must not take its GPUs, nor these pods theirs)."""
    body: dict[str, Any] = pod_body(name, resources={"nvidia.com/gpu": "1"})
    body["spec"]["tolerations"] = [{"key": cluster.run, "operator": "Exists"}]
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": f"{cluster.run}-n0"}
    return body


def _place(cluster: Cluster, names: list[str]) -> dict[str, dict[str, Any]]:
    s = cluster.schedulers[0] if cluster.schedulers else cluster.scheduler()
    cluster.create_pods([_mine(n, cluster) for n in names])
    pods: dict[str, dict[str, Any]] = wait_until(
        lambda: (
            s.check_alive()
            and (p := {x["metadata"]["name"]: x for x in cluster.pods()})
            and all(p.get(n, {}).get("spec", {}).get("nodeName") for n in names)
            and p
        ),
        timeout=60,
        what=f"{names} bound (scheduler log: {s.log_path})",
    )
    return pods


async def test_a_forged_record_gets_no_gpu_and_blocks_nothing(
    cluster: Cluster, node_cp: ControlPlane
) -> None:
    node = f"{cluster.run}-n0"
    body = inventory_node_body(node, 2)  # two H100s, shared by MPS: whole GPUs and milli
    body["spec"] = {
        **body.get("spec", {}),
        "taints": [{"key": cluster.run, "effect": "NoSchedule"}],
    }
    body["metadata"].setdefault("labels", {})["kubernetes.io/hostname"] = node
    await asyncio.to_thread(cluster.add_nodes, [body])
    inv = NodeInventory.from_json(body["metadata"]["annotations"][INVENTORY_ANNOTATION])
    uuids = [d.uuid for d in inv.devices]
    pods = await asyncio.to_thread(_place, cluster, ["team-a"])
    victim = DeviceRecord.from_json(
        pods["team-a"]["metadata"]["annotations"][device_record.ANNOTATION]
    )
    (held,) = [d.uuid for d in victim.devices]

    d = Path(tempfile.mkdtemp(prefix="kfr-", dir="/tmp"))
    kubelet = FakeKubelet(d)
    await kubelet.start()
    api = await NodeClient.connect(node_cp.kubeconfig_path)
    plugins = DevicePlugins(
        Devices(inv), ApiRecordSource(api, node), PluginOptions(node=node, plugin_dir=d)
    )
    await plugins.start()
    gpu = PluginClient(d, socket_name(RESOURCE_GPU))
    milli = PluginClient(d, socket_name(RESOURCE_MILLI))
    try:
        resp = await gpu.allocate([held])  # the kubelet admits team-a's pod
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == held

        # The tenant: 1000 milli of the GPU team-a holds, under the other resource name.
        await asyncio.to_thread(
            _direct, cluster, "thief", node, {"kallot.io/gpu-milli": "1000"}, _forged(node, [held])
        )
        units = [x.ID for x in (await milli.list_and_watch().read()).devices]
        mine = [u for u in units if u.startswith(held + "::")][:1000]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await wait_for_record(milli, mine, "thief")
        why = refused.value.details() or ""
        assert "thief" in why and "refusing the record" in why, why

        # A pod asking no GPU with a record naming both GPUs holds nothing: the scheduler's next
        # pod gets the other GPU and the agent serves it.
        await asyncio.to_thread(_direct, cluster, "blocker", node, {}, _forged(node, uuids))
        pods = await asyncio.to_thread(_place, cluster, ["team-b"])
        rec = DeviceRecord.from_json(
            pods["team-b"]["metadata"]["annotations"][device_record.ANNOTATION]
        )
        (other,) = [x.uuid for x in rec.devices]
        assert other != held
        resp = await gpu.allocate([other])
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == other
    finally:
        await gpu.close()
        await milli.close()
        await plugins.stop()
        await api.close()
        await kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)


async def wait_for_record(client: PluginClient, ids: list[str], pod: str) -> None:
    """Allocate ``ids`` once the agent's informer has seen ``pod`` (until then the refusal
    would be "no record", not the one under test): retried while the answer names no pod."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        try:
            await client.allocate(ids)
            return
        except grpc.aio.AioRpcError as exc:
            if pod in (exc.details() or "") or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
