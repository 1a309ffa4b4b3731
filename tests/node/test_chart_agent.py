"""The node agent in the Helm chart: rendered by the real helm, its RBAC shown to be enough for
what the agent does against a real API server (and nothing is a wildcard)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import typer.main

from kallot.config import device_record
from kallot.node.discovery import build_inventory, gfd_labels
from kallot.node.fake import FakeBackend
from kallot.node.k8s import ApiRecordSource, Events, NodeClient, Publisher
from kallot.testing.controlplane import (
    ControlPlane,
    helm_template,
    service_account_kubeconfig,
    until_allowed,
    until_denied,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def render(tmp: Path, namespace: str = "kallot-system") -> list[dict[str, Any]]:
    docs = helm_template(tmp, ROOT / "charts" / "kallot", namespace=namespace)
    return [
        d
        for d in docs
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "agent"
    ]


@pytest.mark.controlplane
def test_daemonset_least_privilege_and_flags(tmp_path: Path) -> None:
    docs = render(tmp_path)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert paths == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        # the device plugin's own CDI spec (kallot.node.cdi), which containerd reads
        "cdi": "/var/run/cdi",
    }
    mounts = {m["name"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    assert mounts == {"device-plugins": False, "pod-resources": True, "cdi": False}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    # Every flag the chart passes is one `kallot agent run` accepts.
    from kallot.cli.main import app

    group = typer.main.get_command(app)
    # The root group loads its commands lazily (cli.main): ask it, as click does on a run.
    ctx = click.Context(group)
    agent = group.get_command(ctx, "agent")  # type: ignore[attr-defined]
    run = agent.get_command(ctx, "run")
    known = {opt for p in run.params for opt in p.opts}
    assert c["args"][:2] == ["agent", "run"]
    for arg in c["args"][2:]:
        assert arg.split("=", 1)[0] in known, arg
    # RBAC: no wildcard, and exactly the verbs the agent uses.
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "events", "create"),
        # the exporter's delegated authn/authz (agent.metricsAuth=delegated, the default)
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }


@pytest.mark.controlplane
async def test_agent_rbac_is_enough(
    node_cp: ControlPlane, client: NodeClient, tmp_path: Path
) -> None:
    ns = "agent-rbac"
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    paths = {
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    }
    docs = render(tmp_path, namespace=ns)
    for d in docs:
        if d["kind"] in paths:
            await client.request("POST", paths[d["kind"]], body=d)
    # The DaemonSet itself: accepted by the API server (server-side dry run).
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    await client.request(
        "POST", f"/apis/apps/v1/namespaces/{ns}/daemonsets", query=[("dryRun", "All")], body=ds
    )
    sa_path = await service_account_kubeconfig(
        client, node_cp, ns, "kallot-agent", tmp_path / "agent.kubeconfig"
    )

    await client.request(
        "POST",
        "/api/v1/nodes",
        body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "rbac-n1"}},
    )
    await client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "annotations": {device_record.ANNOTATION: '{"v":1,"node":"rbac-n1","devices":[]}'},
            },
            "spec": {
                "nodeName": "rbac-n1",
                "schedulerName": "kallot",
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )
    backend = FakeBackend.from_file(DATA / "pcie-l40s-8.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    agent = await NodeClient.connect(sa_path)
    try:
        await until_allowed(agent, "patch", "nodes")  # the role and its binding in force
        assert await Publisher(agent, "rbac-n1").publish(gfd_labels(inv), inv)
        source = ApiRecordSource(agent, "rbac-n1")
        (pod,) = await source.pods()
        await source.mark_allocated(pod)
        await Events(agent, "rbac-n1").on_pod(pod, "DevicesAllocated", "ok", warning=False)
        await Events(agent, "rbac-n1").on_node("GPUHealthy", "ok", warning=False)
        # And no more than that: the agent cannot delete pods.
        from kallot.k8sclient.errors import ApiError

        with pytest.raises(ApiError) as denied:
            await agent.request("DELETE", f"/api/v1/namespaces/{ns}/pods/p")
        assert denied.value.status == 403
    finally:
        await agent.close()
    node = await client.request("GET", "/api/v1/nodes/rbac-n1")
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert node["status"]["capacity"]["kallot.io/gpu-memory"] == f"{8 * 46068}Mi"
    events = await client.request("GET", f"/api/v1/namespaces/{ns}/events")
    assert [e["reason"] for e in events["items"]] == ["DevicesAllocated"]


@pytest.mark.controlplane
async def test_agent_token_is_confined_to_its_node(
    node_cp: ControlPlane, client: NodeClient, tmp_path: Path
) -> None:
    """One node's agent token tries every write on another node: each is refused (the
    chart's admission policy; RBAC alone allows them), and its own node's writes still work.
    The device record is the scheduler's: the agent may not write it even on its own node."""
    from kallot.k8sclient.api import MERGE_PATCH
    from kallot.k8sclient.errors import ApiError

    ns = "agent-confined"
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    paths = {
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "ValidatingAdmissionPolicy": (
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
        ),
        "ValidatingAdmissionPolicyBinding": (
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
        ),
    }
    docs = render(tmp_path, namespace=ns)
    assert any(d["kind"] == "ValidatingAdmissionPolicy" for d in docs)
    for d in docs:
        if d["kind"] in paths:
            d["metadata"]["name"] = f"{d['metadata']['name']}-confined"
            if d["kind"] == "ClusterRoleBinding":
                d["roleRef"]["name"] = f"{d['roleRef']['name']}-confined"
            if d["kind"] == "ValidatingAdmissionPolicyBinding":
                d["spec"]["policyName"] = f"{d['spec']['policyName']}-confined"
            if d["kind"] == "ServiceAccount":
                d["metadata"]["name"] = "kallot-agent"
            elif d["kind"] == "ClusterRoleBinding":
                d["subjects"][0]["name"] = "kallot-agent"
            await client.request("POST", paths[d["kind"]], body=d)
    for node in ("own-n", "other-n"):
        await client.request(
            "POST",
            "/api/v1/nodes",
            body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
        )
    record = '{"v":1,"node":"NODE","devices":[]}'
    for name, node in (("agent", "own-n"), ("mine", "own-n"), ("theirs", "other-n")):
        spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        meta: dict[str, Any] = {"name": name}
        if name == "agent":
            spec["serviceAccountName"] = "kallot-agent"
        else:
            meta["annotations"] = {device_record.ANNOTATION: record.replace("NODE", node)}
        await client.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods",
            body={"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec},
        )
    agent_pod = await client.request("GET", f"/api/v1/namespaces/{ns}/pods/agent")
    sa_path = await service_account_kubeconfig(
        client, node_cp, ns, "kallot-agent", tmp_path / "agent.kubeconfig", bound_pod=agent_pod
    )

    def label(value: str) -> dict[str, Any]:
        return {"metadata": {"labels": {"kallot.io/probe": value}}}

    def annotate(key: str, value: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {key: value}}}

    agent = await NodeClient.connect(sa_path)
    try:
        await until_allowed(agent, "patch", "nodes")  # the role and its binding in force
        # The API server loads admission policies asynchronously (testing.until_denied).
        await until_denied(
            lambda: agent.request(
                "PATCH",
                "/api/v1/nodes/other-n",
                query=[("dryRun", "All")],
                body=label("probe"),
                content_type=MERGE_PATCH,
            )
        )

        async def patch(path: str, body: dict[str, Any]) -> None:
            await agent.request("PATCH", path, body=body, content_type=MERGE_PATCH)

        refused = [
            ("/api/v1/nodes/other-n", label("x")),
            (
                "/api/v1/nodes/other-n/status",
                {"status": {"capacity": {"kallot.io/gpu-memory": "1"}}},
            ),
            (
                f"/api/v1/namespaces/{ns}/pods/theirs",
                annotate(device_record.BIND_PHASE, "allocated"),
            ),
            (
                f"/api/v1/namespaces/{ns}/pods/theirs",
                annotate(device_record.ANNOTATION, record.replace("NODE", "other-n")),
            ),
            (
                f"/api/v1/namespaces/{ns}/pods/mine",
                annotate(device_record.ANNOTATION, '{"v":1,"node":"own-n","devices":[]} '),
            ),
        ]
        for path, body in refused:
            with pytest.raises(ApiError) as denied:
                await patch(path, body)
            assert denied.value.status in (403, 422), (path, denied.value)
        # Its own node's writes go through.
        await patch("/api/v1/nodes/own-n", label("ok"))
        await patch(
            f"/api/v1/namespaces/{ns}/pods/mine", annotate(device_record.BIND_PHASE, "allocated")
        )
    finally:
        await agent.close()
    theirs = await client.request("GET", f"/api/v1/namespaces/{ns}/pods/theirs")
    assert device_record.BIND_PHASE not in theirs["metadata"]["annotations"]
    other = await client.request("GET", "/api/v1/nodes/other-n")
    assert "kallot.io/probe" not in (other["metadata"].get("labels") or {})
