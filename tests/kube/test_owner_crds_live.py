"""Owners as users submit them, with their real CRDs on the real control plane
(docs/workloads.md): PyTorchJob, TFJob, MPIJob, RayCluster, TrainJob (-> its JobSet), Kueue
Workloads admitted and not, a LeaderWorkerSet with subgroups, and the upstream Workload API.

The CRDs are the files the projects' published Go modules ship (tools/testenv/fetch-crds.sh,
`make controlplane`), installed once for the module. The operators themselves are not run: each
test creates the owner object as a user would and then its pods (and child objects) the way its
controller does: the controller ownerReference, the labels and annotations it writes (names
read from the operators' sources). kallot reads the owner objects through the API and derives
the gang and queue from them. Every test synchronizes on state read from the API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes import client

from kallot.kube import owners, translate
from kallot.testing.controllers import owner_crd, owner_crd_pins
from kallot.testing.controlplane import ControlPlane
from kallot.testing.live import Cluster, inventory_node_body, pending_reason, pod_body, wait_until

pytestmark = pytest.mark.controlplane

RACK = "kallot.io/rack"
GPU_TYPE = "example.com/gpu-type"


@pytest.fixture(scope="module")
def owner_crds(kube_cp: ControlPlane) -> None:
    """Every owner CRD of tools/testenv/crds/crds.txt, served (kept: cluster-wide)."""
    with kube_cp.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        names = []
        for name in owner_crd_pins():
            crd = owner_crd(name)  # fails (never skips) when `make controlplane` did not fetch
            names.append(crd["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(
                    client.V1CustomResourceDefinition.model_validate(crd), _preload_content=False
                )
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

        def established() -> bool:
            for n in names:
                got = json.loads(
                    ext.read_custom_resource_definition(n, _preload_content=False).data  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
                )
                conds = (got.get("status") or {}).get("conditions") or []
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    return False
            return True

        wait_until(established, timeout=60, what="the owners' CRDs to be served")


def _template(gpus: int = 1) -> dict[str, Any]:
    tmpl = pod_body("x", resources={translate.RESOURCE_GPU: str(gpus)})
    del tmpl["apiVersion"], tmpl["kind"]
    tmpl["metadata"] = {}
    return tmpl


def _ref(obj: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _pod(
    name: str,
    owner: Mapping[str, Any],
    *,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    gpus: int = 1,
) -> dict[str, Any]:
    body = pod_body(
        name,
        resources={translate.RESOURCE_GPU: str(gpus)},
        labels=labels,
        annotations=annotations,
    )
    body["metadata"]["ownerReferences"] = [_ref(owner)]
    return body


class Objects:
    """Creates custom objects, Jobs and StatefulSets in the test's namespace; ``close`` deletes
    the Jobs and StatefulSets (orphaning their pods: there is no garbage collector), so that a
    kube-controller-manager a later test runs does not make pods for them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.api = client.CustomObjectsApi(cluster.api)
        self.jobs: list[str] = []
        self.statefulsets: list[str] = []

    def close(self) -> None:
        for name in self.jobs:
            client.BatchV1Api(self.cluster.api).delete_namespaced_job(
                name, self.cluster.ns, propagation_policy="Orphan"
            )
        for name in self.statefulsets:
            client.AppsV1Api(self.cluster.api).delete_namespaced_stateful_set(
                name, self.cluster.ns, propagation_policy="Orphan"
            )

    def create(self, obj: dict[str, Any], *, cluster_scoped: bool = False) -> dict[str, Any]:
        group, _, version = obj["apiVersion"].partition("/")
        plural = obj["kind"].lower() + "s"
        if cluster_scoped:
            out = self.api.create_cluster_custom_object(group, version, plural, obj)
        else:
            out = self.api.create_namespaced_custom_object(
                group, version, self.cluster.ns, plural, obj
            )
        assert isinstance(out, dict)
        return out

    def job(self, name: str, pods: int, labels: Mapping[str, str], **extra: Any) -> dict[str, Any]:
        """A batch Job (its pods are created by the test, as the Job controller would)."""
        tmpl = _template()
        tmpl["spec"]["restartPolicy"] = "Never"
        tmpl["metadata"] = {"labels": dict(labels)}
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": dict(labels), **extra},
            "spec": {
                "completionMode": "Indexed",
                "parallelism": pods,
                "completions": pods,
                "template": tmpl,
            },
        }
        resp = client.BatchV1Api(self.cluster.api).create_namespaced_job(
            self.cluster.ns, client.V1Job.model_validate(body), _preload_content=False
        )
        job: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
        self.jobs.append(name)
        return job

    def job_pods(self, job: Mapping[str, Any], indexes: Sequence[int]) -> list[dict[str, Any]]:
        """Pods of a Job as kube-controller-manager's Job controller makes them."""
        name = job["metadata"]["name"]
        labels = job["spec"]["template"]["metadata"].get("labels", {})
        return [
            _pod(
                f"{name}-{i}",
                job,
                labels={
                    **labels,
                    owners.LABEL_JOB_NAME: name,
                    owners.LABEL_JOB_CONTROLLER_UID: job["metadata"]["uid"],
                    owners.LABEL_JOB_COMPLETION_INDEX: str(i),
                },
                annotations={owners.LABEL_JOB_COMPLETION_INDEX: str(i)},
            )
            for i in indexes
        ]


