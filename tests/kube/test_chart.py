"""The Helm chart (charts/kallot) and deploy/kallot.yaml: rendered by the real helm, applied to
the real kube-apiserver (CRDs for real, the rest as a server-side dry-run), the CRDs' OpenAPI
schemas enforced, and the chart's least-privilege RBAC shown to be enough to schedule.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kallot.kube.api.client import APPLY_PATCH, ApiError, KubeClient
from kallot.testing.controlplane import controlplane_bin_dir, gpu_node_body, until_allowed
from kallot.testing.dra import claim, exactly, nvidia_classes, nvidia_node_slices
from kallot.testing.live import (
    Cluster,
    SchedulerProcess,
    inventory_node_body,
    pod_body,
    wait_until,
)

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kallot"

# kind -> (API prefix, plural, namespaced)
PATHS = {
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
}


def helm(tmp: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **{k: str(tmp) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")},
    }
    return subprocess.run(
        [str(controlplane_bin_dir() / "helm"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def render(
    tmp: Path, namespace: str = "kallot-system", release: str = "kallot", *values: str
) -> list[dict[str, Any]]:
    """``helm template`` with the CRDs; ``values``: extra ``--set``/``-f`` arguments."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    out = helm(tmp, *args, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _path(obj: dict[str, Any], *, collection: bool = False) -> str:
    prefix, plural, namespaced = PATHS[obj["kind"]]
    ns = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    base = f"{prefix}{ns}/{plural}"
    return base if collection else f"{base}/{obj['metadata']['name']}"


