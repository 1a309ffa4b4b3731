"""The driver's ResourceSlices on the real control plane: kube-apiserver validates them and the real
kube-scheduler (DynamicResources plugin, no kallot involved) allocates ResourceClaims against
them: a whole GPU, MIG partitions with the counters respected, consumable-capacity shares,
nothing on a tainted (unhealthy) GPU. Then dynamic MIG end to end: the scheduler picks a
placement, the kubelet stand-in prepares it, the fake backend has exactly that instance."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kallot.config.inventory import NodeInventory
from kallot.core import mig as core_mig
from kallot.node import dra
from kallot.node.discovery import build_inventory
from kallot.node.dra_api import SLICES, ApiClaimSource, SlicePublisher
from kallot.node.draplugin import DraConfig, DraDriver
from kallot.node.fake import FakeBackend
from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import ControlPlane, create_nodes, gpu_node_body
from kallot.testing.kubelet import DraKubelet

pytestmark = pytest.mark.controlplane

DATA = Path(__file__).parent / "data"
NS = "default"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
ATTR = "device.attributes['gpu.kallot.io']"
STD = "device.attributes['resource.kubernetes.io']"

NODES = {
    "hgx": "hgx-h100-8.yaml",
    "hgx-mig": "hgx-h100-8.yaml",  # every GPU in MIG mode, no instance: 200 dynamic devices
    "a100-mixed": "mig-a100-mixed.yaml",
    "a100-dyn": "dra-a100-3.yaml",
    "l40s": "pcie-l40s-8.yaml",
}


def _inventory(node: str) -> NodeInventory:
    fake = FakeBackend.from_file(DATA / NODES[node])
    inv = build_inventory(fake.raw(), fake.sharing())
    if node == "hgx-mig":
        inv = inv.model_copy(
            update={
                "devices": tuple(
                    d.model_copy(update={"mode": "mig", "mig": ()}) for d in inv.devices
                )
            }
        )
    return inv


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    """A private cluster with the real kube-scheduler (DRA feature gates of the fixture on)."""
    with ControlPlane(scheduler=True) as plane:
        yield plane


@pytest.fixture
async def client(cp: ControlPlane) -> AsyncIterator[NodeClient]:
    c = await NodeClient.connect(cp.kubeconfig_path)
    yield c
    await c.close()


@pytest.fixture(scope="module")
def published(cp: ControlPlane) -> dict[str, int]:
    """Nodes, DeviceClasses and every node's slices (through the agent's SlicePublisher);
    returns the number of slices per node."""

    async def setup() -> dict[str, int]:
        await create_nodes(cp.kubeconfig_path, [gpu_node_body(n, gpus=0) for n in NODES])
        c = await NodeClient.connect(cp.kubeconfig_path)
        try:
            for cls in dra.device_classes():
                await c.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=cls)
            out = {}
            for node in NODES:
                slices = dra.resource_slices(_inventory(node), dra.DraOptions(node=node))
                assert await SlicePublisher(c, node).publish(slices)
                out[node] = len(slices)
            return out
        finally:
            await c.close()

    return asyncio.run(setup())


async def claim_and_pod(
    client: NodeClient,
    node: str,
    cls: str,
    selector: str = "",
    capacity: dict[str, str] | None = None,
) -> str:
    """A ResourceClaim with one request and a pod on ``node`` that uses it; returns the name."""
    name = f"{cls.split('.', maxsplit=1)[0]}-{uuid.uuid4().hex[:6]}"
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    await client.request(
        "POST",
        CLAIMS,
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        },
    )
    await client.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    return name


async def allocated(client: NodeClient, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """The claim's allocation once kube-scheduler wrote it (and bound the pod)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        claim = await client.request("GET", f"{CLAIMS}/{name}")
        alloc = (claim.get("status") or {}).get("allocation")
        pod = await client.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        if alloc and (pod.get("spec") or {}).get("nodeName"):
            result: dict[str, Any] = alloc["devices"]["results"][0]
            return result
        assert loop.time() < deadline, (
            f"claim {name} not allocated: {claim.get('status')}; pod: {pod.get('status')}"
        )
        await asyncio.sleep(0.2)


# IN_FLIGHT: the tests that fill a device place one claim at a time, each pod created once the
# one before is bound. With two created back to back, kube-scheduler v1.36 now and then (3 runs
# in 20 here) found no room for the second of two 30Gi shares of an 80Gi GPU ("cannot allocate
# all claims"), apparently while the first one's allocation was in flight, and did not retry the
# pod within a minute (its DynamicResources queueing hint requeues a pod on another claim's
# deallocation, not on its allocation). Once a pod is bound, its claim's allocation is written
# and no longer in flight.

# kube-scheduler's DynamicResources Filter, on a node where the claims have no allocation.
CANNOT_ALLOCATE = "cannot allocate all claims"


