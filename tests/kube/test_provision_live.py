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
from typing import Any

import pytest
from kubernetes import client

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.plan import Planner
from kallot.core.provision.shapes import NodeShape
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode
from kallot.k8sclient.errors import ApiError
from kallot.kube.api.client import KubeClient
from kallot.kube.autoscale import provision
from kallot.testing.controllers import owner_crd
from kallot.testing.controlplane import ControlPlane
from kallot.testing.live import wait_until

pytestmark = pytest.mark.controlplane

NS = "default"
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
