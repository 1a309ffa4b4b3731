"""Gangs and queues derived from a pod's owner chain (kube.owners), and the cache's use of them.

Pure: dicts as the owners' controllers write them, in; Tasks, Jobs and notes out. The real
control plane runs these owners in tests/kube/test_workloads_live.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.core.workload import NO_TOPOLOGY, TopologyConstraint, TopologyMode
from kallot.kube import owners, translate
from kallot.kube.ops.explain import describe
from kallot.kube.state.cache import Cache
from kallot.testing.live import inventory_node_body, pod_body

NS = "team"


def job_obj(name: str, parallelism: Any = 8, completions: Any = 8, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": extra.get("labels", {}),
            "annotations": extra.get("annotations", {}),
        },
        "spec": {"parallelism": parallelism, "completions": completions},
        "status": extra.get("status", {}),
    }


def job_pod(job: str, i: int, *, labels: Any = None, annotations: Any = None) -> dict[str, Any]:
    """A pod as the Job controller makes it: ownerReference, job-name, controller-uid, index."""
    body = pod_body(
        f"{job}-{i}",
        resources={translate.RESOURCE_GPU: "1"},
        labels={
            owners.LABEL_JOB_NAME: job,
            owners.LABEL_JOB_CONTROLLER_UID: f"uid-{job}",
            owners.LABEL_JOB_COMPLETION_INDEX: str(i),
            **(labels or {}),
        },
        annotations=annotations,
    )
    body["metadata"].update(
        namespace=NS,
        uid=f"pod-{job}-{i}",
        ownerReferences=[
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job,
                "uid": f"uid-{job}",
                "controller": True,
            }
        ],
    )
    return body


def resolve(index: owners.OwnerIndex, pod: dict[str, Any], waited: float = 0.0) -> Any:
    uid = pod["metadata"]["uid"]
    task = index.observe_pod(uid, pod, translate.pod_to_task(pod))
    return index.resolve(uid, task, waited_s=waited)


def test_indexed_job_is_a_gang_of_its_parallelism() -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JOB, "ADDED", job_obj("train", parallelism=8, completions=8))
    task, d = resolve(index, job_pod("train", 0))
    assert task.job == f"{NS}/job/train"
    assert d.job is not None and d.job.min_available == 8 and d.job.topology == NO_TOPOLOGY
    assert "spec.parallelism" in d.gang_source and not d.note


def test_job_members_counts_what_is_left_to_complete() -> None:
    job = job_obj("t", parallelism=8, completions=10, status={"succeeded": 5})
    assert owners.job_members(job) == 5
    assert owners.job_members(job_obj("t", parallelism=4, completions=None)) == 4
    assert "spec.parallelism" in str(owners.job_members(job_obj("t", parallelism="x")))


def test_single_pod_job_is_no_gang_and_no_note() -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JOB, "ADDED", job_obj("one", parallelism=1, completions=1))
    task, d = resolve(index, job_pod("one", 0))
    assert task.job == "" and d.job is None and d.note == ""


def test_pod_waits_for_its_job_then_runs_alone_with_a_note() -> None:
    index = owners.OwnerIndex()
    pod = job_pod("late", 0)
    task, d = resolve(index, pod)
    assert task.job == "" and "waiting for owner Job team/late" in d.wait
    task, d = index.resolve("pod-late-0", task, waited_s=owners.OWNER_GRACE_S)
    assert d.wait == "" and "scheduling alone" in d.note and task.job == ""
    assert index.notes["pod-late-0"] == d.note
    index.apply(owners.JOB, "ADDED", job_obj("late"))
    task, d = index.resolve("pod-late-0", task)
    assert task.job == f"{NS}/job/late" and "pod-late-0" not in index.notes


def test_pod_of_a_deleted_job_runs_alone_with_a_note() -> None:
    index = owners.OwnerIndex()
    job = job_obj("re")
    job["metadata"]["uid"] = "uid-new"
    index.apply(owners.JOB, "ADDED", job)
    task, d = resolve(index, job_pod("re", 0))
    assert task.job == "" and "uid-new" in d.note and "single pod" in d.note


def test_unknown_owner_runs_alone_with_a_note_and_replicasets_say_nothing() -> None:
    index = owners.OwnerIndex()
    pod = pod_body("odd", resources={translate.RESOURCE_GPU: "1"})
    pod["metadata"].update(
        namespace=NS,
        uid="odd",
        ownerReferences=[
            {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "controller": True}
        ],
    )
    task, d = resolve(index, pod)
    assert task.job == "" and "example.com/v1 Widget team/w" in d.note
    pod["metadata"]["ownerReferences"][0].update(apiVersion="apps/v1", kind="ReplicaSet")
    task, d = resolve(index, pod)
    assert task.job == "" and d.note == "" and "odd" not in index.notes


def test_jobset_without_its_object_sums_its_jobs_and_exclusive_makes_one_gang_per_job() -> None:
    index = owners.OwnerIndex()
    labels = {owners.LABEL_JOBSET_NAME: "js", owners.LABEL_JOBSET_REPLICATED_JOB: "w"}
    for j in range(2):
        index.apply(owners.JOB, "ADDED", job_obj(f"js-w-{j}", 4, 4, labels=labels))
    task, d = resolve(index, job_pod("js-w-0", 0, labels=labels))
    assert task.job == f"{NS}/jobset/js" and d.job is not None and d.job.min_available == 8
    # the replicas label says 3 Jobs: the pods wait for the third
    more = {**labels, owners.LABEL_JOBSET_REPLICAS: "3"}
    index.apply(owners.JOB, "ADDED", job_obj("js-w-1", 4, 4, labels=more))
    task, d = resolve(index, job_pod("js-w-0", 0, labels=labels))
    assert task.job == "" and "w: 2 of 3" in d.wait
    index.apply(owners.JOB, "ADDED", job_obj("js-w-2", 4, 4, labels=more))
    task, d = resolve(index, job_pod("js-w-0", 0, labels=labels))
    assert d.job is not None and d.job.min_available == 12
    index.apply(owners.JOB, "DELETED", job_obj("js-w-2"))
    excl = {owners.ANN_JOBSET_EXCLUSIVE: "kallot.io/rack"}
    task, d = resolve(index, job_pod("js-w-1", 2, labels=labels, annotations=excl))
    assert task.job == f"{NS}/job/js-w-1" and d.job is not None
    assert d.job.min_available == 4
    assert d.job.topology == TopologyConstraint(mode=TopologyMode.REQUIRED, level="kallot.io/rack")


def test_jobset_object_gives_replicas_times_parallelism() -> None:
    js: dict[str, Any] = {
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": NS},
        "spec": {
            "replicatedJobs": [
                {"name": "a", "replicas": 3, "template": {"spec": {"parallelism": 2}}},
                {"name": "b", "template": {"spec": {"parallelism": 1, "completions": 1}}},
            ]
        },
    }
    assert owners.jobset_members(js) == 7
    js["spec"]["replicatedJobs"][0]["replicas"] = -1
    assert "replicatedJobs[0].replicas" in str(owners.jobset_members(js))


def test_leaderworkerset_group_is_a_gang_of_its_size_in_one_domain() -> None:
    index = owners.OwnerIndex()
    pod = pod_body(
        "lws-1-2",
        resources={translate.RESOURCE_GPU: "8"},
        labels={owners.LABEL_LWS_NAME: "serve", owners.LABEL_LWS_GROUP_INDEX: "1"},
        annotations={owners.ANN_LWS_SIZE: "4", owners.ANN_LWS_EXCLUSIVE: "kallot.io/block"},
    )
    pod["metadata"].update(namespace=NS, uid="l")
    task, d = resolve(index, pod)
    assert task.job == f"{NS}/lws/serve-1" and d.job is not None and d.job.min_available == 4
    assert d.job.topology.level == "kallot.io/block"
    pod["metadata"]["annotations"][owners.ANN_LWS_SIZE] = "four"
    task, d = resolve(index, pod)
    assert task.job == "" and owners.ANN_LWS_SIZE in d.note


def test_kueue_pod_group_and_local_queue() -> None:
    index = owners.OwnerIndex()
    pod = pod_body(
        "k0",
        resources={translate.RESOURCE_GPU: "1"},
        labels={owners.LABEL_KUEUE_POD_GROUP: "g", owners.LABEL_KUEUE_QUEUE: "research"},
        annotations={owners.ANN_KUEUE_POD_GROUP_TOTAL: "3"},
    )
    pod["metadata"].update(namespace=NS, uid="k0")
    task, d = resolve(index, pod)
    assert (task.job, task.queue) == (f"{NS}/kueue/g", "research")
    assert d.job is not None and d.job.min_available == 3 and d.job.queue == "research"
    assert "LocalQueue" in d.queue_source
    pod["metadata"]["annotations"][owners.ANN_KUEUE_POD_GROUP_TOTAL] = "0"
    task, d = resolve(index, pod)
    assert task.job == "" and "pod-group-total-count" in d.note


def test_explicit_kallot_labels_win() -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JOB, "ADDED", job_obj("train"))
    pod = job_pod(
        "train",
        0,
        labels={
            translate.LABEL_POD_GROUP: "mine",
            translate.LABEL_QUEUE: "team-a",
            owners.LABEL_KUEUE_QUEUE: "other",
        },
    )
    task, d = resolve(index, pod)
    assert (task.job, task.queue) == (f"{NS}/mine", "team-a")
    assert d.job is None and "kallot.io/pod-group" in d.gang_source
    assert "kallot.io/queue" in d.queue_source


def test_queue_from_the_owner_objects_label() -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JOB, "ADDED", job_obj("train", labels={translate.LABEL_QUEUE: "team-b"}))
    task, d = resolve(index, job_pod("train", 0))
    assert task.queue == "team-b" and d.job is not None and d.job.queue == "team-b"
    assert "Job team/train" in d.queue_source


@pytest.mark.parametrize(
    ("kind", "label", "obj", "members"),
    [
        (
            owners.PYTORCHJOB,
            owners.LABEL_TRAINING_JOB_NAME,
            {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 7}}},
            8,
        ),
        (
            owners.RAYCLUSTER,
            owners.LABEL_RAY_CLUSTER,
            {"workerGroupSpecs": [{"minReplicas": 2, "numOfHosts": 2}, {"minReplicas": 3}]},
            8,
        ),
    ],
)
def test_training_jobs_and_rayclusters(kind: str, label: str, obj: Any, members: int) -> None:
    index = owners.OwnerIndex()
    pod = pod_body("p", resources={translate.RESOURCE_GPU: "1"}, labels={label: "x"})
    pod["metadata"].update(namespace=NS, uid="p")
    task, d = resolve(index, pod)
    assert task.job == "" and kind in d.wait
    index.apply(
        kind, "ADDED", {"kind": kind, "metadata": {"name": "x", "namespace": NS}, "spec": obj}
    )
    task, d = resolve(index, pod)
    assert d.job is not None and d.job.min_available == members and task.job == d.job.id


def test_cache_session_gives_the_derived_gang_and_holds_pods_waiting_for_their_owner() -> None:
    now = [0.0]
    cache = Cache(clock=lambda: now[0])
    cache.apply_node("ADDED", inventory_node_body("n0", gpus=8))
    pods = [job_pod("train", i) for i in range(3)]
    for p in pods:
        cache.apply_pod("ADDED", p)
    inp = cache.session_input()
    assert not inp.tasks and set(inp.waiting) == {p["metadata"]["uid"] for p in pods}
    assert "waiting for owner Job team/train" in next(iter(inp.waiting.values())).message()
    for uid, diagnosis in inp.waiting.items():
        cache.park(uid, diagnosis)
    cache.owners.apply(owners.JOB, "ADDED", job_obj("train", parallelism=3, completions=3))
    now[0] += cache.tuning.retry_interval
    inp = cache.session_input()
    assert {t.job for t in inp.tasks} == {f"{NS}/job/train"} and len(inp.tasks) == 3
    assert inp.jobs[f"{NS}/job/train"].min_available == 3


def test_explain_names_the_gang_queue_and_source() -> None:
    pod = job_pod("train", 0, labels={owners.LABEL_KUEUE_QUEUE: "research"})
    pod["spec"]["schedulerName"] = "kallot"
    lines = describe(pod, owner_objects={owners.JOB: [job_obj("train")]}).lines()
    text = "\n".join(lines)
    assert "Gang: team/job/train, 8 pods start together (from Job team/train" in text
    assert "Queue: research (from Kueue LocalQueue label" in text


DOCS = Path(__file__).resolve().parents[2] / "docs" / "workloads.md"


def _doc_examples() -> list[tuple[str, int, list[dict[str, Any]]]]:
    out = []
    for block in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.S):
        m = re.search(r"# kallot gang: (.*?), (\d+) pods", block)
        assert m is not None, block[:80]
        out.append((m.group(1), int(m.group(2)), [d for d in yaml.safe_load_all(block) if d]))
    return out


@pytest.mark.parametrize(("gang", "members", "objs"), _doc_examples(), ids=lambda v: str(v)[:30])
def test_workloads_doc_examples_derive_the_gang_they_name(
    gang: str, members: int, objs: list[dict[str, Any]]
) -> None:
    """Each example of docs/workloads.md, with the pods its controller would make, derives the
    gang its comment names."""
    obj = objs[0]
    obj["metadata"]["namespace"] = "ml"
    kind, name, ann = obj["kind"], obj["metadata"]["name"], obj["metadata"].get("annotations", {})
    index = owners.OwnerIndex()
    facts: owners.PodFacts
    if kind == "Job":
        index.apply(owners.JOB, "ADDED", obj)
        facts = owners.PodFacts("ml", {owners.LABEL_JOB_NAME: name}, {}, ("", "", "", ""))
    elif kind == "JobSet":
        rj = obj["spec"]["replicatedJobs"][0]
        child = {"metadata": {"name": f"{name}-{rj['name']}-0", "namespace": "ml"}}
        index.apply(owners.JOB, "ADDED", {**child, "spec": rj["template"]["spec"]})
        index.apply(owners.JOBSET, "ADDED", obj)
        labels = {owners.LABEL_JOBSET_NAME: name, owners.LABEL_JOB_NAME: child["metadata"]["name"]}
        facts = owners.PodFacts("ml", labels, ann, ("", "", "", ""))
    elif kind == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        labels = {owners.LABEL_LWS_NAME: name, owners.LABEL_LWS_GROUP_INDEX: "0"}
        ann = {**ann, owners.ANN_LWS_SIZE: str(lwt["size"])}
        if "subGroupPolicy" in lwt:  # as the LWS controller and pod webhook write them
            ann[owners.ANN_LWS_SUBGROUP_SIZE] = str(lwt["subGroupPolicy"]["subGroupSize"])
            labels[owners.LABEL_LWS_SUBGROUP_INDEX] = "1"
        facts = owners.PodFacts("ml", labels, ann, ("", "", "", ""))
    elif kind in (owners.PYTORCHJOB, owners.TFJOB, owners.MPIJOB, owners.RAYCLUSTER):
        index.apply(kind, "ADDED", obj)
        label = (
            owners.LABEL_RAY_CLUSTER
            if kind == owners.RAYCLUSTER
            else owners.LABEL_TRAINING_JOB_NAME
        )
        ctrl = (obj["apiVersion"], kind, name, "uid")
        facts = owners.PodFacts("ml", {label: name}, {}, ctrl)
    elif kind == owners.TRAINJOB:
        # the JobSet the torch-distributed runtime makes: numNodes pods of replicated job node
        index.apply(kind, "ADDED", obj)
        nodes = obj["spec"]["trainer"]["numNodes"]
        ref = {"kind": kind, "name": name, "controller": True}
        index.apply(
            owners.JOBSET,
            "ADDED",
            {
                "metadata": {"name": name, "namespace": "ml", "ownerReferences": [ref]},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {"spec": {"parallelism": nodes}},
                        }
                    ]
                },
            },
        )
        labels = {owners.LABEL_JOBSET_NAME: name, owners.LABEL_JOBSET_REPLICATED_JOB: "node"}
        facts = owners.PodFacts("ml", labels, {}, ("", "", "", ""))
    elif kind == "PodGroup":
        index.apply(owners.K8S_PODGROUP, "ADDED", obj)
        pod = objs[1]
        translate.pod_to_task(pod)  # a valid kallot pod
        facts = owners.PodFacts.of({**pod, "metadata": {**pod["metadata"], "namespace": "ml"}})
    else:
        assert all(o["kind"] == "Pod" for o in objs) and len(objs) == members
        for o in objs:
            translate.pod_to_task(o)  # the pods are valid kallot pods
        facts = owners.PodFacts.of({**obj, "metadata": {**obj["metadata"], "namespace": "ml"}})
    d = index.derive(facts)
    assert d.job is not None, d
    assert d.job.min_available == members
    assert d.job.id in gang


# -- the owners of issue 22's second half: subgroups, stages, Kueue, the Workload API ---------


def _facts(labels: dict[str, str], ann: dict[str, str] | None = None, **kw: Any) -> owners.PodFacts:
    return owners.PodFacts(NS, labels, ann or {}, kw.pop("controller", ("", "", "", "")), **kw)


@pytest.mark.parametrize(
    ("size", "sub_size", "policy", "expected"),
    [
        # (size - 1) % subGroupSize != 0: pods 0..size-1 in runs of subGroupSize
        (4, 2, "", {0: 2, 1: 2}),
        # (size - 1) % subGroupSize == 0: the leader is an extra pod of subgroup 0
        (5, 2, "", {0: 3, 1: 2}),
        # LeaderExcluded: workers only
        (5, 2, owners.LWS_LEADER_EXCLUDED, {0: 2, 1: 2}),
    ],
)
def test_lws_subgroup_sizes_follow_the_lws_webhook(
    size: int, sub_size: int, policy: str, expected: dict[int, int]
) -> None:
    """Subgroup sizes against a brute-force replay of the LWS pod webhook's numbering."""
    members: dict[int, int] = {}
    for worker in range(size):
        if worker == 0:
            if policy == owners.LWS_LEADER_EXCLUDED:
                continue
            sub = 0
        elif (size - 1) % sub_size == 0:
            sub = (worker - 1) // sub_size
        else:
            sub = worker // sub_size
        members[sub] = members.get(sub, 0) + 1
    assert members == expected
    index = owners.OwnerIndex()
    for sub, n in expected.items():
        ann = {owners.ANN_LWS_SIZE: str(size), owners.ANN_LWS_SUBGROUP_SIZE: str(sub_size)}
        if policy:
            ann[owners.ANN_LWS_SUBGROUP_POLICY] = policy
        labels = {
            owners.LABEL_LWS_NAME: "llm",
            owners.LABEL_LWS_GROUP_INDEX: "0",
            owners.LABEL_LWS_SUBGROUP_INDEX: str(sub),
        }
        d = index.derive(_facts(labels, ann))
        assert d.job is not None and d.job.id == f"{NS}/lws/llm-0-sub{sub}", d
        assert d.job.min_available == n