async def unschedulable(client: NodeClient, name: str, timeout: float = 60.0) -> str:
    """The scheduler's message once it gave up on the pod (PodScheduled=False, Unschedulable)
    because the claim has no allocation on the node. An earlier Unschedulable can be a passing
    one (the pod's event reached kube-scheduler before its claim's: "resourceclaim ... not
    found"), after which the claim could still be allocated: it does not count."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = ""
    while True:
        pod = await client.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                last = str(c.get("message", ""))
                if CANNOT_ALLOCATE in last:
                    claim = await client.request("GET", f"{CLAIMS}/{name}")
                    assert not (claim.get("status") or {}).get("allocation")
                    return last
        assert loop.time() < deadline, f"pod {name} not unschedulable for its claim: {last!r}"
        await asyncio.sleep(0.2)


async def slices_seen(cp: ControlPlane, client: NodeClient) -> None:
    """Returns once kube-scheduler has every ResourceSlice written so far: a new node's slices
    are written after them, and a claim only they can serve is allocated. kube-scheduler reads
    all ResourceSlices through one watch, which delivers the writes in order."""
    node = f"barrier-{uuid.uuid4().hex[:6]}"
    await create_nodes(cp.kubeconfig_path, [gpu_node_body(node, gpus=0)])
    inv = _inventory("a100-mixed")  # gpu-1 is a whole GPU
    assert await SlicePublisher(client, node).publish(
        dra.resource_slices(inv, dra.DraOptions(node=node))
    )
    # left in place, like the other tests' claims and pods: the pod only fits on that node
    await allocated(client, await claim_and_pod(client, node, "gpu.kallot.io"))


async def test_slices_pass_validation_and_pools_are_complete(
    published: dict[str, int], client: NodeClient
) -> None:
    items = (await client.request("GET", SLICES))["items"]
    for node, count in published.items():
        pool = [s for s in items if s["spec"]["pool"]["name"] == node]
        assert len(pool) == count
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in pool} == {count}
    big = [s for s in items if s["spec"]["pool"]["name"] == "hgx-mig"]
    assert sum(len(s["spec"].get("devices") or []) for s in big) == 8 * 25
    # what the API stored is what was sent (no field dropped by a disabled feature gate)
    dyn = next(
        d for s in big for d in s["spec"].get("devices") or [] if d["name"] == "gpu-0-mig-1g10gb-0"
    )
    assert dyn["consumesCounters"][0]["counterSet"] == "gpu-0-counters"
    hgx = next(s for s in items if s["spec"]["pool"]["name"] == "hgx")
    assert hgx["spec"]["devices"][0]["allowMultipleAllocations"] is True
    assert hgx["spec"]["devices"][0]["capacity"]["compute"]["requestPolicy"]["default"] == "0"


async def test_publishing_again_sends_nothing_and_a_change_bumps_the_generation(
    published: dict[str, int], client: NodeClient
) -> None:
    inv = _inventory("l40s")
    pub = SlicePublisher(client, "l40s")
    slices = dra.resource_slices(inv, dra.DraOptions(node="l40s"))
    assert not await pub.publish(slices)  # same content as in the API: nothing written
    assert pub.applied == 0
    gen = pub.generation
    sick = inv.devices[7].uuid
    tainted = dra.resource_slices(inv, dra.DraOptions(node="l40s", unhealthy={sick}))
    assert await pub.publish(tainted)
    assert not await pub.publish(tainted)
    items = (await client.request("GET", SLICES))["items"]
    pool = [s for s in items if s["spec"]["pool"]["name"] == "l40s"]
    assert {s["spec"]["pool"]["generation"] for s in pool} == {gen + 1}
    devs = [d for s in pool for d in s["spec"].get("devices") or []]
    assert [d["name"] for d in devs if d.get("taints")] == ["gpu-7"]
    assert await pub.publish(slices)  # recovered: the taint goes
    items = (await client.request("GET", SLICES))["items"]
    devs = [
        d
        for s in items
        if s["spec"]["pool"]["name"] == "l40s"
        for d in s["spec"].get("devices") or []
    ]
    assert not any(d.get("taints") for d in devs)


async def test_kube_scheduler_allocates_a_whole_gpu(
    published: dict[str, int], client: NodeClient
) -> None:
    name = await claim_and_pod(client, "a100-mixed", "gpu.kallot.io")
    r = await allocated(client, name)
    assert (r["driver"], r["pool"], r["device"]) == ("gpu.kallot.io", "a100-mixed", "gpu-1")


async def test_kube_scheduler_respects_mig_counters(
    published: dict[str, int], client: NodeClient
) -> None:
    big = await claim_and_pod(
        client,
        "hgx-mig",
        "mig.kallot.io",
        f"{ATTR}.profile == '4g.40gb' && {STD}.pciBusID == '0000:18:00.0'",
    )
    r = await allocated(client, big)
    assert r["device"] == "gpu-0-mig-4g40gb-0"
    # 3g.40gb at slice 0 overlaps the 4g's memory slices 0-3: never both allocated
    overlap = await claim_and_pod(
        client,
        "hgx-mig",
        "mig.kallot.io",
        f"{ATTR}.profile == '3g.40gb' && {ATTR}.placementStart == 0"
        f" && {STD}.pciBusID == '0000:18:00.0'",
    )
    await unschedulable(client, overlap)
    layout = [("4g.40gb", 0)]
    for _ in range(3):  # one at a time: see IN_FLIGHT
        name = await claim_and_pod(
            client,
            "hgx-mig",
            "mig.kallot.io",
            f"{ATTR}.profile == '1g.10gb' && {STD}.pciBusID == '0000:18:00.0'",
        )
        r = await allocated(client, name)
        layout.append(("1g.10gb", int(r["device"].rsplit("-", 1)[1])))
    assert core_mig.valid_layout("H100-80GB", layout) == "", layout
    # 4g + 3x 1g use all 7 compute slices: a fourth 1g does not fit anywhere on GPU 0
    fourth = await claim_and_pod(
        client,
        "hgx-mig",
        "mig.kallot.io",
        f"{ATTR}.profile == '1g.10gb' && {STD}.pciBusID == '0000:18:00.0'",
    )
    await unschedulable(client, fourth)


async def test_kube_scheduler_shares_a_gpu_by_consumable_capacity(
    published: dict[str, int], client: NodeClient
) -> None:
    gpu0 = f"{STD}.pciBusID == '0000:18:00.0'"
    want = {"memory": "30Gi", "compute": "30"}
    # one at a time: see IN_FLIGHT
    ra = await allocated(
        client, await claim_and_pod(client, "hgx", "gpu-share.kallot.io", gpu0, want)
    )
    rb = await allocated(
        client, await claim_and_pod(client, "hgx", "gpu-share.kallot.io", gpu0, want)
    )
    assert ra["device"] == rb["device"] == "gpu-0"
    assert ra["shareID"] != rb["shareID"]
    assert ra["consumedCapacity"] == {"memory": "30Gi", "compute": "30"}
    # 3 x 30Gi > 81559Mi: the third share does not fit on GPU 0
    c = await claim_and_pod(client, "hgx", "gpu-share.kallot.io", gpu0, want)
    await unschedulable(client, c)


async def test_time_sliced_gpu_takes_one_replica_per_claim(
    published: dict[str, int], client: NodeClient
) -> None:
    name = await claim_and_pod(
        client, "l40s", "gpu-share.kallot.io", f"{ATTR}.sharing == 'time-slicing'"
    )
    r = await allocated(client, name)
    assert r["device"] in ("gpu-6", "gpu-7")
    assert r["consumedCapacity"]["replicas"] == "1"


async def test_tainted_gpu_gets_no_claim(
    cp: ControlPlane, published: dict[str, int], client: NodeClient
) -> None:
    inv = _inventory("a100-mixed")
    pub = SlicePublisher(client, "a100-mixed")
    assert await pub.publish(
        dra.resource_slices(inv, dra.DraOptions(node="a100-mixed", unhealthy={inv.devices[0].uuid}))
    )
    # Without the taint in its view, kube-scheduler would allocate a MIG instance of GPU 0.
    await slices_seen(cp, client)
    # GPU 0's MIG instances are tainted, GPU 1 is whole: a MIG claim has nowhere to go
    name = await claim_and_pod(client, "a100-mixed", "mig.kallot.io")
    msg = await unschedulable(client, name)
    assert msg


async def test_dynamic_mig_end_to_end(published: dict[str, int], client: NodeClient) -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="kdra-", dir="/tmp"))  # short: socket paths
    fake = FakeBackend.from_file(DATA / NODES["a100-dyn"])
    config = DraConfig(
        node="a100-dyn",
        registry_dir=tmp_path / "plugins_registry",
        plugins_dir=tmp_path / "plugins",
        cdi_dir=tmp_path / "cdi",
    )
    driver = DraDriver(
        config,
        build_inventory(fake.raw(), fake.sharing()),
        ApiClaimSource(client),
        fake,
        publisher=SlicePublisher(client, "a100-dyn"),
    )
    await driver.start()
    kubelet = DraKubelet(config.registry_dir)
    try:
        await kubelet.register(dra.DRIVER)
        name = await claim_and_pod(
            client, "a100-dyn", "mig.kallot.io", f"{ATTR}.profile == '1g.10gb'"
        )
        r = await allocated(client, name)
        start = int(r["device"].rsplit("-", 1)[1])
        claim = await client.request("GET", f"{CLAIMS}/{name}")
        ref = (NS, name, claim["metadata"]["uid"])
        answer = (await kubelet.prepare(ref))[ref[2]]
        assert answer.error == ""
        assert answer.devices[0].device_name == r["device"]
        assert fake.mig_layout(0) == [("1g.10gb", start)]  # exactly the scheduler's placement
        # the agent's refresh sees the new instance; the pool does not change
        before = driver.slices()
        await driver.update(inventory=build_inventory(fake.raw(), fake.sharing()))
        assert driver.slices() == before
        assert (await kubelet.unprepare(ref))[ref[2]].error == ""
        assert fake.mig_layout(0) == []
    finally:
        await kubelet.close()
        await driver.stop()
        shutil.rmtree(tmp_path, ignore_errors=True)
