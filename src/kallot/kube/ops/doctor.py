"""``kallot doctor``: a preflight of a cluster for kallot, read-only, over ``KubeClient``.

Where it sits: beside the live scheduler, not in it; the CLI (``cli/doctor.py``) prints what
``diagnose`` finds. Each check reads the API (and asks the authorizer through
SubjectAccessReviews) and returns Findings: ``ok``, ``warn`` (works, but not as intended) or
``error`` (kallot will not work), each with what to do. Checks: the API server's version, the
Queue/PodGroup CRDs (established, status subresource, current schema), the scheduler
Deployment and its Lease, the RBAC of the scheduler's and the agent's ServiceAccounts (every
verb the chart grants, asked of the real authorizer), the agent DaemonSet and GPU nodes without
an inventory, other device plugins serving ``nvidia.com/gpu`` (NVIDIA's device plugin, the GPU
Operator's ClusterPolicy), an MPS control daemon when the agent shares GPUs with MPS, and that
the images run the same kallot version as this CLI.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kallot.config import wire
from kallot.config.inventory import ANNOTATION as ANN_INVENTORY
from kallot.kube import owners, translate
from kallot.kube.api.client import ApiError, KubeClient

Level = Literal["ok", "warn", "error"]

#: Oldest Kubernetes minor kallot accepts: it relies on pod scheduling gates (GA in 1.30); its
#: tests run on 1.36.
MIN_KUBE_MINOR = 30
CRD_GROUP = wire.CRD_GROUP
CRDS = (f"queues.{CRD_GROUP}", f"podgroups.{CRD_GROUP}")
#: A status field only the current CRDs have (older ones lack it: re-apply charts/kallot/crds).
CURRENT_STATUS_FIELD = {CRDS[0]: "guaranteed", CRDS[1]: "pending"}
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"

# (API group, resource, verb): what each component does, as the chart grants it
# (tests/kube/test_doctor.py checks these equal the chart's ClusterRoles).
# A secure port's delegated authentication and authorization (k8sclient.delegated).
DELEGATED_AUTH_ACCESS: tuple[tuple[str, str, str], ...] = (
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
)
SCHEDULER_ACCESS: tuple[tuple[str, str, str], ...] = (
    *DELEGATED_AUTH_ACCESS,
    *(("", r, v) for r in ("pods", "nodes") for v in ("get", "list", "watch")),
    ("", "pods/binding", "create"),
    ("", "pods/eviction", "create"),
    ("", "pods/status", "patch"),
    ("", "events", "create"),
    *((CRD_GROUP, r, v) for r in ("podgroups", "queues") for v in ("get", "list", "watch")),
    (CRD_GROUP, "podgroups/status", "patch"),
    (CRD_GROUP, "queues/status", "patch"),
    # volume topology (kube.bind.volumes: PreBind patches)
    *(
        ("", r, v)
        for r in ("persistentvolumeclaims", "persistentvolumes")
        for v in ("get", "list", "watch", "patch")
    ),
    *(("storage.k8s.io", "storageclasses", v) for v in ("get", "list", "watch")),
    # DRA (kube.dra.cache, kube.bind.claims)
    *(
        ("resource.k8s.io", r, v)
        for r in ("deviceclasses", "resourceslices")
        for v in ("get", "list", "watch")
    ),
    *(
        ("resource.k8s.io", "resourceclaims", v)
        for v in ("get", "list", "watch", "update", "create", "delete")
    ),
    ("resource.k8s.io", "resourceclaims/status", "update"),
    ("resource.k8s.io", "resourceclaims/binding", "update"),
    # the owner kinds the gangs and queues are derived from, Namespaces included (their labels
    # are also what namespaceSelector terms match): one entry each in kube.owners.KINDS
    *owners.ACCESS,
)
AGENT_ACCESS: tuple[tuple[str, str, str], ...] = (
    *DELEGATED_AUTH_ACCESS,  # the chart's default agent.metricsAuth=delegated
    *(("", "pods", v) for v in ("get", "list", "watch", "patch")),
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "nodes/status", "patch"),
    ("", "events", "create"),
)

# Another device plugin for nvidia.com/gpu: NVIDIA's (standalone or the GPU Operator's).
_OTHER_PLUGIN = re.compile(r"nvidia[-/]?(k8s-)?device-plugin|k8s-device-plugin", re.I)
_MPS_DAEMON = re.compile(r"mps-control|nvidia-cuda-mps|mps-control-daemon", re.I)


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    check: str
    message: str


def _ok(check: str, message: str) -> Finding:
    return Finding("ok", check, message)


def _warn(check: str, message: str) -> Finding:
    return Finding("warn", check, message)


def _error(check: str, message: str) -> Finding:
    return Finding("error", check, message)


@dataclass
class Doctor:
    client: KubeClient
    namespace: str
    version: str

    async def diagnose(self) -> list[Finding]:
        checks: Sequence[Callable[[], Awaitable[list[Finding]]]] = (
            self.api_version,
            self.crds,
            self.workloads,
            self.rbac,
            self.nodes,
            self.other_plugins,
            self.mps,
        )
        out: list[Finding] = []
        for check in checks:
            try:
                out += await check()
            except ApiError as exc:
                if exc.status == 0:  # no answer: every other check would fail the same way
                    out.append(
                        _error(
                            "kubernetes",
                            f"cannot reach the API server ({exc.message}); the other checks "
                            "need it: is the kubeconfig's server right and reachable?",
                        )
                    )
                    return out
                out.append(_error(check.__name__.replace("_", " "), f"cannot read: {exc}"))
        return out

    # -- individual checks -------------------------------------------------------------------

    async def api_version(self) -> list[Finding]:
        v = await self.client.get("/version")
        git = str(v.get("gitVersion", "?"))
        minor = int(re.sub(r"\D.*", "", str(v.get("minor", "0"))) or 0)
        if str(v.get("major")) == "1" and minor < MIN_KUBE_MINOR:
            return [
                _error("kubernetes", f"{git}: kallot needs Kubernetes 1.{MIN_KUBE_MINOR} or later")
            ]
        return [_ok("kubernetes", f"API server {git}, kallot CLI {self.version}")]

    async def crds(self) -> list[Finding]:
        out = []
        for name in CRDS:
            try:
                crd = await self.client.get(
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
            except ApiError as exc:
                if not exc.not_found:
                    raise
                out.append(
                    _error(
                        "crds",
                        f"{name} is missing: kubectl apply --server-side -f charts/kallot/crds/",
                    )
                )
                continue
            conds = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
            versions = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
            v1 = versions.get("v1alpha1")
            status_props = (
                ((v1 or {}).get("schema") or {})
                .get("openAPIV3Schema", {})
                .get("properties", {})
                .get("status", {})
                .get("properties", {})
            )
            if conds.get("Established") != "True":
                out.append(_error("crds", f"{name} is not established"))
            elif v1 is None or "status" not in (v1.get("subresources") or {}):
                out.append(_error("crds", f"{name} does not serve v1alpha1 with a status"))
            elif CURRENT_STATUS_FIELD[name] not in status_props:
                out.append(
                    _warn(
                        "crds",
                        f"{name} is older than this kallot (no status.{CURRENT_STATUS_FIELD[name]}):"
                        " kubectl apply --server-side -f charts/kallot/crds/",
                    )
                )
            else:
                out.append(_ok("crds", f"{name} established, v1alpha1 with status"))
        return out

    async def _workload(self, kind: str, component: str) -> dict[str, Any] | None:
        plural = "deployments" if kind == "Deployment" else "daemonsets"
        items, _ = await self.client.list_all(
            f"/apis/apps/v1/namespaces/{self.namespace}/{plural}",
            query=[("labelSelector", f"{LABEL_NAME}=kallot,{LABEL_COMPONENT}={component}")],
        )
        return items[0] if items else None

    async def workloads(self) -> list[Finding]:
        out = []
        dep = await self._workload("Deployment", "scheduler")
        if dep is None:
            out.append(
                _error(
                    "scheduler",
                    f"no kallot scheduler Deployment in namespace {self.namespace} "
                    "(helm install kallot charts/kallot -n NAMESPACE, or --namespace)",
                )
            )
        else:
            name = dep["metadata"]["name"]
            want = int(dep["spec"].get("replicas", 1))
            ready = int((dep.get("status") or {}).get("readyReplicas", 0))
            level = _ok if ready >= 1 else _error
            out.append(level("scheduler", f"Deployment {name}: {ready}/{want} replicas ready"))
            out += self._versions("scheduler", dep)
            out.append(await self._lease(dep))
        ds = await self._workload("DaemonSet", "agent")
        if ds is None:
            out.append(
                _warn(
                    "agent",
                    f"no kallot agent DaemonSet in namespace {self.namespace}: GPU nodes need "
                    "an inventory (docs/install.md, 'Coexistence')",
                )
            )
        else:
            st = ds.get("status") or {}
            want, ready = int(st.get("desiredNumberScheduled", 0)), int(st.get("numberReady", 0))
            level = _ok if ready == want and want > 0 else _warn
            out.append(
                level("agent", f"DaemonSet {ds['metadata']['name']}: {ready}/{want} pods ready")
            )
            out += self._versions("agent", ds)
        return out

    async def _lease(self, dep: Mapping[str, Any]) -> Finding:
        args = _args(dep)
        if args.get("--leader-elect") == "false" or "--no-leader-elect" in args:
            return _ok("leader", "leader election off")
        ns = args.get("--lease-namespace", "kube-system")
        name = args.get("--lease-name", "kallot-scheduler")
        try:
            lease = await self.client.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"
            )
        except ApiError as exc:
            if not exc.not_found:
                raise
            return _error("leader", f"no Lease {ns}/{name}: no scheduler replica has led yet")
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        if not holder:
            return _error("leader", f"Lease {ns}/{name} has no holder: no replica leads")
        return _ok("leader", f"Lease {ns}/{name} held by {holder}")

    def _versions(self, component: str, workload: Mapping[str, Any]) -> list[Finding]:
        images = [c["image"] for c in workload["spec"]["template"]["spec"]["containers"]]
        tags = {i.rpartition(":")[2] for i in images if ":" in i.rpartition("/")[2]}
        if tags and tags != {self.version}:
            return [
                _warn(
                    "versions",
                    f"{component} runs {', '.join(images)}; this CLI is kallot {self.version}",
                )
            ]
        return []

    async def rbac(self) -> list[Finding]:
        out = []
        for component, kind, needed in (
            ("scheduler", "Deployment", SCHEDULER_ACCESS),
            ("agent", "DaemonSet", AGENT_ACCESS),
        ):
            w = await self._workload(kind, component)
            if w is None:
                continue
            pod_spec = w["spec"]["template"]["spec"]
            args = [a for c in pod_spec.get("containers", ()) for a in c.get("args") or ()]
            access = needed
            if component == "agent" and "--metrics-auth=delegated" not in args:
                access = tuple(a for a in needed if a not in DELEGATED_AUTH_ACCESS)
            sa = pod_spec.get("serviceAccountName") or "default"
            user = f"system:serviceaccount:{self.namespace}:{sa}"
            denied = [
                f"{verb} {resource}" + (f" ({group})" if group else "")
                for group, resource, verb in access
                if not await self._allowed(user, sa, group, resource, verb)
            ]
            if denied:
                out.append(
                    _error(
                        "rbac",
                        f"{component} ServiceAccount {sa} may not: {'; '.join(denied)} "
                        "(re-apply the chart's RBAC)",
                    )
                )
            else:
                out.append(_ok("rbac", f"{component} ServiceAccount {sa}: all {len(access)} verbs"))
        return out

    async def _allowed(self, user: str, sa: str, group: str, resource: str, verb: str) -> bool:
        res, _, sub = resource.partition("/")
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{self.namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "group": group,
                    "resource": res,
                    "subresource": sub,
                    "verb": verb,
                    "namespace": "",
                },
            },
        }
        answer = await self.client.create(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
        )
        return bool((answer.get("status") or {}).get("allowed"))

    async def nodes(self) -> list[Finding]:
        nodes, _ = await self.client.list_all("/api/v1/nodes")
        gpu = [n for n in nodes if _has_gpus(n)]
        missing = sorted(
            n["metadata"]["name"]
            for n in gpu
            if ANN_INVENTORY not in (n["metadata"].get("annotations") or {})
        )
        if not gpu:
            return [_warn("nodes", "no node has GPUs (nvidia.com/gpu) or a kallot inventory")]
        out = []
        waiting = sorted(
            (n["metadata"]["name"], why) for n in gpu if (why := translate.plugins_not_serving(n))
        )
        if waiting:
            name, why = waiting[0]
            more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
            out.append(
                _warn(
                    "nodes",
                    f"{len(waiting)} GPU nodes have {wire.CONDITION_DEVICE_PLUGINS_READY} False, "
                    f"kallot places no GPU pod there until the kubelet settles: {name}: {why}{more}",
                )
            )
        if missing:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            return [
                _warn(
                    "nodes",
                    f"{len(missing)} of {len(gpu)} GPU nodes have no kallot inventory ({shown}): "
                    "kallot places whole GPUs only there; run the agent on them",
                ),
                *out,
            ]
        return out or [_ok("nodes", f"{len(gpu)} GPU nodes, all with a kallot inventory")]

    async def other_plugins(self) -> list[Finding]:
        daemonsets, _ = await self.client.list_all("/apis/apps/v1/daemonsets")
        others = sorted(
            f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for d in daemonsets
            if (d["metadata"].get("labels") or {}).get(LABEL_NAME) != "kallot"
            and any(_OTHER_PLUGIN.search(t) for t in _texts(d))
        )
        out = []
        if others and await self._workload("DaemonSet", "agent") is not None:
            out.append(
                _error(
                    "device plugins",
                    f"{', '.join(others)} also serve nvidia.com/gpu next to kallot's agent: the "
                    "kubelet keeps only one plugin per resource; disable it on kallot's nodes or "
                    "run kallot without the agent (docs/install.md, 'Coexistence')",
                )
            )
        elif others:
            out.append(
                _ok(
                    "device plugins",
                    f"NVIDIA's device plugin serves nvidia.com/gpu ({', '.join(others)}); kallot "
                    "schedules whole GPUs only (no agent)",
                )
            )
        policies = await self._cluster_policies()
        enabled = [
            p
            for p in policies
            if ((p.get("spec") or {}).get("devicePlugin") or {}).get("enabled", True)
        ]
        if enabled and await self._workload("DaemonSet", "agent") is not None:
            out.append(
                _error(
                    "device plugins",
                    f"GPU Operator ClusterPolicy {enabled[0]['metadata']['name']} runs its device "
                    "plugin: set devicePlugin.enabled=false (docs/install.md, 'Coexistence')",
                )
            )
        if not out:
            out.append(_ok("device plugins", "no other device plugin for nvidia.com/gpu"))
        return out

    async def _cluster_policies(self) -> list[dict[str, Any]]:
        try:
            items, _ = await self.client.list_all("/apis/nvidia.com/v1/clusterpolicies")
        except ApiError as exc:
            if exc.not_found:  # no GPU Operator
                return []
            raise
        return items

    async def mps(self) -> list[Finding]:
        ds = await self._workload("DaemonSet", "agent")
        if ds is None or _args(ds).get("--sharing", "mps") != "mps":
            return []
        daemonsets, _ = await self.client.list_all("/apis/apps/v1/daemonsets")
        daemons = sorted(
            f"{d['metadata']['namespace']}/{d['metadata']['name']}"
            for d in daemonsets
            if any(_MPS_DAEMON.search(t) for t in _texts(d))
        )
        if not daemons:
            return [
                _warn(
                    "mps",
                    "the agent shares GPUs with MPS but no MPS control daemon DaemonSet runs: "
                    "agents advertise no MPS shares without one (docs/install.md, 'MPS')",
                )
            ]
        if not _args(ds).get("--mps-pipe-dir"):
            return [
                _warn(
                    "mps",
                    f"MPS control daemon {', '.join(daemons)} runs, but the agent has no "
                    "--mps-pipe-dir (chart value agent.mpsPipeDir): it cannot see the daemon and "
                    "advertises MPS GPUs whole",
                )
            ]
        return [_ok("mps", f"MPS control daemon: {', '.join(daemons)}")]


def _has_gpus(node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    if ANN_INVENTORY in (meta.get("annotations") or {}):
        return True
    if (meta.get("labels") or {}).get(wire.LABEL_GFD_PRESENT) == "true":
        return True
    capacity = (node.get("status") or {}).get("capacity") or {}
    return str(capacity.get(translate.RESOURCE_GPU, "0")) not in ("0", "")


def _args(workload: Mapping[str, Any]) -> dict[str, str]:
    """``--flag=value`` arguments of the workload's first container (``--flag``: "true")."""
    c = workload["spec"]["template"]["spec"]["containers"][0]
    out = {}
    for a in [*(c.get("command") or []), *(c.get("args") or [])]:
        key, sep, value = str(a).partition("=")
        out[key] = value if sep else "true"
    return out


def _texts(workload: Mapping[str, Any]) -> Iterable[str]:
    """Name, images, commands and args of a workload: what identifies what it runs."""
    yield str(workload["metadata"]["name"])
    spec = workload["spec"]["template"]["spec"]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        yield str(c.get("image", ""))
        yield from (str(x) for x in [*(c.get("command") or []), *(c.get("args") or [])])
