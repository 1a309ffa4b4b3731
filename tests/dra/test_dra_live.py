"""kallot's live scheduler allocates ResourceClaims on the real control plane (etcd,
kube-apiserver v1.36, kube-controller-manager's resourceclaim controller, no kube-scheduler):
``gpu.nvidia.com``-shaped slices (testing/dra.py), pods with ``schedulerName: kallot``, and
the allocations checked from the API. Every expected allocation is worked out by hand in the
test's docstring.

Node ``n1``: 4 whole GPUs, ``gpu-0``/``gpu-1`` on PCIe root ``pci0000:00`` and
``gpu-2``/``gpu-3`` on ``pci0000:40``. Node ``n2``: one consumable-capacity GPU ``gpu-0``
(80Gi, 1Gi steps). Node ``n3``: one A100 offered as dynamic-MIG partitions (counters).
Node ``n0``: no DRA devices at all (only CPU): a pod with claims must never land there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kallot.kube.api.client import KubeClient
from kallot.kube.dra.cache import FINALIZER
from kallot.kube.ops import explain
from kallot.testing.controlplane import ControlPlane, gpu_node_body
from kallot.testing.dra import (
    GROUP,
    NVIDIA,
    VERSION,
    claim,
    create_nvidia_classes,
    dra_control_plane,
    exactly,
    nvidia_node_slices,
)
from kallot.testing.live import Cluster, pending_reason, wait_until

pytestmark = pytest.mark.controlplane

ROOT = "resource.kubernetes.io/pcieRoot"
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with dra_control_plane(scheduler=False) as plane:
        yield plane


class Dra:
    """The test's namespace, its DRA objects and one kallot scheduler."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.ns = cluster.ns
        self.co = client.CustomObjectsApi(cluster.api)

    def create(self, plural: str, body: dict[str, Any], *, namespaced: bool = True) -> None:
        if namespaced:
            body["metadata"]["namespace"] = self.ns
            body["metadata"].pop("uid", None)
            self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, plural, body)
        else:
            self.co.create_cluster_custom_object(GROUP, VERSION, plural, body)

    def claim(self, name: str) -> dict[str, Any]:
        out = self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims", name)
        assert isinstance(out, dict)  # the client annotates custom objects as object
        return out

    def claims(self) -> list[dict[str, Any]]:
        got = self.co.list_namespaced_custom_object(GROUP, VERSION, self.ns, "resourceclaims")
        assert isinstance(got, dict)  # the client annotates custom objects as object
        items: list[dict[str, Any]] = got["items"]
        return items

    def devices(self, name: str) -> list[str]:
        alloc = (self.claim(name).get("status") or {}).get("allocation") or {}
        return sorted(r["device"] for r in alloc.get("devices", {}).get("results", []))

    def pod(
        self, name: str, claims: dict[str, str], *, templates: dict[str, str] | None = None
    ) -> None:
        refs = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
        refs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "kallot",
                "resourceClaims": refs,
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {
                            "requests": {"cpu": "100m"},
                            "claims": [{"name": r["name"]} for r in refs],
                        },
                    }
                ],
            },
        }
        self.cluster.create_pods([body])

    def node_of(self, name: str) -> str:
        return str(self.cluster.pod(name)["spec"].get("nodeName") or "")

    def wait_bound(self, *names: str) -> None:
        wait_until(
            lambda: all(self.node_of(n) for n in names),
            timeout=TIMEOUT,
            what=f"pods {names} bound\n{self.cluster.schedulers[-1].log_tail()}",
        )

    def pending_reason(self, name: str) -> str:
        return pending_reason(self.cluster.pod(name))

    def wait_reason(self, name: str, text: str) -> str:
        """The pod's PodScheduled=False reason once it contains ``text``. The first reason
        written may be a passing one: the pod's watch event can reach the scheduler before its
        ResourceClaim's ("ResourceClaim not found"), or before a node's. The reporter writes a
        new reason of the same kind at most every 30 s (the latest one held back when they
        end), so the reason asserted on can come 30 s after the first: the wait allows for
        that."""
        scheduler = self.cluster.schedulers[-1]
        last = [""]

        def reason() -> str:
            scheduler.check_alive()
            last[0] = self.pending_reason(name)
            return last[0] if text in last[0] else ""

        try:
            return str(wait_until(reason, timeout=2 * TIMEOUT, what=f"{name}'s reason"))
        except AssertionError as exc:
            scheduler.check_alive()  # its own message when the scheduler died
            raise AssertionError(f"{exc} containing {text!r}; the last one: {last[0]!r}") from None