async def apply(client: KubeClient, obj: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
    query = [("fieldManager", "kallot-test"), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    return await client.request(
        "PATCH", _path(obj), query=query, body=obj, content_type=APPLY_PATCH
    )


def _scheduler_only(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scheduler's objects (the node agent's are tested in tests/node/test_chart_agent.py)."""
    return [
        d
        for d in docs
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "agent"
    ]


def test_chart_renders_two_replicas_and_least_privilege_rbac(tmp_path: Path) -> None:
    all_docs = render(tmp_path)
    agent = sorted(d["kind"] for d in all_docs if d not in _scheduler_only(all_docs))
    assert agent == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "NetworkPolicy",  # only Prometheus reaches the exporter (docs/security.md)
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",  # the agent confined to its node (docs/security.md)
        "ValidatingAdmissionPolicyBinding",
    ]
    docs = _scheduler_only(all_docs)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["CustomResourceDefinition"] * 2
        + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
        + ["Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy"]
        # only the scheduler writes device assignments (docs/security.md)
        + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        # who may scrape the secure ports (bound to subjects only with metrics.readers)
        + ["ClusterRole"]
    )
    reader = next(d for d in docs if d["metadata"]["name"] == "kallot-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "kallot"
    args = pod["containers"][0]["args"]
    assert "--leader-elect" in args and "--lease-namespace=kallot-system" in args
    for d in docs:
        for rule in d.get("rules", []):
            for key in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(key, []), f"{d['kind']} {d['metadata']['name']}: {rule}"
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    granted = {
        (g, r, v)
        for rule in cluster_role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # Nothing that writes pods or nodes beyond binding, eviction, the status condition and
    # events; of kallot's own objects only their status; claims and volumes are patched by
    # VolumeBinding's PreBind (selected-node, claimRef); ResourceClaims get the finalizer,
    # their allocation and reservedFor (DRA, kube.bind.claims).
    writes = {(g, r, v) for g, r, v in granted if v not in ("get", "list", "watch")}
    assert writes == {
        ("", "pods/binding", "create"),
        ("", "pods/eviction", "create"),
        ("", "pods/status", "patch"),
        ("", "events", "create"),
        ("kallot.io", "queues/status", "patch"),
        ("kallot.io", "podgroups/status", "patch"),
        ("", "persistentvolumeclaims", "patch"),
        ("", "persistentvolumes", "patch"),
        ("resource.k8s.io", "resourceclaims", "update"),
        ("resource.k8s.io", "resourceclaims", "create"),  # special claims (extended resources)
        ("resource.k8s.io", "resourceclaims", "delete"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/binding", "update"),
        # the secure port's delegated authn/authz (who a scrape is, may they get /metrics)
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }
    crds = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert crds == {"podgroups.kallot.io", "queues.kallot.io"}


def test_mig_reconfigure_adds_only_the_node_verbs_it_needs(tmp_path: Path) -> None:
    def rules(docs: list[dict[str, Any]], name: str) -> set[tuple[str, str, str]]:
        role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)
        return {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    off = render(tmp_path)
    on = render(tmp_path, "kallot-system", "kallot", "--set", "agent.migReconfigure=true")
    assert rules(on, "kallot") - rules(off, "kallot") == {("", "nodes", "patch")}
    assert rules(on, "kallot-agent") - rules(off, "kallot-agent") == {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
    }
    ds = next(d for d in on if d["kind"] == "DaemonSet")
    assert "--mig-reconfigure" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    ds_off = next(d for d in off if d["kind"] == "DaemonSet")
    assert "--mig-reconfigure" not in ds_off["spec"]["template"]["spec"]["containers"][0]["args"]


def test_autoscale_config_adds_its_verbs_and_the_placeholder_priority_class(
    tmp_path: Path,
) -> None:
    def rules(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        role = next(
            d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "kallot"
        )
        return {
            (g, r, v)
            for rule in role["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    off = render(tmp_path)
    on = render(
        tmp_path,
        "kallot-system",
        "kallot",
        "--set",
        "schedulerConfig.autoscale.provisioner=karpenter",
    )
    assert rules(on) - rules(off) == {
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods", "patch"),
        ("", "nodes", "patch"),  # kallot.io/capacity-taken
        ("", "podtemplates", "create"),
        ("", "podtemplates", "delete"),
        *(
            ("autoscaling.x-k8s.io", "provisioningrequests", v)
            for v in ("get", "list", "create", "delete")
        ),
        ("policy", "poddisruptionbudgets", "list"),
    }
    (pc,) = [d for d in on if d["kind"] == "PriorityClass"]
    assert pc["metadata"]["name"] == "kallot-capacity-placeholder" and pc["value"] < 0
    assert not [d for d in off if d["kind"] == "PriorityClass"]


def test_deploy_manifests_are_the_rendered_chart(tmp_path: Path) -> None:
    committed = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kallot.yaml").read_text()) if d]
    assert committed[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "kallot-system"},
    }
    assert committed[1:] == render(tmp_path), (
        "deploy/kallot.yaml is stale: run bash deploy/render.sh"
    )


async def test_chart_applies_to_the_real_apiserver(cluster: Cluster, tmp_path: Path) -> None:
    docs = render(tmp_path, namespace=cluster.ns)
    kc = await KubeClient.connect(cluster.cp.kubeconfig_path)
    try:
        for crd in [d for d in docs if d["kind"] == "CustomResourceDefinition"]:
            await apply(kc, crd, dry_run=False)

        async def established() -> bool:
            for crd in [d for d in docs if d["kind"] == "CustomResourceDefinition"]:
                got = await kc.get(_path(crd))
                conds = {
                    c["type"]: c["status"]
                    for c in (got.get("status") or {}).get("conditions") or []
                }
                if conds.get("Established") != "True":
                    return False
            return True

        for _ in range(200):
            if await established():
                break
            await asyncio.sleep(0.05)
        assert await established()
        for d in docs:
            if d["kind"] != "CustomResourceDefinition":
                answer = await apply(kc, d, dry_run=True)
                assert answer["kind"] == d["kind"]
        # Dry run: nothing was created.
        with pytest.raises(ApiError) as missing:
            await kc.get(f"/apis/apps/v1/namespaces/{cluster.ns}/deployments/kallot")
        assert missing.value.not_found

        # The OpenAPI schemas are enforced by the API server.
        groups = f"/apis/kallot.io/v1alpha1/namespaces/{cluster.ns}/podgroups"
        with pytest.raises(ApiError) as bad:
            await kc.create(
                groups,
                {
                    "apiVersion": "kallot.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": {"name": "g0"},
                    "spec": {"minAvailable": 0},
                },
            )
        assert bad.value.status == 422 and "spec.minAvailable" in bad.value.message
        with pytest.raises(ApiError) as bad_mode:
            await kc.create(
                groups,
                {
                    "apiVersion": "kallot.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": {"name": "g1"},
                    "spec": {"minAvailable": 2, "topology": {"mode": "sometimes", "level": "rack"}},
                },
            )
        assert bad_mode.value.status == 422 and "spec.topology.mode" in bad_mode.value.message
        ok = await kc.create(
            groups,
            {
                "apiVersion": "kallot.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "g2"},
                "spec": {"minAvailable": 2, "queue": "research"},
            },
        )
        assert ok["spec"] == {"minAvailable": 2, "queue": "research"}
        queue = await kc.create(
            "/apis/kallot.io/v1alpha1/queues",
            {
                "apiVersion": "kallot.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": f"q-{cluster.run}"},
                "spec": {"resources": {"gpu": {"quota": "2.5"}}},
            },
        )
        assert queue["spec"]["resources"]["gpu"] == {"quota": "2.5", "overQuotaWeight": 1}
        await kc.delete(f"/apis/kallot.io/v1alpha1/queues/q-{cluster.run}")
    finally:
        await kc.close()


def test_chart_rbac_is_enough_to_schedule(cluster: Cluster, tmp_path: Path) -> None:
    """The scheduler running as the chart's ServiceAccount (a real token, RBAC on) binds a pod,
    allocates a pod's ResourceClaim (finalizer, status.allocation and reservedFor: v1.36
    checks ``resourceclaims/binding``), writes the condition and Events, and holds the Lease:
    the listed verbs are enough."""
    docs = _scheduler_only(render(tmp_path, namespace=cluster.ns))
    rbac = [
        d
        for d in docs
        if d["kind"]
        in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    ]
    # Per-test names for the cluster-scoped objects, so tests do not share them.
    for d in rbac:
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] = d["metadata"]["name"].replace(
                "kallot", f"kallot-{cluster.run}", 1
            )
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] = d["roleRef"]["name"].replace(
                "kallot", f"kallot-{cluster.run}", 1
            )

    async def setup() -> str:
        kc = await KubeClient.connect(cluster.cp.kubeconfig_path)
        try:
            for d in rbac:
                await apply(kc, d, dry_run=False)
            answer = await kc.create(
                f"/api/v1/namespaces/{cluster.ns}/serviceaccounts/kallot/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600},
                },
            )
            return str(answer["status"]["token"])
        finally:
            await kc.close()

    token = asyncio.run(setup())
    kubeconfig = yaml.safe_load(cluster.cp.kubeconfig_path.read_text())
    kubeconfig["users"][0]["user"] = {"token": token}
    sa_config = tmp_path / "sa.kubeconfig"
    sa_config.write_text(yaml.safe_dump(kubeconfig))

    async def in_force() -> None:
        # The ClusterRole and the leader-election Role, each through its binding: a refusal
        # before the authorizer read them would be a "forbidden" in the scheduler's log.
        kc = await KubeClient.connect(sa_config)
        try:
            await until_allowed(kc, "create", "pods", subresource="binding")
            await until_allowed(
                kc, "create", "leases", group="coordination.k8s.io", namespace=cluster.ns
            )
        finally:
            await kc.close()

    asyncio.run(in_force())

    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 2)])
    dra_node = f"{cluster.run}-dra"
    cluster.add_nodes([gpu_node_body(dra_node, gpus=0)])
    co = client.CustomObjectsApi(cluster.api)
    for cls in nvidia_classes():
        try:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", cls)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    slices = nvidia_node_slices(dra_node, gpus=1)
    for sl in slices:
        co.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", sl)
    body = claim("gpu", [exactly("gpu", "gpu.nvidia.com")], namespace=cluster.ns)
    del body["metadata"]["uid"]
    co.create_namespaced_custom_object("resource.k8s.io", "v1", cluster.ns, "resourceclaims", body)
    s = SchedulerProcess(
        sa_config,
        tmp_path / "sa-scheduler.log",
        identity="sa",
        leader_elect=True,
        lease_name="kallot",
        lease_namespace=cluster.ns,
    )
    cluster.schedulers.append(s)
    cluster.create_pods(
        [
            pod_body("ok", resources={"nvidia.com/gpu": "1"}),
            pod_body("too-big", resources={"nvidia.com/gpu": "3"}),
        ]
    )
    dra_pod = pod_body("dra")
    dra_pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu"}]
    dra_pod["spec"]["containers"][0].setdefault("resources", {})["claims"] = [{"name": "gpu"}]
    cluster.create_pods([dra_pod])
    try:
        wait_until(
            lambda: s.check_alive() and cluster.settled(), timeout=30, what="the pods decided"
        )
        assert cluster.pod("dra")["spec"]["nodeName"] == dra_node, s.log_tail(50)
        got = co.get_namespaced_custom_object(
            "resource.k8s.io", "v1", cluster.ns, "resourceclaims", "gpu"
        )
        assert isinstance(got, dict)  # the client annotates custom objects as object
        assert got["status"]["allocation"]["devices"]["results"][0]["pool"] == dra_node
        assert got["status"]["reservedFor"][0]["name"] == "dra"
        # An extended resource served by DRA (no node advertises it): the special claim is
        # created and the pod's status names it.
        ext_node = gpu_node_body(f"{cluster.run}-ext", gpus=0)
        for part in ("capacity", "allocatable"):
            del ext_node["status"][part]["nvidia.com/gpu"]
        cluster.add_nodes([ext_node])
        more = nvidia_node_slices(f"{cluster.run}-ext", gpus=1)
        for sl in more:
            co.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", sl)
        slices += more
        implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
        cluster.create_pods([pod_body("ext", resources={implicit: "1"})])
        wait_until(
            lambda: s.check_alive() and cluster.pod("ext")["spec"].get("nodeName"),
            timeout=30,
            what="the extended-resource pod bound",
        )
        pod = cluster.pod("ext")
        assert pod["spec"]["nodeName"] == f"{cluster.run}-ext"
        assert pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    finally:
        for sl in slices:
            co.delete_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", sl["metadata"]["name"]
            )
    assert cluster.pod("ok")["spec"]["nodeName"] == f"{cluster.run}-n0"
    # Events are written after the bind and the condition, by the reporter's own queue: wait for
    # them rather than read them at the instant both pods were decided.
    wait_until(
        lambda: s.check_alive() and {"Scheduled", "FailedScheduling"} <= _reasons(cluster),
        timeout=30,
        what="a Scheduled and a FailedScheduling Event",
    )
    assert "forbidden" not in s.log_tail(200).lower(), s.log_tail(200)
    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease("kallot", cluster.ns)
    assert lease.spec is not None
    assert lease.spec.holder_identity == "sa"


def _all_bound(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.pods()
    return pods if all(p["spec"].get("nodeName") for p in pods) else []


def test_gang_waits_for_its_pod_group_then_binds_all_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.install_crds([d for d in render(tmp_path) if d["kind"] == "CustomResourceDefinition"])
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 4) for i in range(2)])
    s = cluster.scheduler()
    gang = {"kallot.io/pod-group": "train"}
    # 3 members x 4 GPUs on 2 nodes x 4 GPUs: only 2 fit, so none may be bound.
    cluster.create_pods(
        [pod_body(f"w{i}", resources={"nvidia.com/gpu": "4"}, labels=gang) for i in range(3)]
    )
    pods = wait_until(
        lambda: s.check_alive() and cluster.settled(ps := cluster.pods()) and ps,
        timeout=30,
        what="the members to wait for their PodGroup",
    )
    assert all(
        "waiting for PodGroup train" in p["status"]["conditions"][0]["message"] for p in pods
    )
    cluster.create_pod_group("train", minAvailable=3)
    wait_until(
        lambda: (
            all(
                "PodGroup" not in c.get("message", "") and c["status"] == "False"
                for p in cluster.pods()
                for c in p["status"]["conditions"]
            )
            and cluster.settled()
        ),
        timeout=30,
        what="the gang to be tried and found too big",
    )
    assert not any(p["spec"].get("nodeName") for p in cluster.pods())  # all or nothing
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n2", 4)])
    pods = wait_until(
        lambda: s.check_alive() and _all_bound(cluster),
        timeout=30,
        what="the whole gang bound once a third node joined",
    )
    assert len({p["spec"]["nodeName"] for p in pods}) == 3
    cluster.assert_no_overcommit(pods)


def _reasons(cluster: Cluster) -> set[str]:
    return {e["reason"] for e in cluster.events()}


# -- the chart as operators expect it ---------------------------------------------------------

EVERYTHING = (
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "grafana.dashboard.enabled=true",
    "--set",
    "imagePullSecrets[0].name=regcred",
    "--set",
    "podAnnotations.team=ml",
    "--set",
    "agent.podAnnotations.team=ml",
    "--set",
    "agent.migReconfigure=true",
    "--set",
    "extraArgs[0]=--max-session-pods=500",
    "--set",
    "agent.extraArgs[0]=--refresh-seconds=5",
)


def _selectors(d: dict[str, Any]) -> list[dict[str, str]]:
    """Every label selector an object holds (matchLabels form; Services' plain maps)."""
    spec = d.get("spec") or {}
    found: list[dict[str, str]] = []
    if d["kind"] == "Service":
        found.append(spec["selector"])
    elif "selector" in spec:
        found.append(spec["selector"]["matchLabels"])
    affinity = ((spec.get("template") or {}).get("spec") or {}).get("affinity") or {}
    for kind in affinity.values():
        for terms in kind.values():
            for term in terms:
                found.append(term.get("podAffinityTerm", term)["labelSelector"]["matchLabels"])
    return found


def test_no_selector_of_one_component_matches_the_other_s_pods(tmp_path: Path) -> None:
    docs = render(tmp_path, "kallot-system", "kallot", *EVERYTHING)
    pods = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["metadata"][
            "labels"
        ]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }
    assert set(pods) == {"scheduler", "agent"}
    checked = 0
    for d in docs:
        own = (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
        for selector in _selectors(d):
            matched = {
                comp
                for comp, labels in pods.items()
                if all(labels.get(k) == v for k, v in selector.items())
            }
            assert matched == {own}, f"{d['kind']} {d['metadata']['name']}: {selector}"
            checked += 1
    # Deployment, PDB, anti-affinity, 2 Services, 2 ServiceMonitors, DaemonSet.
    assert checked == 8


def test_helm_lint_strict_passes_with_defaults_and_with_everything_on(tmp_path: Path) -> None:
    for values in ((), EVERYTHING):
        out = helm(tmp_path, "lint", "--strict", str(CHART), *values, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize(
    ("values", "field"),
    [
        (("--set", "scheduler.policy=fastest"), "scheduler.policy"),
        (("--set", "replica=3"), "replica"),
        (("--set", "agent.sharing=mig"), "agent.sharing"),
        (("--set", "metrics.port=70000"), "metrics.port"),
        (("--set", "schedulerConfig.kind=KubeSchedulerConfiguration"), "schedulerConfig.kind"),
    ],
)
def test_values_schema_rejects_bad_values(
    tmp_path: Path, values: tuple[str, ...], field: str
) -> None:
    out = helm(tmp_path, "template", "kallot", str(CHART), *values, check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert field.rsplit(".", 1)[-1] in out.stderr


def test_values_schema_knows_every_policy_and_every_value(tmp_path: Path) -> None:
    import json

    from kallot.config import presets

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["scheduler"]["properties"]["policy"]["enum"]) == set(
        presets.PROFILES
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v: Any, s: dict[str, Any], where: str) -> None:
        if isinstance(v, dict) and "properties" in s:
            for k, sub in v.items():
                assert k in s["properties"], f"{where}{k} is not in values.schema.json"
                walk(sub, s["properties"][k], f"{where}{k}.")

    walk(values, schema, "")


def test_everything_on_renders_probes_pull_secrets_annotations_and_extra_args(
    tmp_path: Path,
) -> None:
    docs = render(tmp_path, "kallot-system", "kallot", *EVERYTHING)
    by_kind = {d["kind"]: d for d in docs if d["kind"] in ("Deployment", "DaemonSet")}
    extra = {"Deployment": "--max-session-pods=500", "DaemonSet": "--refresh-seconds=5"}
    for kind, d in by_kind.items():
        pod = d["spec"]["template"]
        assert pod["metadata"]["annotations"] == {"team": "ml"}
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        (c,) = pod["spec"]["containers"]
        assert c["args"][-1] == extra[kind]
        # Both ports speak HTTPS by default (docs/security.md, "Endpoints"); probes are open.
        https = {"port": "metrics", "scheme": "HTTPS"}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", **https}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", **https}
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(monitors) == 2 and len(services) == 2
    for m in monitors:
        svc = next(
            s
            for s in services
            if s["metadata"]["labels"]
            == {**s["metadata"]["labels"], **m["spec"]["selector"]["matchLabels"]}
        )
        assert [e["port"] for e in m["spec"]["endpoints"]] == [
            p["name"] for p in svc["spec"]["ports"]
        ]
        # Prometheus scrapes the secure ports with its own token over HTTPS.
        for e in m["spec"]["endpoints"]:
            assert e["scheme"] == "https" and e["bearerTokenFile"].endswith("/token"), e
    (dashboard,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert (
        dashboard["data"]["kallot.json"].strip()
        == (CHART / "dashboards" / "kallot.json").read_text().strip()
    )


def test_scheduler_config_is_a_mounted_config_map_passed_with_config(tmp_path: Path) -> None:
    from kallot.config import scheduler as scheduler_config

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "schedulerConfig": {
                    "profiles": [{"plugins": {"score": {"enabled": [{"name": "FGD"}]}}}],
                    "actions": {"reclaim": False},
                }
            }
        )
    )
    docs = render(tmp_path, "kallot-system", "kallot", "-f", str(values))
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (config_arg,) = [a for a in container["args"] if a.startswith("--config=")]
    assert not [a for a in container["args"] if a.startswith("--policy")]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    path = Path(config_arg.removeprefix("--config="))
    assert path.parent == Path(mount["mountPath"])
    # The file the scheduler reads validates (apiVersion and kind filled in by the chart).
    config = scheduler_config.parse(yaml.safe_load(cm["data"][path.name]))
    assert ("FGD", 1) in scheduler_config.to_profile(config).score
    assert config.actions.reclaim is False
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/scheduler-config"]
    # Without the value: no ConfigMap, the policy flag as before.
    plain = next(d for d in render(tmp_path) if d["kind"] == "Deployment")
    assert "--policy=kallot" in plain["spec"]["template"]["spec"]["containers"][0]["args"]


def test_notes_render(tmp_path: Path) -> None:
    out = helm(
        tmp_path, "install", "kallot", str(CHART), "--dry-run=client", "-n", "kallot-system"
    ).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "schedulerName: kallot" in notes
    assert "kallot doctor --namespace kallot-system" in notes
    assert "app.kubernetes.io/component=scheduler" in notes


def test_metrics_ports_admit_only_prometheus(tmp_path: Path) -> None:
    """The NetworkPolicies select exactly the scheduler's and the agents' pods and admit the
    configured peers to the metrics ports only; turning them off renders none."""
    docs = render(tmp_path)
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    workloads = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
    }
    for name, component in (("kallot-metrics", "scheduler"), ("kallot-agent-metrics", "agent")):
        spec = policies[name]
        pod_labels = workloads[component]["spec"]["template"]["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        ports = [
            p["containerPort"]
            for c in workloads[component]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
            if p["name"] == "metrics"
        ]
        assert [p["port"] for p in rule["ports"]] == ports
        assert rule["from"] == [
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ]
    off = render(
        tmp_path, "kallot-system", "kallot", "--set", "metrics.networkPolicy.enabled=false"
    )
    assert not [d for d in off if d["kind"] == "NetworkPolicy"]
