"""Conformance with kube-scheduler's allocator on the real control plane.

One ``gpu.nvidia.com``-shaped node (whole GPUs on two PCIe roots, one of them tainted, a
dynamic-MIG A100, a consumable-capacity GPU). For each claim shape, in sequence, on the state the
API holds (every earlier allocation occupying its devices): kallot's allocator is asked first
(pure, nothing written), then the real kube-scheduler allocates the claim for a pod. They must
agree on whether the claim fits and on the ``firstAvailable`` subrequest; where it fits, every
device kube-scheduler chose passes kallot's filters for its request (class and request CEL
selectors, taints, capacity), and kallot computes the same consumed capacity for it (request
policy defaults and rounding)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.dra.allocator import Inventory, allocate, candidates_for, consumption
from kallot.core.dra.model import assemble_pools, parse_quantity
from kallot.core.dra.policy import KallotPolicy
from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import ControlPlane, create_nodes, gpu_node_body
from kallot.testing.dra import NVIDIA, claim, exactly, nvidia_classes, nvidia_node_slices

pytestmark = pytest.mark.controlplane

API = "/apis/resource.k8s.io/v1"
NS = "default"
CLAIMS = f"{API}/namespaces/{NS}/resourceclaims"
ROOT = "resource.kubernetes.io/pcieRoot"
A = f"device.attributes['{NVIDIA}']"


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with ControlPlane(scheduler=True) as plane:

        async def setup() -> None:
            await create_nodes(plane.kubeconfig_path, [gpu_node_body("n1", gpus=0)])
            c = await NodeClient.connect(plane.kubeconfig_path)
            try:
                for cls in nvidia_classes():
                    await c.request("POST", f"{API}/deviceclasses", body=cls)
                slices = nvidia_node_slices("n1", gpus=4, dynamic_mig=1, shared=1, taint_gpu=3)
                for s in slices:
                    await c.request("POST", f"{API}/resourceslices", body=s)
            finally:
                await c.close()

        asyncio.run(setup())
        yield plane


@pytest.fixture
async def client(cp: ControlPlane) -> AsyncIterator[NodeClient]:
    c = await NodeClient.connect(cp.kubeconfig_path)
    yield c
    await c.close()


async def _state(client: NodeClient) -> Inventory:
    slices = (await client.request("GET", f"{API}/resourceslices"))["items"]
    classes = (await client.request("GET", f"{API}/deviceclasses"))["items"]
    pools, _ = assemble_pools([slice_from_json(s) for s in slices])
    allocated = [
        a
        for a in (
            claim_from_json(x).allocation for x in (await client.request("GET", CLAIMS))["items"]
        )
        if a is not None
    ]
    return Inventory(pools, {c.name: c for c in map(device_class_from_json, classes)}, allocated)


async def _kube_scheduler(client: NodeClient, body: dict[str, Any]) -> dict[str, Any] | None:
    """Create the claim and a pod using it; the allocation kube-scheduler wrote, or None once
    it reports the pod unschedulable."""
    name = body["metadata"]["name"]
    await client.request("POST", CLAIMS, body={**body, "metadata": {"name": name}})
    await client.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "n1"},
                "resourceClaims": [{"name": "c", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "c"}]}}
                ],
            },
        },
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:  # polls the API for the scheduler's outcome (state, not time, decides)
        got = await client.request("GET", f"{CLAIMS}/{name}")
        alloc = (got.get("status") or {}).get("allocation")
        if alloc:
            return dict(alloc)
        pod = await client.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return None
        assert loop.time() < deadline, f"claim {name}: kube-scheduler decided nothing"
        await asyncio.sleep(0.2)


def _mig(name: str, profile: str) -> dict[str, Any]:
    return claim(
        name, [exactly("mig", "mig.nvidia.com", selectors=[f"{A}.profile == '{profile}'"])]
    )


def _share(name: str, memory: str) -> dict[str, Any]:
    sel = [f"{A}.uuid == 'GPU-n1-0005'"]
    return claim(
        name,
        [exactly("s", "gpu.nvidia.com", selectors=sel, capacity={"requests": {"memory": memory}})],
    )


TOLERATE = [{"key": "nvidia.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}]
FIRST_AVAILABLE = {
    "name": "m",
    "firstAvailable": [
        {
            "name": "big",
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": f"{A}.profile == '7g.40gb'"}}],
        },
        {
            "name": "small",
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": f"{A}.profile == '1g.5gb'"}}],
        },
    ],
}
# (claim, fits): in order, each on the state the earlier ones left. Node: gpu-0..2 on root
# pci0000:00, gpu-3 (tainted), gpu-4 (A100 partitions), gpu-5 (shared, 80Gi) on pci0000:40.
CASES = [
    (claim("one", [exactly("gpu", "gpu.nvidia.com")]), True),
    (
        claim(
            "pair",
            [exactly("gpu", "gpu.nvidia.com", count=2)],
            constraints=[{"matchAttribute": ROOT}],
        ),
        True,
    ),
    # the shared gpu-5: 1Gi steps round 20.5Gi up to 21Gi; 60Gi then no longer fits, 59Gi does
    (_share("share", "20.5Gi"), True),
    (_share("share-big", "60Gi"), False),
    (_share("share-rest", "59Gi"), True),
    # gpu-3 is tainted and gpu-5 full: nothing left without a toleration, gpu-3 with one
    (claim("untolerated", [exactly("gpu", "gpu.nvidia.com")]), False),
    (claim("tolerant", [exactly("gpu", "gpu.nvidia.com", tolerations=TOLERATE)]), True),
    (
        claim(
            "new-driver",
            [
                exactly(
                    "gpu",
                    "gpu.nvidia.com",
                    selectors=[f"{A}.driverVersion.isGreaterThan(semver('580.0.0'))"],
                )
            ],
        ),
        False,
    ),
    # the A100: a 3g.20gb (kallot takes slices 4-7 and keeps the 4g.20gb at 0-3 possible)
    (_mig("mig-3g", "3g.20gb"), True),
    (claim("either", [FIRST_AVAILABLE]), True),  # no 7g.40gb left: the 1g.5gb subrequest
    (_mig("mig-7g", "7g.40gb"), False),
]


@pytest.mark.parametrize(("body", "fits"), CASES, ids=[c["metadata"]["name"] for c, _ in CASES])
async def test_kallot_agrees_with_kube_scheduler(
    client: NodeClient, body: dict[str, Any], fits: bool
) -> None:
    c = claim_from_json(body)
    before = await _state(client)
    ours = allocate([c], "n1", {"kubernetes.io/hostname": "n1"}, before, policy=KallotPolicy())
    theirs = await _kube_scheduler(client, body)
    assert ours.ok == (theirs is not None), (ours.reason, theirs)
    assert ours.ok == fits, ours.reason
    if theirs is None:
        return
    devices = [d for p in before.pools for d in p.devices]
    by_name = {d.name: d for d in devices}
    for r in theirs["devices"]["results"]:
        request = next(q for q in c.requests if q.name == r["request"].split("/")[0])
        name, req = next((n, q) for n, q in request.alternatives() if n == r["request"])
        ok = candidates_for(c, name, req, [by_name[r["device"]]], before.classes)
        assert ok, f"kube-scheduler chose {r['device']} for {name}; kallot's filters reject it"
        mine = [x for x in ours.allocations[c.key].results if x.request == r["request"]]
        assert mine, (
            f"kube-scheduler used {r['request']}, kallot {[x.request for x in ours.allocations[c.key].results]}"
        )
        if r.get("consumedCapacity"):  # kallot's request-policy rounding on their device
            want = {f"{NVIDIA}/{k}": parse_quantity(v) for k, v in r["consumedCapacity"].items()}
            assert consumption(by_name[r["device"]], req) == want