@pytest.fixture
def objs(cluster: Cluster) -> Iterator[Objects]:
    o = Objects(cluster)
    try:
        yield o
    finally:
        o.close()


def _explain(cluster: Cluster, pod: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig_path), "COLUMNS": "250"}
    out = subprocess.run(
        [sys.executable, "-m", "kallot.cli.main", "explain", pod, "-n", cluster.ns],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())  # rich wraps long lines


def _by_name(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in cluster.pods()}


def test_training_ray_and_trainjob_gangs_come_from_their_objects(
    cluster: Cluster, objs: Objects, owner_crds: None
) -> None:
    """A PyTorchJob (1+7), TFJob (1+2), MPIJob (1+2), RayCluster (head + minReplicas 2 of at
    most 5) and a TrainJob (its JobSet: an initializer, then 2 nodes that dependsOn it) on 24
    GPUs. All but one pod of each gang exist first: those wait for the size their object says
    (nothing bound), the TrainJob's initializer (a stage of its own) is bound alone; then the
    last pods come and every gang is bound whole. A second PyTorchJob of 8 pods x 4 GPUs cannot
    fit: all 8 stay pending with one reason."""
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=4) for i in range(6)])
    s = cluster.scheduler()
    s.wait_ready()

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "Never", "template": _template()}

    training = {
        "pt": ("PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 7}),
        "tf": ("TFJob", "tfReplicaSpecs", {"PS": 1, "Worker": 2}),
        "mpi": ("MPIJob", "mpiReplicaSpecs", {"Launcher": 1, "Worker": 2}),
    }
    first: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    want: dict[str, tuple[str, int]] = {}  # pod -> (gang id, size)
    for name, (kind, field, reps) in training.items():
        obj = objs.create(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": {field: {rt: replica(n) for rt, n in reps.items()}},
            }
        )
        size = sum(reps.values())
        pods = [
            _pod(
                f"{name}-{rt.lower()}-{i}",
                obj,
                labels={
                    "training.kubeflow.org/operator-name": f"{kind.lower()}-controller",
                    owners.LABEL_TRAINING_JOB_NAME: name,
                    owners.LABEL_TRAINING_REPLICA_TYPE: rt.lower(),
                    "training.kubeflow.org/replica-index": str(i),
                },
            )
            for rt, n in reps.items()
            for i in range(n)
        ]
        for p in pods:
            want[p["metadata"]["name"]] = (f"{cluster.ns}/{kind.lower()}/{name}", size)
        first += pods[:-1]
        last.append(pods[-1])

    ray = objs.create(
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "metadata": {"name": "ray"},
            "spec": {
                "headGroupSpec": {"rayStartParams": {}, "template": _template()},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 2,
                        "minReplicas": 2,
                        "maxReplicas": 5,
                        "rayStartParams": {},
                        "template": _template(),
                    }
                ],
            },
        }
    )

    def ray_labels(node_type: str, group: str) -> dict[str, str]:  # KubeRay's labelPod
        return {
            "ray.io/is-ray-node": "yes",
            owners.LABEL_RAY_CLUSTER: "ray",
            "ray.io/node-type": node_type,
            "ray.io/group": group,
            "ray.io/identifier": f"ray-{node_type}",
            "app.kubernetes.io/name": "kuberay",
            "app.kubernetes.io/created-by": "kuberay-operator",
        }

    ray_pods = [_pod("ray-head-x", ray, labels=ray_labels("head", "headgroup"))] + [
        _pod(f"ray-gpu-worker-{i}", ray, labels=ray_labels("worker", "gpu")) for i in range(2)
    ]
    for p in ray_pods:
        want[p["metadata"]["name"]] = (f"{cluster.ns}/raycluster/ray", 3)
    first += ray_pods[:-1]
    last.append(ray_pods[-1])

    # Kubeflow Trainer: the TrainJob, and the JobSet its runtime makes (owned by the TrainJob),
    # an initializer replicated job and a trainer node job that starts after it.
    trainjob = objs.create(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "tj"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
        }
    )

    def rjob(name: str, pods: int, **extra: Any) -> dict[str, Any]:
        tmpl = _template()
        tmpl["spec"]["restartPolicy"] = "Never"
        return {
            "name": name,
            "replicas": 1,
            "template": {"spec": {"parallelism": pods, "completions": pods, "template": tmpl}},
            **extra,
        }

    jobset = objs.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "tj", "ownerReferences": [_ref(trainjob)]},
            "spec": {
                "replicatedJobs": [
                    rjob("dataset-initializer", 1),
                    rjob(
                        "node",
                        2,
                        dependsOn=[{"name": "dataset-initializer", "status": "Complete"}],
                    ),
                ]
            },
        }
    )

    def jobset_job(rj: str, pods: int) -> dict[str, Any]:  # as the JobSet controller makes it
        labels = {
            owners.LABEL_JOBSET_NAME: "tj",
            owners.LABEL_JOBSET_REPLICATED_JOB: rj,
            owners.LABEL_JOBSET_REPLICAS: "1",
            "jobset.sigs.k8s.io/job-index": "0",
            owners.LABEL_JOBSET_JOB_KEY: f"key-{rj}",
        }
        return objs.job(f"tj-{rj}-0", pods, labels, ownerReferences=[_ref(jobset)])

    init_pods = objs.job_pods(jobset_job("dataset-initializer", 1), [0])
    node_pods = objs.job_pods(jobset_job("node", 2), [0, 1])
    init = init_pods[0]["metadata"]["name"]
    for p in node_pods:
        want[p["metadata"]["name"]] = (f"{cluster.ns}/trainjob/tj/after-dataset-initializer", 2)
    first += init_pods + node_pods[:-1]
    last.append(node_pods[-1])

    cluster.create_pods(first)

    def waiting_for_the_rest() -> bool:
        s.check_alive()
        pods = _by_name(cluster)
        bound = {n for n, p in pods.items() if p["spec"].get("nodeName")}
        assert bound <= {init}, f"bound before their gang was whole: {sorted(bound - {init})}"
        for name, (gang, size) in want.items():
            if name not in pods:  # the last pod of each gang, created below
                continue
            # "gang <id>: <n> of <size> required tasks ... (waiting for the rest)"; <n> is the
            # count when the reason was written (rewritten at most every 30 s)
            reason = pending_reason(pods[name])
            if not (reason.startswith(f"gang {gang}: ") and f" of {size} required" in reason):
                return False
        return init in bound

    wait_until(waiting_for_the_rest, timeout=180, what="each gang to wait for its last pod")
    cluster.create_pods(last)

    def all_bound() -> bool:
        s.check_alive()
        pods = _by_name(cluster)
        return len(pods) == len(want) + 1 and all(p["spec"].get("nodeName") for p in pods.values())

    wait_until(all_bound, timeout=180, what="every gang to be bound whole")
    cluster.assert_no_overcommit()

    huge = objs.create(
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "huge"},
            "spec": {
                "pytorchReplicaSpecs": {
                    rt: {"replicas": n, "template": _template(gpus=4)}
                    for rt, n in (("Master", 1), ("Worker", 7))
                }
            },
        }
    )
    huge_pods = [
        _pod(
            f"huge-{rt}-{i}",
            huge,
            labels={
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                owners.LABEL_TRAINING_JOB_NAME: "huge",
                owners.LABEL_TRAINING_REPLICA_TYPE: rt,
                "training.kubeflow.org/replica-index": str(i),
            },
            gpus=4,
        )
        for rt, n in (("master", 1), ("worker", 7))
        for i in range(n)
    ]
    cluster.create_pods(huge_pods)

    def huge_decided() -> set[str] | None:
        s.check_alive()
        pods = [p for n, p in _by_name(cluster).items() if n.startswith("huge-")]
        assert not any(p["spec"].get("nodeName") for p in pods), "a member of huge was bound"
        reasons = {pending_reason(p) for p in pods}
        if len(pods) < 8 or any("waiting for the rest" in r or not r for r in reasons):
            return None
        return reasons

    reasons = wait_until(huge_decided, timeout=180, what="all 8 pods of huge to get a reason")
    assert len(reasons) == 1, reasons
    assert f"gang {cluster.ns}/pytorchjob/huge: only " in reasons.pop()
    text = _explain(cluster, node_pods[0]["metadata"]["name"])
    assert (
        f"Gang: {cluster.ns}/trainjob/tj/after-dataset-initializer, 2 pods start together "
        f"(from TrainJob {cluster.ns}/tj via JobSet {cluster.ns}/tj" in text
    ), text
    text = _explain(cluster, "mpi-launcher-0")
    assert f"Gang: {cluster.ns}/mpijob/mpi, 3 pods start together (from MPIJob" in text, text


