"""sim.tenants: the team rule, the generated load, and a short run's invariants (quota
violations, do-not-disrupt and partial-gang evictions all zero; evicted work is restarted)."""

from __future__ import annotations

import pytest

from kallot.core.queueing.queue_tree import GPU_VALUE
from kallot.sim import tenants, trace


@pytest.fixture(scope="module")
def rows() -> tuple[list[trace.NodeRow], list[trace.PodRow]]:
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))
    return nodes, pods


def test_generated_load_matches_the_request(
    rows: tuple[list[trace.NodeRow], list[trace.PodRow]],
) -> None:
    # Each team draws pods until its share of load x capacity x horizon is offered, so the total
    # overshoots by at most one pod (or gang) per team: within a few % on 40 GPUs x 2 h.
    _, pods = rows
    work = tenants.generate(pods, capacity_milli=40_000, horizon_s=7200, load=1.2, seed=1)
    assert 1.2 <= work.offered_load < 1.3
    assert all(len([t for t in work.tasks if t.job == j]) == 4 for j in work.jobs)
    assert all(t.do_not_disrupt == (t.queue == "serving") for t in work.tasks)
    assert all(t.gpu is not None and t.gpu.count == 1 for t in work.tasks if t.queue == "serving")


def test_team_rule_is_deterministic_by_name(
    rows: tuple[list[trace.NodeRow], list[trace.PodRow]],
) -> None:
    _, pods = rows
    first = [tenants.team_of(p, tenants.TEAMS) for p in pods[:200]]
    assert first == [tenants.team_of(p, tenants.TEAMS) for p in pods[:200]]
    assert len(set(first)) == len(tenants.TEAMS)


def test_tree_scales_guarantees_to_the_cluster() -> None:
    # 100 value units: departments 45 / 45 / 10; nlp 30%, batch limited at 30%.
    tree = tenants.build_tree(100_000, {"T4": 40_000})
    v = tree.axis[GPU_VALUE]
    assert int(tree.guaranteed[tree.index["research"], v]) == 45_000
    assert int(tree.guaranteed[tree.index["nlp"], v]) == 30_000
    assert int(tree.limit[tree.index["batch"], v]) == 30_000
    # vision's per-model limit: a quarter of the 40 T4s
    assert int(tree.limit[tree.index["vision"], tree.axis["gpu/T4"]]) == 10_000


def test_short_run_keeps_the_invariants(
    rows: tuple[list[trace.NodeRow], list[trace.PodRow]],
) -> None:
    nodes, pods = rows
    cmp = tenants.compare(nodes, pods, n_nodes=8, horizon_s=3 * 3600, period_s=120, seed=2)
    s = cmp.summary()
    assert s["quota_violations"] == 0
    assert s["do_not_disrupt_evictions"] == 0
    assert s["partial_gang_evictions"] == 0
    assert s["min_runtime_evictions"] == 0
    # FIFO never evicts; kallot's evictions are counted with the work they lost.
    assert cmp.fifo.evictions == 0
    assert (cmp.kallot.evictions > 0) == (cmp.kallot.preempted_gpu_hours > 0)
    # Lending: kallot keeps at least as many GPUs busy as static quotas on the same workload.
    assert cmp.kallot.utilization_pct() >= cmp.fifo.utilization_pct()