def test_jobset_dependson_stages_are_separate_gangs() -> None:
    index = owners.OwnerIndex()
    tmpl = {"spec": {"parallelism": 2, "completions": 2}}
    index.apply(
        owners.JOBSET,
        "ADDED",
        {
            "metadata": {"name": "tj", "namespace": NS},
            "spec": {
                "replicatedJobs": [
                    {"name": "init", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
                    {
                        "name": "node",
                        "replicas": 2,
                        "template": tmpl,
                        "dependsOn": [{"name": "init"}],
                    },
                ]
            },
        },
    )
    first = index.derive(
        _facts({owners.LABEL_JOBSET_NAME: "tj", owners.LABEL_JOBSET_REPLICATED_JOB: "init"})
    )
    later = index.derive(
        _facts({owners.LABEL_JOBSET_NAME: "tj", owners.LABEL_JOBSET_REPLICATED_JOB: "node"})
    )
    assert first.job is not None and (first.job.id, first.job.min_available) == (
        f"{NS}/jobset/tj",
        1,
    )
    assert later.job is not None
    assert (later.job.id, later.job.min_available) == (f"{NS}/jobset/tj/after-init", 4)


def test_training_kind_comes_from_the_controller_reference() -> None:
    index = owners.OwnerIndex()
    index.apply(
        owners.TFJOB,
        "ADDED",
        {
            "kind": "TFJob",
            "metadata": {"name": "tf", "namespace": NS},
            "spec": {"tfReplicaSpecs": {"PS": {"replicas": 1}, "Worker": {"replicas": 2}}},
        },
    )
    d = index.derive(
        _facts(
            {owners.LABEL_TRAINING_JOB_NAME: "tf"},
            controller=("kubeflow.org/v1", "TFJob", "tf", "u"),
        )
    )
    assert d.job is not None and (d.job.id, d.job.min_available) == (f"{NS}/tfjob/tf", 3)


def test_queue_sources_in_order() -> None:
    """kallot label > admitted Workload's ClusterQueue > LocalQueue (-> its ClusterQueue) >
    the namespace's kallot.io/queue label > the namespace's Kueue LocalQueue ``default``."""
    index = owners.OwnerIndex()

    def queue(labels: dict[str, str]) -> tuple[str, str]:
        d = index.derive(_facts(labels, name="p"))
        return d.queue, d.queue_source

    assert queue({}) == ("", "")
    index.apply(
        owners.LOCALQUEUE,
        "ADDED",
        {"metadata": {"name": "default", "namespace": NS}, "spec": {"clusterQueue": "cq-default"}},
    )
    assert queue({})[0] == "cq-default"
    index.apply(
        owners.NAMESPACE,
        "ADDED",
        {"metadata": {"name": NS, "labels": {translate.LABEL_QUEUE: "ns-q"}}},
    )
    assert queue({}) == (
        "ns-q",
        f"label {translate.LABEL_QUEUE} on namespace {NS} (its default queue)",
    )
    assert queue({owners.LABEL_KUEUE_QUEUE: "lq"})[0] == "lq"  # no LocalQueue object: its name
    index.apply(
        owners.LOCALQUEUE,
        "ADDED",
        {"metadata": {"name": "lq", "namespace": NS}, "spec": {"clusterQueue": "cq"}},
    )
    assert queue({owners.LABEL_KUEUE_QUEUE: "lq"})[0] == "cq"
    assert queue({owners.LABEL_KUEUE_QUEUE: "lq", translate.LABEL_QUEUE: "mine"})[0] == "mine"


def test_kueue_workload_holds_until_admitted_then_sets_flavor_labels() -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JOB, "ADDED", job_obj("train", 2, 2))
    wl = {
        "metadata": {
            "name": "job-train-x",
            "namespace": NS,
            "ownerReferences": [{"kind": "Job", "name": "train", "controller": True}],
        },
        "spec": {"queueName": "lq"},
    }
    index.apply(owners.KUEUE_WORKLOAD, "ADDED", wl)
    facts = owners.PodFacts.of(job_pod("train", 0))
    d = index.derive(facts)
    assert d.hold and "Kueue Workload team/job-train-x is not admitted" in d.wait
    assert d.job is not None  # the gang stays known while held
    admitted = {
        **wl,
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"}}],
            },
            "conditions": [{"type": "Admitted", "status": "True"}],
        },
    }
    index.apply(owners.KUEUE_WORKLOAD, "MODIFIED", admitted)
    d = index.derive(facts)
    assert d.wait == "waiting for Kueue ResourceFlavor a100 (team/job-train-x)" and not d.hold
    index.apply(
        owners.RESOURCEFLAVOR,
        "ADDED",
        {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"gpu": "a100"}}},
    )
    d = index.derive(facts)
    assert (d.wait, d.queue, dict(d.node_selector)) == ("", "cq", {"gpu": "a100"})
    # In the cache: the task carries the flavor's labels while admitted, and loses them (but
    # keeps the pod's own nodeSelector) when the Workload goes (evicted, deleted).
    pod = job_pod("train", 0)
    pod["spec"]["nodeSelector"] = {"zone": "a"}
    task = index.observe_pod("u", pod, translate.pod_to_task(pod))
    assert dict(task.node_selector) == {"zone": "a", "gpu": "a100"} and task.queue == "cq"
    index.apply(owners.KUEUE_WORKLOAD, "DELETED", admitted)
    assert index.derive(facts).queue == ""
    task, _ = index.resolve("u", task)
    assert dict(task.node_selector) == {"zone": "a"} and task.queue == ""