def _condition(kind: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": f"{reason} by the test, as Kueue's scheduler does",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@pytest.fixture
def kueue(cluster: Cluster, objs: Objects, owner_crds: None) -> Iterator[dict[str, str]]:
    """Kueue's cluster objects for this test: ResourceFlavors a100 (labels nodes this test
    makes) and h100 (no node has it), a ClusterQueue, and the namespace's LocalQueue lq."""
    names = {
        "a100": f"{cluster.run}-a100",
        "h100": f"{cluster.run}-h100",
        "cq": f"{cluster.run}-cq",
    }
    for flavor in ("a100", "h100"):
        objs.create(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": names[flavor]},
                "spec": {"nodeLabels": {GPU_TYPE: f"{flavor}-{cluster.run}"}},
            },
            cluster_scoped=True,
        )
    objs.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": names["cq"]},
            "spec": {"namespaceSelector": {}},
        },
        cluster_scoped=True,
    )
    objs.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "lq"},
            "spec": {"clusterQueue": names["cq"]},
        }
    )
    try:
        yield names
    finally:
        for plural, name in (
            ("resourceflavors", names["a100"]),
            ("resourceflavors", names["h100"]),
            ("clusterqueues", names["cq"]),
        ):
            objs.api.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural, name)


def test_kueue_workload_admission_decides_queue_flavor_and_when(
    cluster: Cluster, objs: Objects, kueue: dict[str, str]
) -> None:
    """Three Jobs submitted to LocalQueue lq, each with the Workload Kueue makes for it:
    ``adm`` admitted on flavor a100 is bound on the a100 node only; ``h100`` admitted on a
    flavor no node has stays pending on that node label; ``held`` is not admitted and stays
    pending saying so, then is bound once its Workload is admitted. The queue is the
    ClusterQueue; a pod with no queue label takes its namespace's default queue."""
    nodes = [
        inventory_node_body(
            f"{cluster.run}-a100", gpus=4, labels={GPU_TYPE: f"a100-{cluster.run}"}
        ),
        *(inventory_node_body(f"{cluster.run}-plain{i}", gpus=4) for i in range(2)),
    ]
    cluster.add_nodes(nodes)
    client.CoreV1Api(cluster.api).patch_namespace(
        cluster.ns, {"metadata": {"labels": {translate.LABEL_QUEUE: "team-default"}}}
    )
    s = cluster.scheduler()
    s.wait_ready()
    queue = {owners.LABEL_KUEUE_QUEUE: "lq"}
    jobs = {n: objs.job(n, 2, queue) for n in ("adm", "h100", "held")}
    workloads = {}
    for n, job in jobs.items():
        workloads[n] = objs.create(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {
                    "name": f"job-{n}-1a2b3",
                    "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                    "ownerReferences": [_ref(job)],
                },
                "spec": {
                    "queueName": "lq",
                    "podSets": [{"name": "main", "count": 2, "template": job["spec"]["template"]}],
                },
            }
        )

    def admit(n: str, flavor: str) -> None:
        status = {
            "admission": {
                "clusterQueue": kueue["cq"],
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 2,
                        "flavors": {translate.RESOURCE_GPU: kueue[flavor]},
                        "resourceUsage": {translate.RESOURCE_GPU: "2"},
                    }
                ],
            },
            "conditions": [
                _condition("QuotaReserved", "QuotaReserved"),
                _condition("Admitted", "Admitted"),
            ],
        }
        objs.api.patch_namespaced_custom_object_status(
            "kueue.x-k8s.io",
            "v1beta2",
            cluster.ns,
            "workloads",
            workloads[n]["metadata"]["name"],
            {"status": status},
        )

    admit("adm", "a100")
    admit("h100", "h100")
    solo = pod_body("solo", resources={translate.RESOURCE_GPU: "1"})
    cluster.create_pods([p for job in jobs.values() for p in objs.job_pods(job, [0, 1])] + [solo])

    def settled() -> dict[str, dict[str, Any]] | None:
        s.check_alive()
        pods = _by_name(cluster)
        for n in ("h100", "held"):
            assert not any(pods[f"{n}-{i}"]["spec"].get("nodeName") for i in (0, 1)), n
        ok = (
            all(pods[f"adm-{i}"]["spec"].get("nodeName") for i in (0, 1))
            and pods["solo"]["spec"].get("nodeName")
            and all(
                f"{GPU_TYPE}=h100-{cluster.run}" in pending_reason(pods[f"h100-{i}"])
                for i in (0, 1)
            )
            and all("is not admitted" in pending_reason(pods[f"held-{i}"]) for i in (0, 1))
        )
        return pods if ok else None

    pods = wait_until(settled, timeout=180, what="adm bound, h100 and held pending with reasons")
    assert {pods[f"adm-{i}"]["spec"]["nodeName"] for i in (0, 1)} == {f"{cluster.run}-a100"}
    held_reason = pending_reason(pods["held-0"])
    assert f"Kueue Workload {cluster.ns}/job-held-1a2b3 is not admitted" in held_reason

    admit("held", "a100")

    def held_bound() -> set[str] | None:
        s.check_alive()
        pods = _by_name(cluster)
        nodes = {pods[f"held-{i}"]["spec"].get("nodeName") for i in (0, 1)}
        return None if None in nodes else nodes

    assert wait_until(held_bound, timeout=120, what="held to be bound once admitted") == {
        f"{cluster.run}-a100"
    }
    cluster.assert_no_overcommit()
    text = _explain(cluster, "adm-0")
    assert (
        f"Queue: {kueue['cq']} (from Kueue Workload {cluster.ns}/job-adm-1a2b3 admitted to "
        f"ClusterQueue {kueue['cq']}, flavor {kueue['a100']})" in text
    ), text
    text = _explain(cluster, "solo")
    assert (
        f"Queue: team-default (from label {translate.LABEL_QUEUE} on namespace {cluster.ns}" in text
    ), text