@pytest.fixture
def dra(cp: ControlPlane, tmp_path: Path) -> Iterator[Dra]:
    with cp.api_client() as api:
        cluster = Cluster(cp, api, tmp_path)
        d = Dra(cluster)
        co = d.co
        for name in ("n0", "n1", "n2", "n3"):
            cluster.add_nodes([gpu_node_body(name, gpus=0)])
        create_nvidia_classes(co)
        slices = [
            *nvidia_node_slices("n1", gpus=4, roots=2),
            *nvidia_node_slices("n2", gpus=0, shared=1),
            *nvidia_node_slices("n3", gpus=0, dynamic_mig=1),
        ]
        for s in slices:
            co.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)
        cluster.scheduler().wait_ready(timeout=60)
        try:
            yield d
        finally:
            cluster.close()
            for s in slices:
                co.delete_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", s["metadata"]["name"]
                )


# n2's consumable-capacity GPU is a ``type: gpu`` device too (class gpu.nvidia.com): the
# whole-GPU claims pick n1's GPUs by uuid, as a user picks a GPU model.
ON_N1 = f"device.attributes['{NVIDIA}'].uuid.startsWith('GPU-n1-')"


def _gpu(name: str, count: int = 1, **fields: Any) -> dict[str, Any]:
    return claim(name, [exactly("gpu", "gpu.nvidia.com", count=count, selectors=[ON_N1])])


