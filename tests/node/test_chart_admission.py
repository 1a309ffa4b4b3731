"""Only the scheduler writes device assignments: the chart's admission policy, shown on the real
API server from the attacker's side (docs/security.md).

A tenant who may create and patch pods in its namespace tries to write the scheduler-owned
annotations (``kallot.io/devices``, ``kallot.io/bind-time``, ``kallot.io/bind-phase``) on create
and on update; each is refused with a message naming the annotation and who may write it. The
scheduler's service account writes them; the tenant's other edits of the pod still go through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kallot.config import device_record, wire
from kallot.k8sclient.api import MERGE_PATCH
from kallot.k8sclient.errors import ApiError
from kallot.kube.owners import LABEL_KUEUE_QUEUE
from kallot.node.k8s import NodeClient
from kallot.testing.controlplane import (
    ControlPlane,
    helm_template,
    service_account_kubeconfig,
    until_allowed,
    until_denied,
)

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
RELEASE_NS = "kallot-adm"
TENANT_NS = "team-b"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


def render(tmp: Path) -> list[dict[str, Any]]:
    return helm_template(tmp, ROOT / "charts" / "kallot", namespace=RELEASE_NS)


async def token_client(
    client: NodeClient, cp: ControlPlane, ns: str, sa: str, tmp: Path
) -> NodeClient:
    await client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts",
        body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
    )
    return await NodeClient.connect(
        await service_account_kubeconfig(client, cp, ns, sa, tmp / f"{sa}.kubeconfig")
    )


def pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": "gpu-1",
            "schedulerName": "kallot",
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


async def test_only_the_scheduler_writes_device_assignments(
    node_cp: ControlPlane, client: NodeClient, tmp_path: Path
) -> None:
    docs = [
        d
        for d in render(tmp_path)
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and "scheduler-owned" in d["metadata"]["name"]
    ]
    assert sorted(d["kind"] for d in docs) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for ns in (RELEASE_NS, TENANT_NS):
        await client.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        )
    made = []
    for d in docs:
        plural = "validatingadmissionpolicies"
        if d["kind"] == "ValidatingAdmissionPolicyBinding":
            plural = "validatingadmissionpolicybindings"
            # This control plane is shared by tests/node: the binding covers this test's
            # namespace only, so other tests' pod writes never meet the policy.
            d["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TENANT_NS}}
            }
        await client.request("POST", f"{ADMISSION}/{plural}", body=d)
        made.append(f"{ADMISSION}/{plural}/{d['metadata']['name']}")
    # The tenant's role: pods in its namespace, nothing else. The scheduler's, for this test:
    # the same verbs there (the chart grants it more, cluster-wide).
    await client.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TENANT_NS}/roles",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pods"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "create", "update", "patch"],
                }
            ],
        },
    )
    await client.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{TENANT_NS}/rolebindings",
        body={
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT_NS},
                {"kind": "ServiceAccount", "name": "kallot", "namespace": RELEASE_NS},
            ],
        },
    )
    tenant = await token_client(client, node_cp, TENANT_NS, "tenant", tmp_path)
    scheduler = await token_client(client, node_cp, RELEASE_NS, "kallot", tmp_path)
    pods = f"/api/v1/namespaces/{TENANT_NS}/pods"
    forged = '{"v":1,"node":"gpu-1","devices":[{"index":0,"uuid":"GPU-0","milli":1000,"memMiB":1,"mode":"exclusive"}]}'
    try:
        # RBAC, then the policy (loaded asynchronously by the API server: testing.until_denied).
        await until_allowed(tenant, "create", "pods", namespace=TENANT_NS)
        await until_denied(
            lambda: tenant.request(
                "POST",
                pods,
                query=[("dryRun", "All")],
                body=pod("probe", {device_record.ANNOTATION: forged}),
            )
        )

        async def refused(method: str, path: str, body: dict[str, Any], key: str) -> None:
            with pytest.raises(ApiError) as denied:
                if method == "POST":
                    await tenant.request("POST", path, body=body)
                else:
                    await tenant.request("PATCH", path, body=body, content_type=MERGE_PATCH)
            assert denied.value.status in (403, 422), denied.value
            assert f"metadata.annotations[{key}]" in str(denied.value), denied.value

        # 1. Create with a forged record, or a bind time, or a bind phase.
        await refused(
            "POST", pods, pod("steal", {device_record.ANNOTATION: forged}), device_record.ANNOTATION
        )
        await refused(
            "POST", pods, pod("t", {device_record.BIND_TIME: "1"}), device_record.BIND_TIME
        )
        await refused(
            "POST",
            pods,
            pod("p", {device_record.BIND_PHASE: "allocated"}),
            device_record.BIND_PHASE,
        )
        # 2. A plain pod is the tenant's to create; adding a record later is refused too.
        await tenant.request("POST", pods, body=pod("mine"))

        def ann(key: str, value: str | None) -> dict[str, Any]:
            return {"metadata": {"annotations": {key: value}}}

        await refused(
            "PATCH", f"{pods}/mine", ann(device_record.ANNOTATION, forged), device_record.ANNOTATION
        )
        await refused(
            "PATCH",
            f"{pods}/mine",
            ann(device_record.BIND_PHASE, "allocated"),
            device_record.BIND_PHASE,
        )
        # 3. The scheduler writes them; the tenant's own edits still go through, but it may
        # neither change nor remove what the scheduler wrote.
        await scheduler.request(
            "PATCH",
            f"{pods}/mine",
            body=ann(device_record.ANNOTATION, forged),
            content_type=MERGE_PATCH,
        )
        await tenant.request(
            "PATCH",
            f"{pods}/mine",
            body={"metadata": {"labels": {"team": "b"}}},
            content_type=MERGE_PATCH,
        )
        await refused(
            "PATCH", f"{pods}/mine", ann(device_record.ANNOTATION, None), device_record.ANNOTATION
        )
        await refused(
            "PATCH",
            f"{pods}/mine",
            ann(device_record.ANNOTATION, forged + " "),
            device_record.ANNOTATION,
        )
        # 4. A bound pod's queue is fixed: relabelling it onto another team's queue (or off
        # its own, to free its queue's limit) is refused; a pending pod may still be moved.
        for key in (wire.LABEL_QUEUE, wire.LABEL_POD_GROUP, LABEL_KUEUE_QUEUE):
            with pytest.raises(ApiError) as moved:
                await tenant.request(
                    "PATCH",
                    f"{pods}/mine",
                    body={"metadata": {"labels": {key: "team-a"}}},
                    content_type=MERGE_PATCH,
                )
            assert f"metadata.labels[{key}]: changed on a pod bound to gpu-1" in str(moved.value)
        waiting = pod("waiting")
        del waiting["spec"]["nodeName"]
        waiting["metadata"]["labels"] = {wire.LABEL_QUEUE: "team-b"}
        await tenant.request("POST", pods, body=waiting)
        await tenant.request(
            "PATCH",
            f"{pods}/waiting",
            body={"metadata": {"labels": {wire.LABEL_QUEUE: "team-b-batch"}}},
            content_type=MERGE_PATCH,
        )
    finally:
        await tenant.close()
        await scheduler.close()
        for path in reversed(made):
            await client.request("DELETE", path)
    got = await client.request("GET", f"{pods}/mine")
    assert got["metadata"]["annotations"][device_record.ANNOTATION] == forged
    assert got["metadata"]["labels"] == {"team": "b"}