def test_lws_subgroups_are_each_placed_as_a_unit_in_their_own_rack(
    cluster: Cluster, objs: Objects, owner_crds: None
) -> None:
    """A LeaderWorkerSet group of 4 with subGroupSize 2 and the subgroup exclusive-topology
    annotation: two subgroups (leader + worker 1, workers 2 + 3), each bound whole in a rack of
    its own. Worker 3 comes last: subgroup 0 is bound without it, subgroup 1 waits for it."""
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-{rack}-{i}", gpus=2, labels={RACK: rack})
            for rack in ("r0", "r1")
            for i in range(2)
        ]
    )
    s = cluster.scheduler(extra=["--policy=topology"])
    s.wait_ready()
    tmpl = _template(gpus=2)
    lws = objs.create(
        {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {
                "name": "llm",
                "annotations": {owners.ANN_LWS_SUBGROUP_EXCLUSIVE: RACK},
            },
            "spec": {
                "replicas": 1,
                "leaderWorkerTemplate": {
                    "size": 4,
                    "subGroupPolicy": {"subGroupSize": 2},
                    "workerTemplate": tmpl,
                },
            },
        }
    )
    apps = client.AppsV1Api(cluster.api)

    def statefulset(name: str, owner: Mapping[str, Any], replicas: int) -> dict[str, Any]:
        selector = {owners.LABEL_LWS_NAME: "llm", "sts": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "ownerReferences": [_ref(owner)]},
            "spec": {
                "replicas": replicas,
                "serviceName": "llm",
                "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": selector}, "spec": tmpl["spec"]},
            },
        }
        resp = apps.create_namespaced_stateful_set(
            cluster.ns, client.V1StatefulSet.model_validate(body), _preload_content=False
        )
        objs.statefulsets.append(name)
        out: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
        return out

    # The LWS controller: a leader StatefulSet owned by the LWS; the leader pod's webhook
    # labels; a worker StatefulSet owned by the leader pod; the workers' webhook labels.
    leader_sts = statefulset("llm", lws, 1)
    ann = {
        owners.ANN_LWS_SIZE: "4",
        owners.ANN_LWS_SUBGROUP_SIZE: "2",
        owners.ANN_LWS_SUBGROUP_EXCLUSIVE: RACK,
    }

    def labels(worker: int) -> dict[str, str]:
        return {
            owners.LABEL_LWS_NAME: "llm",
            owners.LABEL_LWS_GROUP_INDEX: "0",
            "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            "leaderworkerset.sigs.k8s.io/group-key": "g0key",
            # getSubGroupIndex: (size - 1) % subGroupSize != 0, so worker // subGroupSize
            owners.LABEL_LWS_SUBGROUP_INDEX: str(worker // 2),
            "leaderworkerset.sigs.k8s.io/subgroup-key": f"sg{worker // 2}key",
        }

    leader = _pod("llm-0", leader_sts, labels=labels(0), annotations=ann, gpus=2)
    leader = cluster.create_pods([leader])[0]
    worker_sts = statefulset("llm-0", leader, 3)
    worker_ann = {**ann, "leaderworkerset.sigs.k8s.io/leader-name": "llm-0"}
    workers = [
        _pod(f"llm-0-{w}", worker_sts, labels=labels(w), annotations=worker_ann, gpus=2)
        for w in (1, 2, 3)
    ]
    cluster.create_pods(workers[:2])

    def first_subgroup_bound() -> bool:
        s.check_alive()
        pods = _by_name(cluster)
        assert not pods["llm-0-2"]["spec"].get("nodeName"), "subgroup 1 bound before whole"
        return all(pods[n]["spec"].get("nodeName") for n in ("llm-0", "llm-0-1")) and (
            pending_reason(pods["llm-0-2"])
        ).startswith(f"gang {cluster.ns}/lws/llm-0-sub1: 1 of 2 required")

    wait_until(first_subgroup_bound, timeout=120, what="subgroup 0 bound, subgroup 1 waiting")
    cluster.create_pods(workers[2:])

    def racks() -> dict[int, set[str]] | None:
        s.check_alive()
        pods = _by_name(cluster)
        if not all(p["spec"].get("nodeName") for p in pods.values()) or len(pods) != 4:
            return None
        out: dict[int, set[str]] = {}
        for p in pods.values():
            sub = int(p["metadata"]["labels"][owners.LABEL_LWS_SUBGROUP_INDEX])
            out.setdefault(sub, set()).add(p["spec"]["nodeName"].split("-")[1])
        return out

    placed = wait_until(racks, timeout=120, what="both subgroups to be bound")
    assert all(len(r) == 1 for r in placed.values()), placed
    assert placed[0] != placed[1], placed
    cluster.assert_no_overcommit()


def test_upstream_workload_api_podgroup_is_a_gang(cluster: Cluster) -> None:
    """The Kubernetes Workload API (scheduling.k8s.io/v1alpha2, GenericWorkload): a Workload
    with a gang template of minCount 3, its PodGroup, and pods naming it in
    spec.schedulingGroup: two wait for the third, then all three are bound."""
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=2) for i in range(2)])
    api = client.CustomObjectsApi(cluster.api)
    policy = {"gang": {"minCount": 3}}
    api.create_namespaced_custom_object(
        "scheduling.k8s.io",
        "v1alpha2",
        cluster.ns,
        "workloads",
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "Workload",
            "metadata": {"name": "train"},
            "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": policy}]},
        },
    )
    api.create_namespaced_custom_object(
        "scheduling.k8s.io",
        "v1alpha2",
        cluster.ns,
        "podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "train-workers"},
            "spec": {
                "podGroupTemplateRef": {
                    "workload": {"workloadName": "train", "podGroupTemplateName": "workers"}
                },
                "schedulingPolicy": policy,
            },
        },
    )
    s = cluster.scheduler()
    s.wait_ready()
    pods = []
    for i in range(3):
        body = pod_body(f"w-{i}", resources={translate.RESOURCE_GPU: "1"})
        body["spec"]["schedulingGroup"] = {"podGroupName": "train-workers"}
        pods.append(body)
    created = cluster.create_pods(pods[:2])
    assert all(p["spec"].get("schedulingGroup") for p in created), "the API dropped the field"

    def waiting() -> bool:
        s.check_alive()
        got = _by_name(cluster)
        assert not any(p["spec"].get("nodeName") for p in got.values()), "bound before whole"
        return len(got) == 2 and all(
            pending_reason(p).startswith(f"gang {cluster.ns}/podgroup/train-workers: ")
            and " of 3 required" in pending_reason(p)
            for p in got.values()
        )

    wait_until(waiting, timeout=120, what="the PodGroup's first pods to wait for the third")
    cluster.create_pods(pods[2:])
    wait_until(
        lambda: (
            s.check_alive()
            and len(got := _by_name(cluster)) == 3
            and all(p["spec"].get("nodeName") for p in got.values())
        ),
        timeout=120,
        what="the PodGroup's 3 pods to be bound",
    )
    cluster.assert_no_overcommit()