def test_upstream_podgroup_gang_basic_and_topology() -> None:
    index = owners.OwnerIndex()

    def pg(name: str, policy: dict[str, Any], **spec: Any) -> None:
        index.apply(
            owners.K8S_PODGROUP,
            "ADDED",
            {
                "metadata": {"name": name, "namespace": NS},
                "spec": {"schedulingPolicy": policy, **spec},
            },
        )

    pg("g", {"gang": {"minCount": 4}}, schedulingConstraints={"topology": [{"key": "rack"}]})
    pg("b", {"basic": {}})
    pg("bad", {"gang": {"minCount": 0}})
    d = index.derive(_facts({}, scheduling_group="g"))
    assert d.job is not None and (d.job.id, d.job.min_available) == (f"{NS}/podgroup/g", 4)
    assert d.job.topology == TopologyConstraint(mode=TopologyMode.REQUIRED, level="rack")
    assert index.derive(_facts({}, scheduling_group="b")).job is None
    assert "minCount" in index.derive(_facts({}, scheduling_group="bad")).note
    assert index.derive(_facts({}, scheduling_group="none")).wait


def test_kueue_pod_group_workload_is_the_one_named_after_the_group() -> None:
    index = owners.OwnerIndex()
    labels = {owners.LABEL_KUEUE_POD_GROUP: "sweep", owners.LABEL_KUEUE_QUEUE: "lq"}
    ann = {owners.ANN_KUEUE_POD_GROUP_TOTAL: "2"}
    facts = _facts(labels, ann, name="sweep-0")
    assert not index.derive(facts).wait  # no Workload (no Kueue): the group alone decides
    index.apply(
        owners.KUEUE_WORKLOAD,
        "ADDED",
        {"metadata": {"name": "sweep", "namespace": NS}, "spec": {"queueName": "lq"}},
    )
    d = index.derive(facts)
    assert d.hold and d.job is not None and d.job.id == f"{NS}/kueue/sweep"
