"""Asking for capacity (kube.autoscale.provision) on the real control plane: the ProvisioningRequest CRD
as cluster-autoscaler's API module ships it (tools/testenv/crds/crds.txt), kallot's request
for a gang's planned nodes accepted and validated by it, the documented status conditions read
back, and the Karpenter placeholder pods admitted.

cluster-autoscaler itself is not served by the Go module proxy here (its module answers 403),
so nothing provisions: the test writes the conditions the autoscaler would write (its
documented semantics: ``Accepted``, then ``Provisioned`` or ``Failed``) through the status
subresource, as the autoscaler does, and checks what kallot reads from them.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kallot.config import presets, wire
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.plan import Planner
from kallot.core.provision.shapes import NodeShape
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode
from kallot.k8sclient.errors import ApiError
from kallot.kube.api.client import KubeClient
from kallot.kube.autoscale import provision
from kallot.testing.autoscale import config_file
from kallot.testing.controllers import owner_crd
from kallot.testing.controlplane import ControlPlane
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

NS = "default"
KALLOT_CRDS = Path(__file__).resolve().parents[2] / "charts" / "kallot" / "crds"
RACK = "kallot.io/rack"
SHAPE = NodeShape(
    name="h100x8",
    cpu_milli=96_000,
    mem_mib=1 << 20,
    gpu_model="H100-80GB",
    gpus=8,
    labels={"karpenter.sh/nodepool": "gpu", RACK: "r1"},
)


@pytest.fixture(scope="module")
def provreq_crd(kube_cp: ControlPlane) -> None:
    crd = owner_crd("provisioningrequest")  # fails (never skips) without `make controlplane`
    with kube_cp.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        try:
            ext.create_custom_resource_definition(
                client.V1CustomResourceDefinition.model_validate(crd), _preload_content=False
            )
        except client.ApiException as exc:
            if exc.status != 409:
                raise

        def established() -> bool:
            raw = ext.read_custom_resource_definition(
                crd["metadata"]["name"], _preload_content=False
            )
            conds = (json.loads(raw.data).get("status") or {}).get("conditions") or []  # type: ignore[attr-defined]
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        wait_until(established, timeout=60, what="the ProvisioningRequest CRD to be served")


def _gang_plan() -> tuple[Any, dict[str, list[str]]]:
    """Two 8-GPU members of one gang in one rack: the planner asks for two h100x8 nodes."""
    job = Job(
        id="train",
        min_available=2,
        topology=TopologyConstraint(mode=TopologyMode.REQUIRED, level=RACK),
    )
    tasks = [
        Task(
            id=f"train-{i}", cpu_milli=8000, mem_mib=65536, gpu=DeviceRequest(count=8), job="train"
        )
        for i in range(2)
    ]
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    plan = Planner(fw, [SHAPE]).plan(tasks, {"train": job})
    return plan, {"train": [t.id for t in tasks]}


def test_a_gang_asks_through_a_provisioning_request(
    kube_cp: ControlPlane, provreq_crd: None
) -> None:
    plan, gangs = _gang_plan()
    assert plan.counts() == {"h100x8": 2} and plan.exact

    async def go() -> None:
        kc = await KubeClient.connect(kube_cp.kubeconfig_path)
        try:
            made = await provision.ask(
                kc, NS, plan, {SHAPE.name: SHAPE}, gangs, provisioner="provisioningRequest"
            )
            pr = made[-1]
            assert pr["kind"] == "ProvisioningRequest"
            path = f"/apis/{provision.GROUP}/v1/namespaces/{NS}/{provision.PLURAL}"
            got = await kc.get(f"{path}/{pr['metadata']['name']}")
            assert got["spec"]["provisioningClassName"] == provision.ATOMIC
            (pod_set,) = got["spec"]["podSets"]
            assert pod_set["count"] == 2
            tmpl = await kc.get(
                f"/api/v1/namespaces/{NS}/podtemplates/{pod_set['podTemplateRef']['name']}"
            )
            spec = tmpl["template"]["spec"]
            assert spec["nodeSelector"] == SHAPE.labels
            assert spec["containers"][0]["resources"]["requests"][provision.GPU] == "8"
            assert provision.state(got) == "Pending"
            assert provision.consume_annotations(got)[provision.CONSUME] == pr["metadata"]["name"]

            # The CRD's schema is the real one: a request without podSets is refused.
            bad = {
                **pr,
                "metadata": {"name": "kallot-bad", "namespace": NS},
                "spec": {"provisioningClassName": provision.ATOMIC},
            }
            with pytest.raises(ApiError) as err:
                await kc.create(path, bad)
            assert err.value.status == 422

            # What cluster-autoscaler writes (documented conditions) and what kallot reads.
            for conds, want in (
                ([("Accepted", "True")], "Accepted"),
                ([("Accepted", "True"), ("Provisioned", "True")], "Provisioned"),
                (
                    [("Accepted", "True"), ("Provisioned", "True"), ("CapacityRevoked", "True")],
                    "CapacityRevoked",
                ),
            ):
                body = {
                    "status": {
                        "conditions": [
                            {
                                "type": t,
                                "status": s,
                                "reason": "Test",
                                "message": "written as cluster-autoscaler writes it",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                            for t, s in conds
                        ]
                    }
                }
                await kc.patch(f"{path}/{pr['metadata']['name']}/status", body)
                assert provision.state(await kc.get(f"{path}/{pr['metadata']['name']}")) == want
        finally:
            await kc.close()

    asyncio.run(go())


def test_karpenter_placeholders_are_admitted(kube_cp: ControlPlane) -> None:
    plan, _ = _gang_plan()

    async def go() -> None:
        kc = await KubeClient.connect(kube_cp.kubeconfig_path)
        try:
            pc = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": provision.PLACEHOLDER_PRIORITY_CLASS},
                "value": -10,
                "preemptionPolicy": "Never",
                "description": "kallot's capacity placeholders: any real pod preempts them",
            }
            try:
                await kc.create("/apis/scheduling.k8s.io/v1/priorityclasses", pc)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            made = await provision.ask(
                kc, NS, plan, {SHAPE.name: SHAPE}, {}, provisioner="karpenter"
            )
            assert [m["kind"] for m in made] == ["Pod", "Pod"]
            for m in made:
                assert m["spec"]["priority"] == -10
                assert m["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "gpu"
                assert m["spec"]["containers"][0]["resources"]["requests"][provision.GPU] == "8"
                await kc.delete(f"/api/v1/namespaces/{NS}/pods/{m['metadata']['name']}")
        finally:
            await kc.close()

    asyncio.run(go())


def test_a_pending_gang_gets_its_nodes_through_a_provisioning_request(
    provreq_crd: None, cluster: Cluster
) -> None:
    """The ProvisioningRequest path of the live loop end to end. The test plays
    cluster-autoscaler (not served here), as its documentation says it acts on a request of
    class ``best-effort-atomic-scale-up``: it writes ``Accepted``, adds the nodes the request's
    PodTemplate describes (``count`` of them), then writes ``Provisioned``, through the status
    subresource. kallot (``kallot scheduler`` with ``provisioner: provisioningRequest``) must
    ask for exactly the gang's two nodes, point the gang's pods at the request, bind the gang
    there once the nodes are in, and then delete the request and its PodTemplates."""
    cluster.install_crds(
        [yaml.safe_load(p.read_text()) for p in sorted(KALLOT_CRDS.glob("*.yaml"))]
    )
    rack = f"r-{cluster.run}"
    shape = {
        "name": "h100x8",
        "cpu": 64,
        "memoryGiB": 512,
        "gpuModel": "H100-80GB",
        "gpus": 8,
        "gpuMode": "mps",
        "labels": {RACK: rack},
    }
    conf = config_file(
        cluster.log_dir / "c.yaml",
        provisioner="provisioningRequest",
        namespace=cluster.ns,
        shapes=[shape],
    )
    sched = cluster.scheduler(extra=[f"--config={conf}"])
    sched.wait_ready(60)
    objects = client.CustomObjectsApi(cluster.api)
    cluster.create_pod_group("train", minAvailable=2, topology={"mode": "required", "level": RACK})
    gang = {wire.LABEL_POD_GROUP: "train"}
    cluster.create_pods(
        [pod_body(f"train-{i}", resources={provision.GPU: "8"}, labels=gang) for i in range(2)]
    )
    args = (provision.GROUP, provision.VERSION, cluster.ns, provision.PLURAL)

    def requests() -> list[dict[str, Any]]:
        got = objects.list_namespaced_custom_object(*args)
        assert isinstance(got, dict)
        items: list[dict[str, Any]] = got["items"]
        return items

    (pr,) = wait_until(requests, timeout=60, what="kallot's ProvisioningRequest")
    name = pr["metadata"]["name"]
    assert pr["spec"]["provisioningClassName"] == provision.ATOMIC
    (pod_set,) = pr["spec"]["podSets"]
    assert pod_set["count"] == 2  # the planner's two nodes, one podSet of the one shape
    raw = cluster.v1.read_namespaced_pod_template(
        pod_set["podTemplateRef"]["name"], cluster.ns, _preload_content=False
    )
    spec = json.loads(raw.data)["template"]["spec"]  # type: ignore[attr-defined]
    assert spec["nodeSelector"] == {RACK: rack}
    assert spec["containers"][0]["resources"]["requests"][provision.GPU] == "8"

    def pointed() -> bool:
        anns = [p["metadata"].get("annotations") or {} for p in cluster.pods()]
        return len(anns) == 2 and all(a.get(provision.CONSUME) == name for a in anns)

    wait_until(pointed, timeout=30, what="the gang's pods pointed at the request")
    assert not any(p["spec"].get("nodeName") for p in cluster.pods())  # no node yet

    def condition(kind: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": "True",
            "reason": "PlayedByTheTest",
            "message": "written as cluster-autoscaler writes it",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def set_status(*kinds: str) -> None:
        body = {"status": {"conditions": [condition(k) for k in kinds]}}
        objects.patch_namespaced_custom_object_status(
            *args, name, body, _content_type="application/merge-patch+json"
        )

    set_status("Accepted")
    nodes = [f"{cluster.run}-pr{i}" for i in range(pod_set["count"])]
    cluster.add_nodes([inventory_node_body(n, 8, labels={RACK: rack}) for n in nodes])
    set_status("Accepted", "Provisioned")

    def bound() -> dict[str, str]:
        on = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods()}
        return on if len(on) == 2 and all(on.values()) else {}

    on = wait_until(bound, timeout=60, what="the gang bound on the provisioned nodes")
    assert sorted(on.values()) == sorted(nodes)  # one member a node, on the nodes asked for
    cluster.assert_no_overcommit()

    def withdrawn() -> bool:
        templates = cluster.v1.list_namespaced_pod_template(cluster.ns).items
        return not requests() and not templates

    wait_until(withdrawn, timeout=30, what="the request and its PodTemplates deleted")
    assert sched.check_alive()
