"""``kallot doctor`` on the real control plane: the chart installed (its CRDs, RBAC, Deployment
and DaemonSet; no kubelets, so no pod runs), then broken and mended one thing at a time; each
time the doctor, run as a user runs it, says exactly what is wrong. RBAC is asked of the real
authorizer; the Lease is held by a real scheduler.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kallot.kube.api.client import APPLY_PATCH, KubeClient
from kallot.kube.ops import doctor
from kallot.testing.controlplane import controlplane_bin_dir, gpu_node_body
from kallot.testing.live import (
    Cluster,
    SchedulerProcess,
    inventory_node_body,
    wait_until,
)

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kallot"
PATHS = {
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
}


def render(tmp: Path, namespace: str) -> list[dict[str, Any]]:
    env = {**os.environ, **dict.fromkeys(("HELM_CACHE_HOME", "HELM_CONFIG_HOME"), str(tmp))}
    out = subprocess.run(
        [
            *(str(controlplane_bin_dir() / "helm"), "template", "kallot", str(CHART)),
            *("--namespace", namespace, "--include-crds"),
        ],
        env={**env, "HELM_DATA_HOME": str(tmp)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def apply_all(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    async def go() -> None:
        kc = await KubeClient.connect(cluster.cp.kubeconfig_path)
        try:
            for d in docs:
                prefix, plural, namespaced = PATHS[d["kind"]]
                ns = f"/namespaces/{d['metadata']['namespace']}" if namespaced else ""
                await kc.request(
                    "PATCH",
                    f"{prefix}{ns}/{plural}/{d['metadata']['name']}",
                    query=[("fieldManager", "kallot-test"), ("force", "true")],
                    body=d,
                    content_type=APPLY_PATCH,
                )
        finally:
            await kc.close()

    asyncio.run(go())


def rbac_allows(cluster: Cluster, sa: str, group: str, resource: str, verb: str) -> bool:
    """What the API server's authorizer answers now for the ServiceAccount (as the doctor
    asks it): RBAC objects just applied take effect once the server's informers read them."""
    res, _, sub = resource.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{cluster.ns}:{sa}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{cluster.ns}"],
            "resourceAttributes": {
                "group": group,
                "resource": res,
                "subresource": sub,
                "verb": verb,
            },
        },
    }
    resp = client.AuthorizationV1Api(cluster.api).create_subject_access_review(
        client.V1SubjectAccessReview.model_validate(review), _preload_content=False
    )
    return bool(json.loads(resp.data).get("status", {}).get("allowed"))  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response


