"""Workloads as users submit them, on the real control plane (docs/workloads.md): an indexed
Job's pods, created by kube-controller-manager's Job controller, form a gang that is bound all
at once or not at all; a gang that cannot fit stays wholly pending with one reason; a JobSet's
Jobs with exclusive placement land one per rack; a pod with an unknown owner runs alone with an
Event. Without the kube-controller-manager binary (tools/testenv/build-kcm.sh) the tests create
each Job's pods the way the Job controller does (owner reference, labels, completion index).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kallot.kube import owners, translate
from kallot.testing.controllers import ControllerManager, owner_crd
from kallot.testing.controlplane import BinariesMissingError, ControlPlane
from kallot.testing.live import Cluster, inventory_node_body, pending_reason, pod_body, wait_until

pytestmark = pytest.mark.controlplane

RACK = "kallot.io/rack"


@pytest.fixture(scope="module")
def kcm(kube_cp: ControlPlane) -> Iterator[ControllerManager | None]:
    try:
        manager = ControllerManager(kube_cp)
    except BinariesMissingError:
        yield None
        return
    with manager:
        yield manager


class Jobs:
    """Creates batch Jobs in the test's namespace; deletes them before the pods go."""

    def __init__(self, cluster: Cluster, kcm: ControllerManager | None) -> None:
        self.cluster = cluster
        self.kcm = kcm
        self.batch = client.BatchV1Api(cluster.api)
        self.names: list[str] = []

    def create(
        self,
        name: str,
        pods: int,
        gpus: int,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owner_labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        template = pod_body("x", resources={translate.RESOURCE_GPU: str(gpus)})
        template["metadata"] = {
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        template["spec"]["restartPolicy"] = "Never"
        del template["apiVersion"], template["kind"]
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {**(labels or {}), **(owner_labels or {})}},
            "spec": {
                "completionMode": "Indexed",
                "parallelism": pods,
                "completions": pods,
                "backoffLimit": 0,
                "template": template,
            },
        }
        resp = self.batch.create_namespaced_job(
            self.cluster.ns, client.V1Job.model_validate(body), _preload_content=False
        )
        job: dict[str, Any] = json.loads(resp.data)  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response
        self.names.append(name)
        if self.kcm is None:
            self._pods_as_the_job_controller(job)
        return job

    def _pods_as_the_job_controller(self, job: Mapping[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        bodies = []
        for i in range(spec["completions"]):
            tmpl = spec["template"]
            labels = {
                **tmpl["metadata"].get("labels", {}),
                owners.LABEL_JOB_COMPLETION_INDEX: str(i),
            }
            ann = {
                **tmpl["metadata"].get("annotations", {}),
                owners.LABEL_JOB_COMPLETION_INDEX: str(i),
            }
            bodies.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{meta['name']}-{i}-x",
                        "labels": labels,
                        "annotations": ann,
                        "ownerReferences": [
                            {
                                "apiVersion": "batch/v1",
                                "kind": "Job",
                                "name": meta["name"],
                                "uid": meta["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": tmpl["spec"],
                }
            )
        self.cluster.create_pods(bodies)

    def pods(self, name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.cluster.pods()
            if p["metadata"].get("labels", {}).get(owners.LABEL_JOB_NAME) == name
        ]

    def close(self) -> None:
        for name in self.names:
            self.batch.delete_namespaced_job(name, self.cluster.ns, propagation_policy="Orphan")


@pytest.fixture
def jobs(cluster: Cluster, kcm: ControllerManager | None) -> Iterator[Jobs]:
    j = Jobs(cluster, kcm)
    try:
        yield j
    finally:
        j.close()


def test_indexed_job_of_8_is_bound_all_at_once(cluster: Cluster, jobs: Jobs) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=4) for i in range(2)])
    s = cluster.scheduler()
    s.wait_ready()
    jobs.create("train", pods=8, gpus=1)
    seen: list[tuple[int, int]] = []

    def all_bound() -> bool:
        s.check_alive()
        pods = jobs.pods("train")
        bound = sum(1 for p in pods if p["spec"].get("nodeName"))
        seen.append((len(pods), bound))
        return bound == 8

    wait_until(all_bound, timeout=120, what="the 8 pods of Job train to be bound")
    # Checked from the API at every poll: no member was bound before all 8 existed.
    assert all(n == 8 for n, bound in seen if bound), seen
    cluster.assert_no_overcommit()
    for pod in jobs.pods("train"):
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
        if jobs.kcm is not None:  # made by the Job controller: generateName <job>-<index>-
            assert pod["metadata"].get("generateName", "").startswith("train-"), pod["metadata"]