def test_whole_gpus_pairs_shared_claims_and_release(dra: Dra) -> None:
    """On n1 (roots 00: gpu-0,1; 40: gpu-2,3):
    1. ``single`` (1 GPU) goes to n1 (the only node with whole GPUs), one device;
    2. ``pair`` (2 GPUs, matchAttribute pcieRoot): the single's root has one GPU left, so the
       pair is the other root's two GPUs;
    3. ``shared`` (1 GPU) is used by pods s1 and s2: one allocation, both pods reserved, both
       on n1; it takes the last GPU (the single's root-mate);
    4. ``extra`` (1 GPU) finds none free: pending, the reason names the claim and request;
    5. deleting pod ``single`` makes the resourceclaim controller release ``single`` (no pod
       reserves it): ``extra`` then gets exactly the single's GPU."""
    dra.create("resourceclaims", _gpu("single"))
    dra.pod("single", {"gpu": "single"})
    dra.wait_bound("single")
    assert dra.node_of("single") == "n1"
    single = dra.devices("single")
    assert len(single) == 1
    obj = dra.claim("single")
    assert FINALIZER in obj["metadata"]["finalizers"]
    assert [r["name"] for r in obj["status"]["reservedFor"]] == ["single"]
    assert obj["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] == ["n1"]

    body = claim(
        "pair",
        [exactly("gpu", "gpu.nvidia.com", count=2, selectors=[ON_N1])],
        constraints=[{"matchAttribute": ROOT}],
    )
    dra.create("resourceclaims", body)
    dra.pod("pair", {"gpus": "pair"})
    dra.wait_bound("pair")
    other_root = ["gpu-2", "gpu-3"] if single[0] in ("gpu-0", "gpu-1") else ["gpu-0", "gpu-1"]
    assert dra.devices("pair") == other_root

    dra.create("resourceclaims", _gpu("shared"))
    dra.pod("s1", {"gpu": "shared"})
    dra.pod("s2", {"gpu": "shared"})
    dra.wait_bound("s1", "s2")
    assert dra.node_of("s1") == dra.node_of("s2") == "n1"
    mate = {"gpu-0": "gpu-1", "gpu-1": "gpu-0", "gpu-2": "gpu-3", "gpu-3": "gpu-2"}[single[0]]
    assert dra.devices("shared") == [mate]
    reserved = sorted(r["name"] for r in dra.claim("shared")["status"]["reservedFor"])
    assert reserved == ["s1", "s2"]

    dra.create("resourceclaims", _gpu("extra"))
    dra.pod("extra", {"gpu": "extra"})
    reason = dra.wait_reason("extra", f"claim {dra.ns}/extra, request gpu")
    assert f"claim {dra.ns}/extra, request gpu" in reason, reason
    # Events go out after the condition, from the reporter's own queue: wait for it.
    wait_until(
        lambda: any(
            f"claim {dra.ns}/extra, request gpu" in e.get("message", "")
            for e in dra.cluster.events("extra")
        ),
        timeout=TIMEOUT,
        what=f"extra's Event naming the claim: {dra.cluster.events('extra')}",
    )
    text = "\n".join(asyncio.run(_explain(dra, "extra")).lines())  # as `kallot explain`
    assert "gpu: claim extra [gpu: 1 of gpu.nvidia.com]: not allocated" in text, text
    assert f"claim {dra.ns}/extra, request gpu" in text, text
    text = "\n".join(explain.describe(dra.cluster.pod("pair"), claims=dra.claims()).lines())
    want = f"allocated gpu=n1/{other_root[0]}, gpu=n1/{other_root[1]}; reserved for pair"
    assert want in text, text

    dra.cluster.delete_pod("single")
    dra.wait_bound("extra")
    assert dra.devices("extra") == single
    _no_device_twice(dra)


def test_two_claims_per_pod_template_share_and_mig(dra: Dra) -> None:
    """1. pod ``two`` with claims ``a`` and ``b`` (1 GPU each, distinctAttribute not needed):
       two different GPUs of n1;
    2. a ResourceClaimTemplate ``tpl`` (1 GPU): kube-controller-manager creates the pod's
       claim, kallot allocates it on n1 (a third GPU), and deleting the pod deletes the
       generated claim (so its GPU is free again);
    3. ``share`` asks 20Gi of memory from the consumable-capacity GPU (class gpu.nvidia.com,
       a selector for the allowMultipleAllocations device's uuid): n2, shareID set,
       consumedCapacity memory 20Gi; a second 70Gi share does not fit (80Gi in all) and
       stays pending naming the claim;
    4. ``mig`` asks a 3g.20gb partition (class mig.nvidia.com): n3; kallot takes memory
       slices 4-7 (``gpu-0-mig-3g20gb-4``), keeping the 4g.20gb placement at 0 possible."""
    dra.create("resourceclaims", _gpu("a"))
    dra.create("resourceclaims", _gpu("b"))
    dra.pod("two", {"a": "a", "b": "b"})
    dra.wait_bound("two")
    a, b = dra.devices("a"), dra.devices("b")
    assert len(a) == len(b) == 1 and a != b

    dra.co.create_namespaced_custom_object(
        GROUP,
        VERSION,
        dra.ns,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tpl"},
            "spec": {
                "spec": {
                    "devices": {"requests": [exactly("gpu", "gpu.nvidia.com", selectors=[ON_N1])]}
                }
            },
        },
    )
    dra.pod("t", {}, templates={"gpu": "tpl"})
    dra.wait_bound("t")
    generated = [c for c in dra.claims() if c["metadata"]["name"] not in ("a", "b")]
    assert len(generated) == 1
    gname = generated[0]["metadata"]["name"]
    gdev = dra.devices(gname)
    assert len(gdev) == 1 and gdev not in (a, b)
    dra.cluster.delete_pod("t")
    wait_until(
        lambda: gname not in [c["metadata"]["name"] for c in dra.claims()],
        timeout=TIMEOUT,
        what="the generated claim deleted by kube-controller-manager",
    )

    uuid = "device.attributes['gpu.nvidia.com'].uuid == 'GPU-n2-0000'"
    share = claim(
        "share",
        [
            exactly(
                "mem",
                "gpu.nvidia.com",
                selectors=[uuid],
                capacity={"requests": {"memory": "20Gi"}},
            )
        ],
    )
    dra.create("resourceclaims", share)
    dra.pod("share", {"mem": "share"})
    dra.wait_bound("share")
    assert dra.node_of("share") == "n2"
    result = dra.claim("share")["status"]["allocation"]["devices"]["results"][0]
    assert result["device"] == "gpu-0" and result["pool"] == "n2"
    assert result["shareID"] and result["consumedCapacity"] == {"memory": "20Gi"}
    big = json.loads(json.dumps(share).replace("20Gi", "70Gi").replace('"share"', '"big"'))
    dra.create("resourceclaims", big)
    dra.pod("big", {"mem": "big"})
    # "claim .../big: ResourceClaim not found" would pass the assertion: wait for the request
    dra.wait_reason("big", f"claim {dra.ns}/big, request mem")
    assert f"claim {dra.ns}/big" in dra.pending_reason("big")

    mig = claim(
        "mig",
        [
            exactly(
                "mig",
                "mig.nvidia.com",
                selectors=[f"device.attributes['{NVIDIA}'].profile == '3g.20gb'"],
            )
        ],
    )
    dra.create("resourceclaims", mig)
    dra.pod("mig", {"mig": "mig"})
    dra.wait_bound("mig")
    assert dra.node_of("mig") == "n3"
    assert dra.devices("mig") == ["gpu-0-mig-3g20gb-4"]
    _no_device_twice(dra)


