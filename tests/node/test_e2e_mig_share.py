"""Scheduler -> device record -> node agent, on the real API server: a share the live scheduler
placed on a MIG instance is handed that instance (its MIG UUID) by the agent's Allocate.

The scheduler runs as a subprocess against the control plane (kallot.testing.live); the agent's
device plugin reads the records from the same API server (k8s.ApiRecordSource) and is called
over its unix socket as the kubelet would (kallot.testing.kubelet).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kallot.config import device_record
from kallot.config.device_record import DeviceRecord
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.config.inventory import NodeInventory
from kallot.node.allocate import RESOURCE_MILLI
from kallot.node.deviceplugin import DevicePlugins, Devices, PluginOptions, socket_name
from kallot.node.k8s import ApiRecordSource, NodeClient
from kallot.testing.controlplane import ControlPlane
from kallot.testing.kubelet import FakeKubelet, PluginClient
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane


def _bound(cluster: Cluster, names: set[str]) -> dict[str, dict[str, Any]] | None:
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names):
        return pods
    return None


def _schedule(cluster: Cluster, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Publish the node, run the scheduler, create the two shares; their bound pods."""
    cluster.add_nodes([body])
    share = {"kallot.io/gpu-milli": "100", "kallot.io/gpu-memory": "30Gi"}
    s = cluster.scheduler()
    cluster.create_pods(
        [
            pod_body("tenant", resources=share, annotations={"kallot.io/isolation": "untrusted"}),
            pod_body("default", resources=share),
        ]
    )
    pods: dict[str, dict[str, Any]] = wait_until(
        lambda: s.check_alive() and _bound(cluster, {"tenant", "default"}),
        timeout=60,
        what="both shares bound",
    )
    cluster.assert_no_overcommit()
    return pods


async def test_untrusted_share_scheduled_on_mig_is_allocated_its_mig_uuid(
    cluster: Cluster, node_cp: ControlPlane
) -> None:
    # One H100 node as the agent publishes it: GPU 0 in MIG mode with two 3g.40gb instances,
    # GPU 1 in MPS. The untrusted share (100 milli, 30 GiB) can only run on a 3g.40gb; the
    # share without kallot.io/sharing may run on either, as the core chooses.
    node = f"{cluster.run}-mig"
    body = inventory_node_body(node, 2, mig={0: [("3g.40gb", 0), ("3g.40gb", 4)]})
    # The live helpers are synchronous (and run their own event loops): off this loop.
    pods = await asyncio.to_thread(_schedule, cluster, body)
    inv = NodeInventory.from_json(body["metadata"]["annotations"][INVENTORY_ANNOTATION])
    records = {
        n: DeviceRecord.from_json(pods[n]["metadata"]["annotations"][device_record.ANNOTATION])
        for n in ("tenant", "default")
    }
    (tenant_dev,) = records["tenant"].devices
    assert tenant_dev.mode == "mig" and tenant_dev.mig is not None
    assert tenant_dev.mig.profile == "3g.40gb"

    def expected(rec: DeviceRecord) -> str:
        (d,) = rec.devices
        if d.mig is None:
            return d.uuid  # an MPS share: the GPU
        (m,) = [m for m in inv.devices[d.index].mig if m.start == d.mig.start]
        return m.uuid  # a MIG instance: its own UUID, never the parent GPU

    want = {f"{cluster.ns}/{n}": expected(r) for n, r in records.items()}
    assert want[f"{cluster.ns}/tenant"] == f"MIG-{node}-0-{tenant_dev.mig.start}"

    # The agent: its device plugin, reading the records from the API server.
    d = Path(tempfile.mkdtemp(prefix="kdp-", dir="/tmp"))
    kubelet = FakeKubelet(d)
    await kubelet.start()
    api = await NodeClient.connect(node_cp.kubeconfig_path)
    plugins = DevicePlugins(
        Devices(inv), ApiRecordSource(api, node), PluginOptions(node=node, plugin_dir=d)
    )
    await plugins.start()
    milli = PluginClient(d, socket_name(RESOURCE_MILLI))
    try:
        listed = await milli.list_and_watch().read()
        free = [x.ID for x in listed.devices]
        # GPU 1's 1000 MPS units and 2 x 428 for the 3g.40gb instances.
        assert len(free) == 1000 + 2 * 428
        got: dict[str, str] = {}
        for _ in range(2):  # the kubelet admits the two pods, one after the other
            chosen = await milli.preferred(free, 100)
            resp = await milli.allocate(chosen)
            c = resp.container_responses[0]
            got[c.annotations["kallot.io/pod"]] = c.envs["NVIDIA_VISIBLE_DEVICES"]
            free = [x for x in free if x not in chosen]
        assert got == want
        for n in ("tenant", "default"):
            ann = cluster.pod(n)["metadata"]["annotations"]
            assert ann[device_record.BIND_PHASE] == "allocated", json.dumps(ann)
    finally:
        await milli.close()
        await plugins.stop()
        await api.close()
        await kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