def run_doctor(cluster: Cluster) -> tuple[int, dict[str, list[str]]]:
    out = subprocess.run(
        [
            *(str(Path(sys.executable).parent / "kallot"), "doctor", "-n", cluster.ns),
            *("--kubeconfig", str(cluster.cp.kubeconfig_path)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in out.stderr, out.stderr
    found: dict[str, list[str]] = {}
    for line in out.stdout.splitlines()[:-1]:
        level, _, rest = line.strip().partition("  ")
        check, _, message = rest.partition(": ")
        found.setdefault(check, []).append(f"{level} {message}")
    return out.returncode, found


def _daemonset(name: str, image: str, command: list[str]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": image, "command": command}]},
            },
        },
    }


def test_doctor_reports_what_is_wrong_as_it_is_broken_and_mended(
    cluster: Cluster, tmp_path: Path
) -> None:
    docs = render(tmp_path, cluster.ns)
    cluster.install_crds([d for d in docs if d["kind"] == "CustomResourceDefinition"])
    objects = [d for d in docs if d["kind"] in PATHS]
    for d in objects:  # cluster-scoped names of this test only
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] += f"-{cluster.run}"
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] += f"-{cluster.run}"
    apply_all(cluster, objects)
    wait_until(
        lambda: (
            rbac_allows(cluster, "kallot", "kallot.io", "queues/status", "patch")
            and rbac_allows(cluster, "kallot-agent", "", "nodes/status", "patch")
        ),
        timeout=30,
        what="the chart's RBAC in force",
    )
    waiting = inventory_node_body(f"{cluster.run}-n1", 2)
    waiting["status"]["conditions"].append(
        {
            "type": "kallot.io/DevicePluginsReady",
            "status": "False",
            "reason": "KubeletNotSettled",
            "message": "the kubelet has not asked for the devices of nvidia.com/gpu yet",
        }
    )
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-n0", 4),
            gpu_node_body(f"{cluster.run}-bare", 2),
            waiting,
        ]
    )

    code, found = run_doctor(cluster)
    assert code == 1
    assert found["kubernetes"][0].startswith("ok API server v1.")
    assert found["crds"] == [
        "ok queues.kallot.io established, v1alpha1 with status",
        "ok podgroups.kallot.io established, v1alpha1 with status",
    ]
    # No controller manager and no kubelets here: nothing runs, and the doctor says so.
    assert found["scheduler"] == ["FAIL Deployment kallot: 0/2 replicas ready"]
    assert found["leader"] == [
        f"FAIL no Lease {cluster.ns}/kallot: no scheduler replica has led yet"
    ]
    assert found["rbac"] == [
        f"ok scheduler ServiceAccount kallot: all {len(doctor.SCHEDULER_ACCESS)} verbs",
        f"ok agent ServiceAccount kallot-agent: all {len(doctor.AGENT_ACCESS)} verbs",
    ]
    nodes, settling = found["nodes"]
    assert nodes.startswith("warn") and f"{cluster.run}-bare" in nodes
    assert f"{cluster.run}-n0" not in nodes
    assert settling == (
        "warn 1 GPU nodes have kallot.io/DevicePluginsReady False, kallot places no GPU pod "
        f"there until the kubelet settles: {cluster.run}-n1: the kubelet has not asked for the "
        "devices of nvidia.com/gpu yet"
    )
    assert found["device plugins"] == ["ok no other device plugin for nvidia.com/gpu"]
    (mps,) = found["mps"]
    assert mps.startswith("warn the agent shares GPUs with MPS but no MPS control daemon")
    assert "versions" not in found  # the chart runs this CLI's version

    # A real scheduler leads with the chart's Lease.
    s = SchedulerProcess(
        cluster.cp.kubeconfig_path,
        tmp_path / "scheduler.log",
        identity="doc",
        leader_elect=True,
        lease_name="kallot",
        lease_namespace=cluster.ns,
    )
    cluster.schedulers.append(s)
    coord = client.CoordinationV1Api(cluster.api)
    wait_until(
        lambda: s.check_alive() and _holder(coord, cluster.ns) == "doc",
        timeout=60,
        what="the scheduler to hold the Lease",
    )
    # NVIDIA's device plugin next to kallot's agent; an MPS control daemon; a lost permission.
    apps = client.AppsV1Api(cluster.api)
    apps.create_namespaced_daemon_set(
        cluster.ns,
        client.V1DaemonSet.model_validate(
            _daemonset(
                "nvidia-device-plugin-daemonset",
                "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                ["nvidia-device-plugin"],
            )
        ),
    )
    apps.create_namespaced_daemon_set(
        cluster.ns,
        client.V1DaemonSet.model_validate(
            _daemonset(
                "mps-control-daemon",
                "nvcr.io/nvidia/cuda:12.8.0-base",
                ["nvidia-cuda-mps-control", "-f"],
            )
        ),
    )
    role = next(
        d for d in objects if d["kind"] == "ClusterRole" and "agent" not in d["metadata"]["name"]
    )
    role["rules"] = [r for r in role["rules"] if "queues/status" not in r["resources"]]
    apply_all(cluster, [role])
    wait_until(
        lambda: not rbac_allows(cluster, "kallot", "kallot.io", "queues/status", "patch"),
        timeout=30,
        what="the narrowed ClusterRole in force",
    )

    code, found = run_doctor(cluster)
    assert code == 1
    assert found["leader"] == [f"ok Lease {cluster.ns}/kallot held by doc"]
    (plugins,) = found["device plugins"]
    assert plugins.startswith(f"FAIL {cluster.ns}/nvidia-device-plugin-daemonset also serve")
    (mps,) = found["mps"]
    assert mps.startswith(f"warn MPS control daemon {cluster.ns}/mps-control-daemon runs, but")
    assert "agent.mpsPipeDir" in mps
    rbac = found["rbac"]
    assert rbac[0] == (
        "FAIL scheduler ServiceAccount kallot may not: patch podgroups/status (kallot.io); "
        "patch queues/status (kallot.io) (re-apply the chart's RBAC)"
    )
    assert rbac[1].startswith("ok agent")
    rbac_api = client.RbacAuthorizationV1Api(cluster.api)
    for d in objects:
        if d["kind"] == "ClusterRole":
            rbac_api.delete_cluster_role(d["metadata"]["name"])
        elif d["kind"] == "ClusterRoleBinding":
            rbac_api.delete_cluster_role_binding(d["metadata"]["name"])


def _holder(coord: client.CoordinationV1Api, ns: str) -> str:
    try:
        spec = coord.read_namespaced_lease("kallot", ns).spec
        assert spec is not None
        return str(spec.holder_identity or "")
    except client.ApiException:
        return ""


def test_doctor_s_access_lists_are_the_chart_s_rbac(tmp_path: Path) -> None:
    docs = render(tmp_path, "kallot-system")

    def granted(name: str) -> set[tuple[str, str, str]]:
        role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)
        return {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    assert granted("kallot") == set(doctor.SCHEDULER_ACCESS)
    assert granted("kallot-agent") == set(doctor.AGENT_ACCESS)