def test_bad_selector_gets_an_event_and_the_scheduler_keeps_running(dra: Dra) -> None:
    """A claim whose selector fails at run time (an attribute no device has: the API server
    compiles it, evaluation errors, as upstream): its pod stays pending with a reason naming
    the claim, the request and the expression; a good pod after it is still scheduled."""
    bad = f"device.attributes['{NVIDIA}'].noSuchAttribute == 'x'"
    dra.create("resourceclaims", claim("bad", [exactly("gpu", "gpu.nvidia.com", selectors=[bad])]))
    dra.pod("bad", {"gpu": "bad"})
    reason = dra.wait_reason("bad", bad)
    assert f"claim {dra.ns}/bad, request gpu" in reason and bad in reason, reason
    dra.create("resourceclaims", _gpu("good"))
    dra.pod("good", {"gpu": "good"})
    dra.wait_bound("good")


async def _explain(dra: Dra, name: str) -> explain.Explanation:
    kc = await KubeClient.connect(dra.cluster.cp.kubeconfig_path)
    try:
        return await explain.fetch(kc, dra.ns, name)
    finally:
        await kc.close()


def _no_device_twice(dra: Dra) -> None:
    """From the API: no exclusive device in two allocations."""
    seen: dict[tuple[str, str, str], str] = {}
    for c in dra.claims():
        alloc = (c.get("status") or {}).get("allocation")
        if not alloc:
            continue
        for r in alloc["devices"]["results"]:
            if r.get("shareID") or r.get("adminAccess"):
                continue
            key = (r["driver"], r["pool"], r["device"])
            assert key not in seen, f"{key} in {seen[key]} and {c['metadata']['name']}"
            seen[key] = c["metadata"]["name"]


def test_pod_mixing_device_plugin_gpus_and_a_claim(dra: Dra) -> None:
    """Node ``mix`` has one device-plugin GPU (``nvidia.com/gpu: 1``) and one DRA GPU
    (``gpu.nvidia.com`` slice): pod ``m1`` asks ``nvidia.com/gpu: 1`` and a claim for the DRA
    GPU (selected by uuid): bound to mix with a device record and its claim allocated. Pod
    ``m2`` asks the same with another claim: both kinds are taken, it stays pending with a
    reason."""
    co = dra.co
    dra.cluster.add_nodes([gpu_node_body("mix", gpus=1)])
    slices = nvidia_node_slices("mix", gpus=1)
    for s in slices:
        co.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)
    try:
        sel = f"device.attributes['{NVIDIA}'].uuid == 'GPU-mix-0000'"
        for name in ("m1", "m2"):
            dra.create(
                "resourceclaims", claim(name, [exactly("gpu", "gpu.nvidia.com", selectors=[sel])])
            )
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": "kallot",
                    "resourceClaims": [{"name": "dra", "resourceClaimName": name}],
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1"},
                                "claims": [{"name": "dra"}],
                            },
                        }
                    ],
                },
            }
            dra.cluster.create_pods([body])
        dra.wait_bound("m1")
        pod = dra.cluster.pod("m1")
        assert pod["spec"]["nodeName"] == "mix"
        assert "kallot.io/devices" in pod["metadata"].get("annotations", {})
        assert dra.devices("m1") == ["gpu-0"]
        # A reason written before the scheduler saw mix (or m1 on it) says nothing about m2
        # staying pending: wait for the one about mix's device-plugin GPU, taken by m1 (n0-n3
        # have none), then m2 must still be unbound.
        dra.wait_reason("m2", "fewer than 1 idle GPUs")
        assert not dra.node_of("m2")
        assert not dra.devices("m2")
    finally:
        for s in slices:
            co.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", s["metadata"]["name"])