def test_gang_that_cannot_fit_stays_wholly_pending_with_one_reason(
    cluster: Cluster, jobs: Jobs
) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=3) for i in range(2)])
    s = cluster.scheduler()
    s.wait_ready()
    jobs.create("big", pods=8, gpus=1)

    def decided() -> list[str] | None:
        s.check_alive()
        pods = jobs.pods("big")
        assert not any(p["spec"].get("nodeName") for p in pods), "a member of the gang was bound"
        reasons = [pending_reason(p) for p in pods]
        if len(pods) < 8 or any(not r or "waiting for the rest" in r for r in reasons):
            return None
        return reasons

    # The first members wait for the rest (GangQuorum); once the last one exists the gang is
    # decided whole and its real reason replaces that at once (a different kind of blockage).
    reasons = wait_until(decided, timeout=240, what="all 8 members to get their reason")
    assert len(set(reasons)) == 1, set(reasons)
    assert f"{cluster.ns}/job/big" in reasons[0]
    # kallot explain names the derived gang, its size and where it came from.
    pod = jobs.pods("big")[0]["metadata"]["name"]
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig_path), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "kallot.cli.main", "explain", pod, "-n", cluster.ns],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert (
        f"Gang: {cluster.ns}/job/big, 8 pods start together (from Job {cluster.ns}/big"
        in out.stdout
    ), out.stdout


def test_jobset_exclusive_placement_puts_each_job_in_its_own_rack(
    cluster: Cluster, jobs: Jobs
) -> None:
    # Two racks of two 4-GPU nodes: each rack holds both Jobs (4 GPUs each); best fit alone would
    # pack them into one rack, exclusive placement gives each its own.
    nodes = [
        inventory_node_body(f"{cluster.run}-{rack}-{i}", gpus=4, labels={RACK: rack})
        for rack in ("r0", "r1")
        for i in range(2)
    ]
    cluster.add_nodes(nodes)
    s = cluster.scheduler(extra=["--policy=topology"])
    s.wait_ready()
    for j in range(2):
        labels = {
            owners.LABEL_JOBSET_NAME: "js",
            owners.LABEL_JOBSET_REPLICATED_JOB: "workers",
            owners.LABEL_JOBSET_JOB_KEY: f"key-{j}",
            owners.LABEL_JOBSET_REPLICAS: "2",
        }
        jobs.create(
            f"js-workers-{j}",
            pods=2,
            gpus=2,
            labels=labels,
            annotations={owners.ANN_JOBSET_EXCLUSIVE: RACK},
        )

    def placed() -> dict[str, set[str]] | None:
        s.check_alive()
        out: dict[str, set[str]] = {}
        for j in range(2):
            pods = jobs.pods(f"js-workers-{j}")
            if len(pods) < 2 or not all(p["spec"].get("nodeName") for p in pods):
                return None
            out[f"js-workers-{j}"] = {p["spec"]["nodeName"].split("-")[1] for p in pods}
        return out

    racks = wait_until(placed, timeout=120, what="both Jobs of the JobSet to be bound")
    assert all(len(r) == 1 for r in racks.values()), racks
    assert racks["js-workers-0"] != racks["js-workers-1"], racks
    cluster.assert_no_overcommit()


