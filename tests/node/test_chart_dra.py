"""The DRA driver in the Helm chart (``agent.dra.enabled``): rendered by the real helm; its flags
are ones ``kallot agent run`` accepts, its DeviceClasses are ``dra.device_classes()``, and its
RBAC + admission policy let an agent write its own node's ResourceSlices, not another node's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import typer.main

from kallot.k8sclient.errors import ApiError
from kallot.node import dra
from kallot.node.discovery import build_inventory
from kallot.node.dra_api import SLICES, ApiClaimSource, SlicePublisher
from kallot.node.fake import FakeBackend
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
DATA = Path(__file__).parent / "data"
RELEASE = "kdra"  # its own names: the package's API server also holds test_chart_agent's
SA = f"{RELEASE}-kallot-agent"


def render(tmp: Path, namespace: str, *sets: str) -> list[dict[str, Any]]:
    docs = helm_template(
        tmp, ROOT / "charts" / "kallot", release=RELEASE, namespace=namespace, sets=sets
    )
    return [
        d
        for d in docs
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "agent"
    ]


def test_dra_off_by_default_renders_nothing_of_it(tmp_path: Path) -> None:
    docs = render(tmp_path, "kallot-system")
    assert not [d for d in docs if d["kind"] == "DeviceClass" or "-dra-" in d["metadata"]["name"]]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    assert "--dra" not in ds["spec"]["template"]["spec"]["containers"][0]["args"]


def test_dra_daemonset_flags_mounts_and_device_classes(tmp_path: Path) -> None:
    docs = render(tmp_path, "kallot-system", "agent.dra.enabled=true")
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--dra" in c["args"] and "--no-device-plugin" in c["args"]
    from kallot.cli.main import app

    # The root group loads its commands lazily (cli.main): ask it, as click does on a run.
    group = typer.main.get_command(app)
    ctx = click.Context(group)
    run = group.get_command(ctx, "agent").get_command(ctx, "run")  # type: ignore[attr-defined]
    known = {opt for p in run.params for opt in [*p.opts, *p.secondary_opts]}
    for arg in c["args"][2:]:
        assert arg.split("=", 1)[0] in known, arg
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert paths["kubelet-plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert paths["kubelet-plugins"] == "/var/lib/kubelet/plugins"
    assert paths["cdi"] == "/var/run/cdi"
    mounted = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounted["kubelet-plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert "--kubelet-registry-dir=/var/lib/kubelet/plugins_registry" in c["args"]
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    assert [(d["metadata"]["name"], d["spec"]) for d in classes] == [
        (cls["metadata"]["name"], cls["spec"]) for cls in dra.device_classes()
    ]


async def test_dra_rbac_is_enough_and_scoped_to_the_node(
    node_cp: ControlPlane, client: NodeClient, tmp_path: Path
) -> None:
    ns = "agent-dra-rbac"
    await client.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
    )
    paths = {
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    }
    docs = render(tmp_path, ns, "agent.dra.enabled=true", "agent.dra.deviceClasses=false")
    for d in docs:
        if d["kind"] in paths:
            await client.request("POST", paths[d["kind"]], body=d)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    await client.request(
        "POST", f"/apis/apps/v1/namespaces/{ns}/daemonsets", query=[("dryRun", "All")], body=ds
    )
    for node in ("dra-own", "dra-other"):
        await client.request(
            "POST",
            "/api/v1/nodes",
            body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}},
        )
    # The agent's pod on dra-own: its bound token names the node.
    pod = await client.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "agent"},
            "spec": {
                "nodeName": "dra-own",
                "serviceAccountName": SA,
                "containers": [{"name": "c", "image": "busybox"}],
            },
        },
    )
    sa_path = await service_account_kubeconfig(
        client, node_cp, ns, SA, tmp_path / "agent.kubeconfig", bound_pod=pod
    )
    claim = await client.request(
        "POST",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "rbac-claim"},
            "spec": {
                "devices": {
                    "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.kallot.io"}}]
                }
            },
        },
    )
    backend = FakeBackend.from_file(DATA / "hgx-h100-8.yaml")
    inv = build_inventory(backend.raw(), backend.sharing())
    # every GPU in MIG mode: 5 slices (one of counters), so a smaller pool deletes some
    inv = inv.model_copy(
        update={
            "devices": tuple(d.model_copy(update={"mode": "mig", "mig": ()}) for d in inv.devices)
        }
    )
    agent = await NodeClient.connect(sa_path)
    try:
        # RBAC first (a refusal by it would end the loop below as the policy's would).
        await until_allowed(agent, "create", "resourceslices", group="resource.k8s.io")
        # The API server loads admission policies asynchronously (testing.until_denied).
        probe = dra.resource_slices(inv, dra.DraOptions(node="dra-other"))[0]
        await until_denied(
            lambda: agent.request("POST", SLICES, query=[("dryRun", "All")], body=probe)
        )
        own = SlicePublisher(agent, "dra-own")
        assert await own.publish(dra.resource_slices(inv, dra.DraOptions(node="dra-own")))
        # a change replaces and deletes slices of its own pool
        one = dra.resource_slices(inv, dra.DraOptions(node="dra-own", gpus={0}))
        assert len(one) < 5
        assert await own.publish(one)
        items = (await client.request("GET", SLICES))["items"]
        names = sorted(x["metadata"]["name"] for x in items if x["spec"]["nodeName"] == "dra-own")
        assert names == sorted(x["metadata"]["name"] for x in one)
        got = await ApiClaimSource(agent).claim("default", "rbac-claim")
        assert got["metadata"]["uid"] == claim["metadata"]["uid"]
        other = SlicePublisher(agent, "dra-other")
        with pytest.raises(ApiError) as denied:
            await other.publish(dra.resource_slices(inv, dra.DraOptions(node="dra-other")))
        # RBAC allows resourceslices on any node; the admission policy is what refuses this
        assert denied.value.status in (403, 422)
    finally:
        await agent.close()
