"""The DRA edge against the real kube-apiserver (no scheduler): ``gpu.nvidia.com``-shaped
slices, classes and claims go through the API (defaults and validation applied), are parsed
back by ``config.dra``, allocated by ``core.dra``, and the ``status.allocation`` that
``allocation_status`` writes is accepted by the apiserver's validation and reads back as the
same allocation, which then occupies its devices for the next claims."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from kallot.config.dra import (
    allocation_status,
    claim_from_json,
    device_class_from_json,
    slice_from_json,
)
from kallot.core.dra.allocator import Inventory, allocate
from kallot.core.dra.model import ClaimAllocation, assemble_pools
from kallot.core.dra.policy import KallotPolicy
from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import ControlPlane, create_nodes, gpu_node_body
from kallot.testing.dra import NVIDIA, claim, exactly, nvidia_classes, nvidia_node_slices

pytestmark = pytest.mark.controlplane

API = "/apis/resource.k8s.io/v1"
CLAIMS = f"{API}/namespaces/default/resourceclaims"
ROOT = "resource.kubernetes.io/pcieRoot"


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with ControlPlane(scheduler=False) as plane:
        asyncio.run(create_nodes(plane.kubeconfig_path, [gpu_node_body("n1", gpus=0)]))
        yield plane


@pytest.fixture
async def client(cp: ControlPlane) -> AsyncIterator[NodeClient]:
    c = await NodeClient.connect(cp.kubeconfig_path)
    yield c
    await c.close()


async def _inventory(client: NodeClient, allocated: list[ClaimAllocation]) -> Inventory:
    slices = (await client.request("GET", f"{API}/resourceslices"))["items"]
    classes = (await client.request("GET", f"{API}/deviceclasses"))["items"]
    pools, skipped = assemble_pools([slice_from_json(s) for s in slices])
    assert not skipped
    return Inventory(pools, {c.name: c for c in map(device_class_from_json, classes)}, allocated)


async def test_allocations_written_by_kallot_pass_apiserver_validation(client: NodeClient) -> None:
    classes = nvidia_classes()
    classes[0]["spec"]["config"] = [
        {"opaque": {"driver": NVIDIA, "parameters": {"apiVersion": "v1", "kind": "GpuConfig"}}}
    ]
    for cls in classes:
        await client.request("POST", f"{API}/deviceclasses", body=cls)
    for s in nvidia_node_slices("n1", gpus=4, dynamic_mig=1, shared=1):
        await client.request("POST", f"{API}/resourceslices", body=s)
    a = f"device.attributes['{NVIDIA}']"
    bodies = [
        claim(
            "pair",
            [exactly("gpu", "gpu.nvidia.com", count=2)],
            constraints=[{"matchAttribute": ROOT}],
        ),
        claim("mig", [exactly("mig", "mig.nvidia.com", selectors=[f"{a}.profile == '3g.20gb'"])]),
        claim(
            "share",
            [
                exactly(
                    "s",
                    "gpu.nvidia.com",
                    capacity={"requests": {"memory": "20Gi"}},
                    selectors=[f"{a}.uuid == 'GPU-n1-0005'"],
                )
            ],
            config=[{"requests": ["s"], "opaque": {"driver": NVIDIA, "parameters": {"kind": "X"}}}],
        ),
        claim(
            "either",
            [
                {
                    "name": "gpu",
                    "firstAvailable": [
                        {
                            "name": "big",
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": f"{a}.profile == '7g.40gb'"}}],
                        },
                        {
                            "name": "small",
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": f"{a}.profile == '1g.5gb'"}}],
                        },
                    ],
                }
            ],
        ),
    ]
    live: list[ClaimAllocation] = []
    for body in bodies:
        created = await client.request(
            "POST", CLAIMS, body={**body, "metadata": {"name": body["metadata"]["name"]}}
        )
        c = claim_from_json(created)  # as the apiserver stored it (defaults applied)
        out = allocate([c], "n1", {}, await _inventory(client, live), policy=KallotPolicy())
        assert out.ok, out.reason
        status = allocation_status(out.allocations[c.key])
        created["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        updated = await client.request("PUT", f"{CLAIMS}/{c.name}", body=created)
        updated["status"] = {"allocation": status}
        written = await client.request("PUT", f"{CLAIMS}/{c.name}/status", body=updated)
        back = claim_from_json(written).allocation
        assert back is not None
        assert [(r.request, r.device, r.share_id, dict(r.consumed)) for r in back.results] == [
            (r.request, r.device, r.share_id, dict(r.consumed))
            for r in out.allocations[c.key].results
        ]
        assert (
            written["status"]["allocation"]["devices"].get("config", [])
            == status["devices"]["config"]
        )
        live.append(back)
    devices = {r.device: r for alloc in live for r in alloc.results}
    assert {"gpu-0", "gpu-1"} <= set(devices) or {"gpu-2", "gpu-3"} <= set(devices)
    assert devices["gpu-5"].consumed == {f"{NVIDIA}/memory": 20 * 2**30}
    # 3g.20gb took half of the A100 (slices 0-3 or 4-7): no 7g.40gb, the subrequest 'small' won
    assert [r.request for r in live[3].results] == ["gpu/small"]
    # what the API holds now occupies the devices: a claim for all 4 whole GPUs cannot fit
    everything = claim_from_json(claim("all", [exactly("gpu", "gpu.nvidia.com", count=4)]))
    stored = [
        a
        for a in (
            claim_from_json(x).allocation for x in (await client.request("GET", CLAIMS))["items"]
        )
        if a is not None
    ]
    out = allocate([everything], "n1", {}, await _inventory(client, stored), policy=KallotPolicy())
    assert not out.ok and "2 in use" in out.reason
