"""The owner kinds as a table (kube.owners.KINDS): the chart's RBAC, the rendered manifests and
``kallot doctor``'s checks agree with it, and a kind is one entry (JAXJob, added as one, is
derived like the other Kubeflow training jobs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.kube import owners
from kallot.kube.ops import doctor
from kallot.kube.owners import rbac

ROOT = Path(__file__).resolve().parents[2]
NS = "ml"


def _granted(docs: list[dict[str, Any]], name: str) -> set[tuple[str, str, str]]:
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name)
    return {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_chart_block_is_the_one_the_table_writes() -> None:
    """charts/kallot/templates/rbac.yaml carries the block tools/gen_owner_rbac.py writes."""
    text = (ROOT / rbac.CHART_FILE).read_text()
    assert rbac.block(text) == rbac.render(), (
        "the owner kinds' RBAC is stale: run .venv/bin/python tools/gen_owner_rbac.py "
        "and bash deploy/render.sh"
    )


def test_deploy_manifest_and_doctor_grant_and_check_every_kind() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kallot.yaml").read_text()) if d]
    granted = _granted(docs, "kallot")
    assert set(owners.ACCESS) <= granted, set(owners.ACCESS) - granted
    assert set(owners.ACCESS) <= set(doctor.SCHEDULER_ACCESS)
    # one rule per kind with objects to read, read-only
    for k in owners.KINDS:
        if k.path:
            group, resource, verbs = k.rbac or ("", "", ())
            assert verbs == ("get", "list", "watch")
            assert owners.OWNER_PATHS[k.kind].endswith(f"/{resource}")
            assert (group == "") == k.path.startswith("/api/")


def test_one_entry_per_kind_and_every_path_is_a_collection() -> None:
    kinds = [k.kind for k in owners.KINDS]
    assert len(kinds) == len(set(kinds))
    assert set(owners.OWNER_PATHS) == {k.kind for k in owners.KINDS if k.path}
    for path in owners.OWNER_PATHS.values():
        parts = path.strip("/").split("/")
        assert parts[0] in ("api", "apis") and len(parts) == (3 if parts[0] == "api" else 4)
    # every entry that derives gangs has both halves of the rule
    assert all((k.claims is None) == (k.gang is None) for k in owners.KINDS)
    assert {
        owners.PYTORCHJOB,
        owners.TFJOB,
        owners.MPIJOB,
        owners.JAXJOB,
    } == owners.TRAINING_KINDS


def _jaxjob(workers: Any = 4) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "JAXJob",
        "metadata": {"name": "jax", "namespace": NS, "uid": "u-jax"},
        "spec": {"jaxReplicaSpecs": {"Worker": {"replicas": workers}}},
    }


def _jax_pod_facts(**labels: str) -> owners.PodFacts:
    """A pod as the training-operator makes it for a JAXJob: the job-name and replica-type
    labels, a controller ownerReference to the JAXJob."""
    return owners.PodFacts(
        NS,
        {owners.LABEL_TRAINING_JOB_NAME: "jax", owners.LABEL_TRAINING_REPLICA_TYPE: "worker"}
        | labels,
        {},
        ("kubeflow.org/v1", owners.JAXJOB, "jax", "u-jax"),
    )


def test_jaxjob_is_a_gang_of_its_workers_its_queue_label_counts() -> None:
    index = owners.OwnerIndex()
    assert index.derive(_jax_pod_facts()).wait == f"waiting for owner JAXJob {NS}/jax"
    job = _jaxjob()
    job["metadata"]["labels"] = {owners.LABEL_KUEUE_QUEUE: "lq"}
    index.apply(owners.JAXJOB, "ADDED", job)
    d = index.derive(_jax_pod_facts())
    assert d.job is not None and (d.job.id, d.job.min_available) == (f"{NS}/jaxjob/jax", 4)
    assert d.gang_source == f"JAXJob {NS}/jax (4 pods)"
    # the queue from the owner object's Kueue label (no LocalQueue read: its own name)
    assert (d.queue, d.queue_source) == (
        "lq",
        f"Kueue LocalQueue label {owners.LABEL_KUEUE_QUEUE} on JAXJob {NS}/jax",
    )
    assert owners.more_owner_names(_jax_pod_facts()) == {owners.JAXJOB: "jax"}


@pytest.mark.parametrize("workers", ["four", -1])
def test_malformed_jaxjob_runs_alone_with_a_note(workers: Any) -> None:
    index = owners.OwnerIndex()
    index.apply(owners.JAXJOB, "ADDED", _jaxjob(workers))
    d = index.derive(_jax_pod_facts())
    assert d.job is None and "jaxReplicaSpecs" not in d.note  # the generic field name
    assert d.note.startswith(f"JAXJob {NS}/jax: spec.*ReplicaSpecs[Worker].replicas")


def test_jaxjob_pod_without_labels_is_known_but_alone() -> None:
    facts = owners.PodFacts(NS, {}, {}, ("kubeflow.org/v1", owners.JAXJOB, "jax", "u"))
    d = owners.OwnerIndex().derive(facts)
    assert d.job is None and "left no labels kallot derives a gang from" in d.note


def test_jaxjob_kueue_workload_holds_it() -> None:
    """Kueue's kubeflow.org/jaxjob integration: the Workload is owned by the JAXJob."""
    index = owners.OwnerIndex()
    index.apply(owners.JAXJOB, "ADDED", _jaxjob())
    wl = {
        "metadata": {
            "name": "jaxjob-jax",
            "namespace": NS,
            "ownerReferences": [{"kind": owners.JAXJOB, "name": "jax", "controller": True}],
        },
        "spec": {"queueName": "lq"},
    }
    index.apply(owners.KUEUE_WORKLOAD, "ADDED", wl)
    d = index.derive(_jax_pod_facts())
    assert d.hold and "Kueue Workload ml/jaxjob-jax is not admitted" in d.wait