def test_pod_with_an_unknown_owner_runs_alone_with_an_event(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", gpus=2)])
    s = cluster.scheduler()
    s.wait_ready()
    body = pod_body("odd", resources={translate.RESOURCE_GPU: "1"})
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "name": "w",
            "uid": "00000000-0000-0000-0000-000000000001",
            "controller": True,
        }
    ]
    cluster.create_pods([body])
    wait_until(
        lambda: s.check_alive() and cluster.pod("odd")["spec"].get("nodeName"),
        timeout=60,
        what="the pod to be bound",
    )
    events = wait_until(
        lambda: [e for e in cluster.events("odd") if e["reason"] == "NoGangDerived"],
        timeout=30,
        what="the NoGangDerived Event",
    )
    assert "example.com/v1 Widget" in events[0]["message"]
    assert "single pod" in events[0]["message"]


QUEUE_CRDS = Path(__file__).resolve().parents[2] / "charts" / "kallot" / "crds"


@pytest.fixture
def two_queues(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Queues <run>-a and <run>-b, 8 GPUs each at most, deleted after the test."""
    cluster.install_crds([yaml.safe_load(p.read_text()) for p in sorted(QUEUE_CRDS.glob("*.yaml"))])
    api = client.CustomObjectsApi(cluster.api)
    names = (f"{cluster.run}-a", f"{cluster.run}-b")
    for name in names:
        api.create_cluster_custom_object(
            "kallot.io",
            "v1alpha1",
            "queues",
            {
                "apiVersion": "kallot.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"resources": {"gpu": {"quota": 6, "limit": 8}}},
            },
        )
    try:
        yield names
    finally:
        for name in names:
            api.delete_cluster_custom_object("kallot.io", "v1alpha1", "queues", name)


def test_mixed_owners_in_two_queues_never_bind_a_partial_gang(
    cluster: Cluster, jobs: Jobs, two_queues: tuple[str, str]
) -> None:
    """Jobs (team a, 12 GPUs asked, 8 allowed), a JobSet and a LeaderWorkerSet (team b, 8 GPUs)
    on 16 GPUs. At every poll: no gang has a bound member before all its pods exist, no queue
    holds more than its limit; at the end every gang is whole or wholly pending."""
    a, b = two_queues
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=4) for i in range(4)])
    s = cluster.scheduler()
    s.wait_ready()
    # Team a: the queue from the Job's label, the pod template's label, Kueue's LocalQueue label.
    jobs.create("a1", pods=4, gpus=1, owner_labels={translate.LABEL_QUEUE: a})
    jobs.create("a2", pods=4, gpus=1, labels={translate.LABEL_QUEUE: a})
    jobs.create("a3", pods=4, gpus=1, labels={owners.LABEL_KUEUE_QUEUE: a})
    # Team b: a JobSet of two Jobs x 2 pods, and a LeaderWorkerSet of 2 groups of 2 pods.
    for j in range(2):
        jobs.create(
            f"bs-w-{j}",
            pods=2,
            gpus=1,
            labels={
                owners.LABEL_JOBSET_NAME: "bs",
                owners.LABEL_JOBSET_REPLICATED_JOB: "w",
                owners.LABEL_JOBSET_REPLICAS: "2",
                owners.LABEL_KUEUE_QUEUE: b,
            },
        )
    lws = []
    for group in range(2):
        for worker in range(2):
            body = pod_body(
                f"llm-{group}-{worker}" if worker else f"llm-{group}",
                resources={translate.RESOURCE_GPU: "1"},
                labels={
                    owners.LABEL_LWS_NAME: "llm",
                    owners.LABEL_LWS_GROUP_INDEX: str(group),
                    translate.LABEL_QUEUE: b,
                },
                annotations={owners.ANN_LWS_SIZE: "2"},
            )
            sts = "llm" if worker == 0 else f"llm-{group}"  # leader / workers StatefulSet
            body["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": sts,
                    "uid": "00000000-0000-0000-0000-00000000000" + str(group),
                    "controller": True,
                }
            ]
            lws.append(body)
    cluster.create_pods(lws)

    def gang_of(p: Mapping[str, Any]) -> tuple[str, str, int]:
        labels = p["metadata"].get("labels", {})
        if labels.get(owners.LABEL_LWS_NAME):
            return f"lws-{labels[owners.LABEL_LWS_GROUP_INDEX]}", b, 2
        if labels.get(owners.LABEL_JOBSET_NAME):
            return "bs", b, 4
        return labels[owners.LABEL_JOB_NAME], a, 4

    history: list[dict[str, tuple[int, int]]] = []

    def check() -> bool:
        s.check_alive()
        pods = cluster.pods()
        gangs: dict[str, tuple[int, int]] = {}
        per_queue = {a: 0, b: 0}
        sizes = {}
        for p in pods:
            gang, queue, size = gang_of(p)
            n, bound = gangs.get(gang, (0, 0))
            is_bound = bool(p["spec"].get("nodeName"))
            gangs[gang] = (n + 1, bound + is_bound)
            per_queue[queue] += is_bound
            sizes[gang] = size
        history.append(gangs)
        for gang, (n, bound) in gangs.items():
            assert not bound or n == sizes[gang], f"gang {gang} bound before whole: {gangs}"
        assert per_queue[a] <= 8 and per_queue[b] <= 8, per_queue
        done = per_queue == {a: 8, b: 8}
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        return done and len(pending) == 4 and all(pending_reason(p) for p in pending)

    wait_until(check, timeout=300, what="both teams to reach their limit")
    final = history[-1]
    assert all(bound in (0, n) for n, bound in final.values()), final
    assert sorted(bound for g, (n, bound) in final.items() if g in ("a1", "a2", "a3")) == [0, 4, 4]
    cluster.assert_no_overcommit()


def test_jobset_object_from_its_go_module_sizes_the_gang(cluster: Cluster, jobs: Jobs) -> None:
    """The JobSet CRD (sigs.k8s.io/jobset's published module) served: a JobSet object of two
    replicated jobs x 2 pods is one gang of 4 read from the object, so the pods of its first
    Job wait for the second Job's (read from the Jobs alone it would look like a gang of 2)."""
    cluster.install_crds([owner_crd("jobset")])  # fetched by `make controlplane`; never skips
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", gpus=4) for i in range(2)])
    s = cluster.scheduler()
    s.wait_ready()
    wait_until(
        lambda: s.check_alive() and "listed resource=jobset" in s.log_tail(400),
        timeout=60,
        what="the scheduler to list JobSets",
    )
    api = client.CustomObjectsApi(cluster.api)

    def rjob(name: str) -> dict[str, Any]:
        tmpl = pod_body("x", resources={translate.RESOURCE_GPU: "1"})
        del tmpl["apiVersion"], tmpl["kind"]
        tmpl["metadata"] = {}
        tmpl["spec"]["restartPolicy"] = "Never"
        return {
            "name": name,
            "replicas": 1,
            "template": {"spec": {"parallelism": 2, "completions": 2, "template": tmpl}},
        }

    js = api.create_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        cluster.ns,
        "jobsets",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "pair"},
            "spec": {"replicatedJobs": [rjob("a"), rjob("b")]},
        },
    )
    assert isinstance(js, dict)  # the client annotates custom objects as object
    try:

        def child(rj: str) -> None:  # as the JobSet controller creates it
            jobs.create(
                f"pair-{rj}-0",
                pods=2,
                gpus=1,
                labels={
                    owners.LABEL_JOBSET_NAME: "pair",
                    owners.LABEL_JOBSET_REPLICATED_JOB: rj,
                    owners.LABEL_JOBSET_REPLICAS: "1",
                },
            )

        child("a")

        def first_waits() -> bool:
            s.check_alive()
            pods = jobs.pods("pair-a-0")
            assert not any(p["spec"].get("nodeName") for p in pods), "bound before the gang"
            return len(pods) == 2 and all("of 4 required tasks" in pending_reason(p) for p in pods)

        wait_until(first_waits, timeout=120, what="the first Job's pods to wait for the rest")
        child("b")

        def all_bound() -> bool:
            s.check_alive()
            pods = jobs.pods("pair-a-0") + jobs.pods("pair-b-0")
            return len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods)

        wait_until(all_bound, timeout=180, what="the JobSet's 4 pods to be bound")
    finally:
        api.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", cluster.ns, "jobsets", js["metadata"]["name"]
        )
