"""What deriving gangs from owners (kube.owners) costs a session: ``Cache.session_input`` over
the same pending pods, once as bare pods and once as the pods of indexed Jobs (8 each, the Jobs
in the cache's owner index), and once more as those Jobs submitted through Kueue (an admitted
Workload per Job, its LocalQueue and ResourceFlavor); the last two with an owner object changing
before every session, so every pod is derived again (no memo hits: the worst case). In the same
run. Prints the median of each and their ratio to bare:

    .venv/bin/python bench/owners.py [--jobs 250] [--per-job 8] [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from kallot.kube import owners, translate
from kallot.kube.state.cache import Cache
from kallot.testing.live import inventory_node_body, pod_body


def _job(name: str, pods: int) -> dict[str, Any]:
    return {
        "kind": "Job",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"parallelism": pods, "completions": pods},
    }


def _pod(job: str, i: int, derived: bool) -> dict[str, Any]:
    labels = {owners.LABEL_JOB_NAME: job, owners.LABEL_JOB_CONTROLLER_UID: f"uid-{job}"}
    body = pod_body(
        f"{job}-{i}", resources={translate.RESOURCE_GPU: "1"}, labels=labels if derived else {}
    )
    body["metadata"].update(namespace="team", uid=f"pod-{job}-{i}")
    return body


def _workload(job: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"job-{job}",
            "namespace": "team",
            "ownerReferences": [{"kind": "Job", "name": job, "controller": True}],
        },
        "spec": {"queueName": "lq"},
        "status": {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"}}],
            },
            "conditions": [{"type": "Admitted", "status": "True"}],
        },
    }


def session_seconds(
    derived: bool, jobs: int, per_job: int, reps: int, *, kueue: bool = False, churn: bool = False
) -> float:
    cache = Cache()
    for i in range(max(1, jobs * per_job // 8)):
        node = inventory_node_body(f"n{i}", gpus=8)
        node["metadata"]["labels"]["gpu"] = "a100"
        cache.apply_node("ADDED", node)
    if kueue:
        cache.owners.apply(
            owners.RESOURCEFLAVOR,
            "ADDED",
            {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"gpu": "a100"}}},
        )
        cache.owners.apply(
            owners.LOCALQUEUE,
            "ADDED",
            {"metadata": {"name": "lq", "namespace": "team"}, "spec": {"clusterQueue": "cq"}},
        )
    for j in range(jobs):
        if derived:
            cache.owners.apply(owners.JOB, "ADDED", _job(f"j{j}", per_job))
        if kueue:
            cache.owners.apply(owners.KUEUE_WORKLOAD, "ADDED", _workload(f"j{j}"))
        for i in range(per_job):
            cache.apply_pod("ADDED", _pod(f"j{j}", i, derived))
    times = []
    for rep in range(reps):
        if churn:  # an owner object changes between sessions: every pod is derived again
            cache.owners.apply(owners.JOB, "MODIFIED", _job(f"j{rep % jobs}", per_job))
        start = time.perf_counter()
        inp = cache.session_input()
        times.append(time.perf_counter() - start)
    assert len(inp.tasks) == jobs * per_job and len(inp.jobs) == (jobs if derived else 0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=250)
    parser.add_argument("--per-job", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    bare = session_seconds(False, args.jobs, args.per_job, args.reps)
    derived = session_seconds(True, args.jobs, args.per_job, args.reps)
    pods = args.jobs * args.per_job
    print(f"session_input, {pods} pending pods: bare {bare * 1e3:.1f} ms")
    churn = session_seconds(True, args.jobs, args.per_job, args.reps, churn=True)
    kueue = session_seconds(True, args.jobs, args.per_job, args.reps, kueue=True, churn=True)
    print(f"  as {args.jobs} Jobs' gangs: {derived * 1e3:.1f} ms ({derived / bare:.2f} x)")
    print(f"  Jobs' gangs, every pod derived again: {churn * 1e3:.1f} ms ({churn / bare:.2f} x)")
    print(f"  through Kueue, every pod derived again: {kueue * 1e3:.1f} ms ({kueue / bare:.2f} x)")


if __name__ == "__main__":
    main()
