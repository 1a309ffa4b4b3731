"""Differential conformance against the real kube-scheduler (no GPUs).

Hypothesis (derandomized: the same cases every run) draws small clusters: nodes with zone /
rack / disk / generation labels, taints of every effect, cordons, pod limits and an extended
resource; pods already bound there (labels, required anti-affinity, host ports); PVs bound to
one node with their claims; then pending pods using every field of docs/pod-api.md's
"Kubernetes constraints": tolerations, nodeSelector, node affinity (required and preferred, all
operators, matchFields), pod affinity and anti-affinity (required and preferred, hostname / zone
/ rack keys, namespaces, namespaceSelector, matchExpressions), topology spread (both
whenUnsatisfiable, minDomains, nodeTaintsPolicy), host ports, extended resources, overhead-free
requests and PVCs (bound, missing, unbound immediate).

For each pending pod, kallot decides in-process over the objects the API server holds (the
live scheduler's own translate -> cache -> core path; the pod is a server-side dry-run of the
real object, so defaults and admission are applied), then the same pod goes to the real
kube-scheduler on the same control plane:

- kallot chose node N: the pod, pinned to N (a ``metadata.name`` matchFields requirement added
  to its node affinity), must be bound to N by kube-scheduler;
- kallot found no node: the unpinned pod must be refused by kube-scheduler too.

The pod kube-scheduler bound stays, so the next pod of the case sees it, as kallot would.
``KALLOT_CONFORMANCE_EXAMPLES`` sets the number of clusters (CI default 40; the release run in
BENCHMARKS.md uses 2,000).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from kallot.core.status import Diagnosis
from kallot.kube.state.volumes import ANN_BIND_COMPLETED
from kallot.testing.controlplane import ControlPlane, create_nodes_sync
from kallot.testing.k8s_objects import kallot_decide, node_obj, pod_obj

pytestmark = pytest.mark.controlplane

EXAMPLES = int(os.environ.get("KALLOT_CONFORMANCE_EXAMPLES", "40"))
CASE_LABEL = "kallot.io/conformance"
NAMESPACES = {"cf-a": {"env": "prod"}, "cf-b": {"env": "dev"}}
BARRIER_NS = "cf-barrier"
VERDICT_TIMEOUT_S = 60.0

TAINTS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
    {"key": "soft", "value": "", "effect": "PreferNoSchedule"},
    {"key": "evict", "value": "x", "effect": "NoExecute"},
]
TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
    {"key": "dedicated", "operator": "Equal", "value": "infra"},
    {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
    {"key": "evict", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"operator": "Exists"},
]
NODE_EXPRS = [
    {"key": "zone", "operator": "In", "values": ["z1", "z2"]},
    {"key": "zone", "operator": "NotIn", "values": ["z1"]},
    {"key": "disk", "operator": "Exists"},
    {"key": "rack", "operator": "DoesNotExist"},
    {"key": "gen", "operator": "Gt", "values": ["2"]},
    {"key": "gen", "operator": "Lt", "values": ["4"]},
]
POD_SELECTORS = [
    {"matchLabels": {"app": "a"}},
    {"matchLabels": {"app": "b"}},
    {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]},
    {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
    {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["c"]}]},
    {},
]
TOPOLOGY_KEYS = ["kubernetes.io/hostname", "zone", "rack"]
DONGLE = "example.com/dongle"

_case_ids = itertools.count()
# What the run checked, printed at the end (-s): verdicts and the fields the pods used.
STATS: Counter[str] = Counter()


# -- strategies ----------------------------------------------------------------------------------


@st.composite
def node_bodies(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(2, 5))):
        labels = {CASE_LABEL: "1"}
        for key, values in (
            ("zone", ["z1", "z2", "z3"]),
            ("rack", ["r1", "r2"]),
            ("disk", ["ssd", "hdd"]),
            ("gen", ["1", "3", "5"]),
        ):
            value = draw(st.sampled_from([*values, None]))
            if value is not None:
                labels[key] = value
        dongles = draw(st.sampled_from([None, "1", "2"]))
        out.append(
            node_obj(
                f"{prefix}-n{i}",
                cpu=draw(st.sampled_from(["2", "4", "8"])),
                memory="4Gi",
                pods=draw(st.sampled_from([4, 110])),
                labels=labels,
                taints=draw(
                    st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=lambda t: t["key"])
                )
                if draw(st.booleans())
                else [],
                unschedulable=draw(st.integers(0, 7)) == 7,
                extra={DONGLE: dongles} if dongles else None,
            )
        )
    return out


def _pod_term(draw: st.DrawFn) -> dict[str, Any]:
    term: dict[str, Any] = {
        "labelSelector": draw(st.sampled_from(POD_SELECTORS)),
        "topologyKey": draw(st.sampled_from(TOPOLOGY_KEYS)),
    }
    ns = draw(st.sampled_from(["own", "list", "selector", "all"]))
    if ns == "list":
        term["namespaces"] = ["cf-b"]
    elif ns == "selector":
        term["namespaceSelector"] = {"matchLabels": {"env": "prod"}}
    elif ns == "all":
        term["namespaceSelector"] = {}
    return term


@st.composite
def pod_spec(
    draw: st.DrawFn, name: str, nodes: list[str], claims: list[str], bound: bool
) -> dict[str, Any]:
    labels = {"app": draw(st.sampled_from(["a", "b", "c"]))}
    tier = draw(st.sampled_from([None, "gold", "silver"]))
    if tier:
        labels["tier"] = tier
    affinity: dict[str, Any] = {}
    spread: list[dict[str, Any]] = []
    node_selector = None
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["podAffinity", "podAntiAffinity"]))
        block: dict[str, Any] = {}
        if draw(st.booleans()) or bound:
            block["requiredDuringSchedulingIgnoredDuringExecution"] = [_pod_term(draw)]
        if not bound and draw(st.booleans()):
            block["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": draw(st.integers(1, 100)), "podAffinityTerm": _pod_term(draw)}
            ]
        if block:
            affinity[kind] = block
    if not bound and draw(st.integers(0, 2)) == 2:
        # Spread constraints; pinning by node affinity would shrink the domains kube-scheduler
        # counts (nodeAffinityPolicy Honor), so such pods carry no node affinity of their own.
        c: dict[str, Any] = {
            "maxSkew": draw(st.integers(1, 2)),
            "topologyKey": draw(st.sampled_from(TOPOLOGY_KEYS)),
            "whenUnsatisfiable": draw(st.sampled_from(["DoNotSchedule", "ScheduleAnyway"])),
            "labelSelector": {"matchLabels": {"app": labels["app"]}},
        }
        if c["whenUnsatisfiable"] == "DoNotSchedule" and draw(st.booleans()):
            c["minDomains"] = draw(st.integers(2, 3))
        taints_policy = draw(st.sampled_from([None, "Honor", "Ignore"]))
        if taints_policy:
            c["nodeTaintsPolicy"] = taints_policy
        spread.append(c)
    elif not bound:
        if draw(st.booleans()):
            node_selector = draw(st.sampled_from([{"disk": "ssd"}, {"zone": "z1"}, {"rack": "r2"}]))
        if draw(st.booleans()):
            terms = []
            for _ in range(draw(st.integers(1, 2))):
                term: dict[str, Any] = {
                    "matchExpressions": draw(
                        st.lists(st.sampled_from(NODE_EXPRS), min_size=1, max_size=2)
                    )
                }
                if draw(st.integers(0, 3)) == 3:
                    term["matchFields"] = [
                        {
                            "key": "metadata.name",
                            "operator": "In",
                            "values": [draw(st.sampled_from(nodes))],
                        }
                    ]
                terms.append(term)
            affinity["nodeAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        if draw(st.booleans()):
            affinity.setdefault("nodeAffinity", {})[
                "preferredDuringSchedulingIgnoredDuringExecution"
            ] = [
                {
                    "weight": draw(st.integers(1, 100)),
                    "preference": {"matchExpressions": [draw(st.sampled_from(NODE_EXPRS))]},
                }
            ]
    ports: list[dict[str, Any]] = []
    if draw(st.integers(0, 2)) == 2:
        ports = draw(
            st.sampled_from(
                [
                    [{"hostPort": 8080}],
                    [{"hostPort": 8080, "protocol": "UDP"}],
                    [{"hostPort": 8080, "hostIP": "127.0.0.1"}],
                ]
            )
        )
    body = pod_obj(
        name,
        namespace=draw(st.sampled_from(sorted(NAMESPACES))),
        cpu=draw(st.sampled_from(["100m", "500m", "1", "1500m"])),
        memory="64Mi",
        labels=labels,
        scheduler="default-scheduler",
        tolerations=draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2)),
        affinity=affinity or None,
        node_selector=node_selector,
        spread=spread,
        host_ports=ports,
        claims=[draw(st.sampled_from(claims))]
        if claims and not bound and draw(st.integers(0, 3)) == 3
        else [],
    )
    if draw(st.integers(0, 3)) == 3:
        body["spec"]["containers"][0]["resources"]["requests"][DONGLE] = "1"
        body["spec"]["containers"][0]["resources"]["limits"] = {DONGLE: "1"}
    if bound:
        body["spec"]["nodeName"] = draw(st.sampled_from(nodes))
    return body


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    prefix = f"cf{next(_case_ids)}"
    nodes = draw(node_bodies(prefix))
    names = [n["metadata"]["name"] for n in nodes]
    pvs, pvcs = [], []
    for i in range(draw(st.integers(0, 2))):
        node = draw(st.sampled_from(names))
        pvs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{prefix}-pv{i}", "labels": {CASE_LABEL: "1"}},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "cf-local",
                    "hostPath": {"path": "/tmp"},
                    "claimRef": {"namespace": "cf-a", "name": f"{prefix}-c{i}"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": [node],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
        for ns in NAMESPACES:  # the pod's namespace is drawn later: a claim in each
            pvcs.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": f"{prefix}-c{i}",
                        "namespace": ns,
                        "labels": {CASE_LABEL: "1"},
                        "annotations": {ANN_BIND_COMPLETED: "yes"} if ns == "cf-a" else {},
                    },
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                        "storageClassName": "cf-local",
                        # Bound in cf-a; in cf-b unbound with an Immediate class.
                        **({"volumeName": f"{prefix}-pv{i}"} if ns == "cf-a" else {}),
                    },
                }
            )
    claims = [f"{prefix}-c{i}" for i in range(len(pvs))] + [f"{prefix}-missing"]
    bound = [
        draw(pod_spec(f"{prefix}-b{i}", names, claims, True))
        for i in range(draw(st.integers(0, 3)))
    ]
    pending = [
        draw(pod_spec(f"{prefix}-p{i}", names, claims, False))
        for i in range(draw(st.integers(2, 5)))
    ]
    return {"nodes": nodes, "pvs": pvs, "pvcs": pvcs, "bound": bound, "pending": pending}


# -- the cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube() -> Iterator[tuple[ControlPlane, Any]]:
    from kubernetes import client

    with ControlPlane(scheduler=True) as cp, cp.api_client() as api:
        v1 = client.CoreV1Api(api)
        for ns, labels in {**NAMESPACES, BARRIER_NS: {}}.items():
            v1.create_namespace(
                client.V1Namespace.model_validate({"metadata": {"name": ns, "labels": labels}})
            )
        client.StorageV1Api(api).create_storage_class(
            client.V1StorageClass.model_validate(
                {
                    "metadata": {"name": "cf-local"},
                    "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": "Immediate",
                }
            )
        )
        yield cp, api
    print(f"\nconformance: {dict(sorted(STATS.items()))}")


def _raw(resp: Any) -> Any:
    return json.loads(resp.data)


class Driver:
    def __init__(self, cp: ControlPlane, api: Any) -> None:
        from kubernetes import client

        self.cp = cp
        self.api = api
        self.v1 = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)

    def state(self) -> dict[str, list[dict[str, Any]]]:
        v1 = self.v1
        return {
            "nodes": _raw(v1.list_node(_preload_content=False))["items"],
            "pods": _raw(v1.list_pod_for_all_namespaces(_preload_content=False))["items"],
            "claims": _raw(
                v1.list_persistent_volume_claim_for_all_namespaces(_preload_content=False)
            )["items"],
            "volumes": _raw(v1.list_persistent_volume(_preload_content=False))["items"],
            "classes": _raw(self.storage.list_storage_class(_preload_content=False))["items"],
            "namespaces": _raw(v1.list_namespace(_preload_content=False))["items"],
        }

    def kallot(self, pod: dict[str, Any]) -> str | Diagnosis:
        from kubernetes import client

        body = copy.deepcopy(pod)
        body["spec"]["schedulerName"] = "kallot"
        ns = body["metadata"]["namespace"]
        dry = _raw(
            self.v1.create_namespaced_pod(
                ns, client.V1Pod.model_validate(body), dry_run="All", _preload_content=False
            )
        )
        s = self.state()
        out = kallot_decide(
            s["nodes"],
            [*s["pods"], dry],
            claims=s["claims"],
            volumes=s["volumes"],
            classes=s["classes"],
            namespaces=s["namespaces"],
        )
        return out[body["metadata"]["name"]]

    def kube(self, pod: dict[str, Any], pin: str | None) -> tuple[str, str]:
        """(node kube-scheduler bound the pod to, "") or ("", its FailedScheduling message)."""
        from kubernetes import client

        body = copy.deepcopy(pod)
        if pin is not None:
            pin_expr = {"key": "metadata.name", "operator": "In", "values": [pin]}
            na = body["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
            req = na.setdefault(
                "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": [{}]}
            )
            for term in req["nodeSelectorTerms"]:
                term.setdefault("matchFields", []).append(pin_expr)
            for c in body["spec"].get("topologySpreadConstraints", []):
                c["nodeAffinityPolicy"] = "Ignore"  # the pod has no node affinity of its own
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.v1.create_namespaced_pod(ns, client.V1Pod.model_validate(body), _preload_content=False)
        expected_nodes = len(self.state()["nodes"])
        deadline = time.monotonic() + VERDICT_TIMEOUT_S
        while time.monotonic() < deadline:
            got = _raw(self.v1.read_namespaced_pod(name, ns, _preload_content=False))
            node = (got.get("spec") or {}).get("nodeName")
            if node:
                return str(node), ""
            for cond in (got.get("status") or {}).get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                    message = str(cond.get("message", ""))
                    # kube-scheduler has seen every node of this case (and no stale one).
                    if message.startswith(f"0/{expected_nodes} nodes"):
                        return "", message
            time.sleep(0.05)
        raise AssertionError(
            f"kube-scheduler gave no verdict on {ns}/{name} in {VERDICT_TIMEOUT_S}s"
        )

    def delete_pod(self, ns: str, name: str) -> None:
        self.v1.delete_namespaced_pod(name, ns, grace_period_seconds=0)

    def setup(self, case: dict[str, Any]) -> None:
        create_nodes_sync(self.cp.kubeconfig_path, case["nodes"], concurrency=8)
        for pv in case["pvs"]:
            self.v1.create_persistent_volume(pv)
        for pvc in case["pvcs"]:
            self.v1.create_namespaced_persistent_volume_claim(pvc["metadata"]["namespace"], pvc)
        for pod in case["bound"]:
            self.v1.create_namespaced_pod(pod["metadata"]["namespace"], pod)
        # Barrier: kube-scheduler schedules this pod only after its watches delivered every
        # pod event before it (this case's bound pods, the previous case's deletions); pinned
        # to the node created last, so it has seen every node too. It tolerates everything,
        # asks nothing and finds a pod slot (at most 3 bound pods, at least 4 slots); a verdict
        # either way (bound, or refused on all the case's nodes) says the watches caught up.
        last = case["nodes"][-1]["metadata"]["name"]
        barrier = pod_obj(
            f"{case['nodes'][0]['metadata']['name']}-barrier",
            namespace=BARRIER_NS,
            cpu="0",
            memory="0",
            scheduler="default-scheduler",
            tolerations=[{"operator": "Exists"}],
        )
        node, _ = self.kube(barrier, last)
        if not node:  # refused (placed pods' anti-affinity may match it): synced all the same
            self.delete_pod(BARRIER_NS, barrier["metadata"]["name"])

    def teardown(self) -> None:
        v1 = self.v1
        for ns in [*NAMESPACES, BARRIER_NS]:
            v1.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            for pvc in _raw(v1.list_namespaced_persistent_volume_claim(ns, _preload_content=False))[
                "items"
            ]:
                name = pvc["metadata"]["name"]
                v1.patch_namespaced_persistent_volume_claim(
                    name, ns, {"metadata": {"finalizers": None}}
                )
                v1.delete_namespaced_persistent_volume_claim(name, ns)
        for pv in _raw(v1.list_persistent_volume(_preload_content=False))["items"]:
            name = pv["metadata"]["name"]
            v1.patch_persistent_volume(name, {"metadata": {"finalizers": None}})
            v1.delete_persistent_volume(name)
        v1.delete_collection_node(label_selector=CASE_LABEL)


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(case=cases())
def test_kallot_agrees_with_kube_scheduler(
    kube: tuple[ControlPlane, Any], case: dict[str, Any]
) -> None:
    cp, api = kube
    d = Driver(cp, api)
    STATS["clusters"] += 1
    try:
        d.setup(case)
        for pod in case["pending"]:
            choice = d.kallot(pod)
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            note(f"pod {ns}/{name}: {json.dumps(pod['spec'], sort_keys=True)}")
            spec = pod["spec"]
            STATS["pods"] += 1
            for key in ("tolerations", "nodeSelector", "topologySpreadConstraints", "volumes"):
                STATS[key] += bool(spec.get(key))
            for key in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
                STATS[key] += key in (spec.get("affinity") or {})
            STATS["hostPort"] += "ports" in spec["containers"][0]
            if isinstance(choice, Diagnosis):
                node, message = d.kube(pod, None)
                assert not node, (
                    f"kube-scheduler placed {ns}/{name} on {node}; kallot found no node: "
                    f"{choice.message()}"
                )
                d.delete_pod(ns, name)
                STATS["both refuse"] += 1
                for r in choice.reasons:
                    STATS[f"refused by {r.plugin}"] += 1
            else:
                node, message = d.kube(pod, choice)
                assert node == choice, (
                    f"kallot placed {ns}/{name} on {choice}; kube-scheduler refuses it there: "
                    f"{message}"
                )
                STATS["both place"] += 1
    finally:
        d.teardown()
        progress = os.environ.get("KALLOT_CONFORMANCE_PROGRESS")
        if progress:
            with open(progress, "a") as f:
                f.write(json.dumps(dict(sorted(STATS.items()))) + "\n")
