"""Sessions follow each other while work is queued: a session's cut leaves the cache marked
changed (so the controller does not wait for a change that is not coming), the session size
follows the documented rule (kube/ops/sizing.py), and on the real API server a backlog many
sessions deep drains with an idle timeout of an hour, i.e. without ever waiting for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.aio import client as aio_client

from kallot.cli.scheduler import build_scheduler
from kallot.core.errors import ConfigError
from kallot.k8sclient.api import proxy_once
from kallot.kube.api.client import KubeClient
from kallot.kube.app import Controller, ControllerConfig
from kallot.kube.ops.sizing import SessionSizer, SessionSizing
from kallot.kube.state.cache import Cache
from kallot.kube.watch.reflector import Reflector
from kallot.testing.live import Cluster, inventory_node_body, pod_body


def _pod(i: int, priority: int = 0) -> dict[str, Any]:
    body = pod_body(f"p{i:03d}", resources={"nvidia.com/gpu": "1"})
    body["metadata"].update(uid=f"u{i:03d}", namespace="ns", resourceVersion=str(i + 1))
    body["spec"]["priority"] = priority
    return body


def _cache(pods: int) -> Cache:
    cache = Cache()
    cache.apply_node("ADDED", inventory_node_body("n0", 8))
    for i in range(pods):
        cache.apply_pod("ADDED", _pod(i))
    return cache


def test_a_cut_session_leaves_the_rest_as_work_for_the_next_one() -> None:
    cache = _cache(12)
    inp = cache.session_input(max_tasks=5)
    assert len(inp.tasks) == 5
    assert cache.backlog == 7
    # Nothing else will happen in the cluster: the 7 pods left behind must still wake the loop.
    assert cache.changed.is_set()
    rest = cache.session_input(max_tasks=0)
    assert {t.id for t in rest.tasks} == {f"u{i:03d}" for i in range(12)}  # none assumed
    assert cache.backlog == 0
    assert not cache.changed.is_set()


def test_excluded_pods_are_neither_taken_nor_counted_as_backlog() -> None:
    cache = _cache(6)
    held = frozenset({"u000", "u001", "u002"})
    inp = cache.session_input(max_tasks=3, exclude=held)
    assert {t.id for t in inp.tasks} == {"u003", "u004", "u005"}
    # Pods that sit out (preemptors waiting for victims) must not make the loop spin.
    assert cache.backlog == 0
    assert not cache.changed.is_set()


async def test_the_loop_does_not_wait_while_the_cut_left_work() -> None:
    client = KubeClient(aio_client.ApiClient())  # never sends a request here
    try:
        _, core = build_scheduler("kallot")
        ctl = Controller(client, core, ControllerConfig(leader_elect=False, idle_wait_s=3600.0))
        ctl.cache.apply_node("ADDED", inventory_node_body("n0", 8))
        for i in range(4):
            ctl.cache.apply_pod("ADDED", _pod(i))
        ctl.cache.session_input(max_tasks=1)
        # Returns without suspending once: no timer, no event to wait for.
        coro = ctl._wait_for_work()
        with pytest.raises(StopIteration):
            coro.send(None)
    finally:
        await client.close()


# -- the sizing rule ---------------------------------------------------------------------------


def test_first_session_takes_the_minimum_then_sessions_last_the_target() -> None:
    sizer = SessionSizer(SessionSizing(target_s=0.5, min_pods=100))
    assert sizer.next_size() == 100
    # A session costs a + b*n: 0.1 s fixed plus 0.1 ms per pod.
    for _ in range(30):
        n = sizer.next_size()
        sizer.observe(n, 0.1 + 1e-4 * n)
    n = sizer.next_size()
    assert abs((0.1 + 1e-4 * n) - 0.5) < 0.01, n  # settles where a + b*n = target
    a, b = sizer.cost()  # type: ignore[misc]
    assert abs(a - 0.1) < 1e-6 and abs(b - 1e-4) < 1e-9


def test_a_fixed_cost_above_half_the_target_doubles_the_session_instead_of_shrinking_it() -> None:
    # 0.6 s of fixed cost per session (a loaded machine, 50,000 pods in the cache) against a
    # 0.25 s target: shrinking to the minimum would spend nearly all the time on fixed costs.
    sizer = SessionSizer(SessionSizing(target_s=0.25, min_pods=100))
    for _ in range(30):
        n = sizer.next_size()
        sizer.observe(n, 0.6 + 2e-4 * n)
    n = sizer.next_size()
    assert abs(n - 0.6 / 2e-4) < 30, n  # the fixed cost is half the session


def test_small_sessions_do_not_shrink_the_estimate() -> None:
    sizer = SessionSizer(SessionSizing(target_s=0.2, min_pods=100))
    sizer.observe(1000, 0.1)
    assert sizer.next_size() == 2000
    for _ in range(10):
        sizer.observe(3, 0.05)  # a trickle: all fixed cost
    assert sizer.next_size() == 2000


@given(
    st.floats(1e-3, 5.0),
    st.integers(1, 500),
    st.integers(0, 5000),
    st.lists(st.tuples(st.integers(0, 20_000), st.floats(1e-4, 10.0)), max_size=20),
)
def test_size_stays_within_its_bounds(
    target: float, low: int, high: int, sessions: list[tuple[int, float]]
) -> None:
    high = 0 if high < low else high
    sizer = SessionSizer(SessionSizing(target_s=target, min_pods=low, max_pods=high))
    for pods, seconds in sessions:
        sizer.observe(pods, seconds)
        n = sizer.next_size()
        assert n >= low
        assert not high or n <= high


def test_the_next_session_carries_what_the_binder_binds_while_a_session_runs() -> None:
    sizer = SessionSizer(SessionSizing(target_s=0.25, min_pods=100))
    for _ in range(10):  # cheap sessions by CPU: 0.05 s fixed, 0.1 ms a pod -> 2000 pods
        sizer.observe(1000, 0.05 + 1e-4 * 1000)
    by_cpu = sizer.next_size()
    # But a session takes 4 s of wall time (a loaded machine) while the binder completes
    # 800 binds a second: the next session must carry at least 4 s of binds.
    sizer.fed(500.0, 4.0, dry=False)
    assert by_cpu < 2500 and sizer.next_size() == 2500
    # The binder ran dry while the last session (1000 pods) decided: at least twice as many.
    sizer.fed(10.0, 1.0, dry=True)
    assert sizer.next_size() == max(by_cpu, 2000)
    # Never more than twice what the CPU rule gives: a longer session is a longer pause.
    sizer.fed(5000.0, 4.0, dry=True)
    assert sizer.next_size() == 2 * by_cpu
    sizer.fed(10.0, 1.0, dry=False)  # fed again: the CPU rule alone
    assert sizer.next_size() == by_cpu


def test_a_session_is_cut_to_what_fits_in_its_wall_time_bound() -> None:
    sizer = SessionSizer(SessionSizing(target_s=0.25, min_pods=100, max_wall_s=0.5))
    for _ in range(20):  # 0.01 s fixed, 0.1 ms a pod of CPU; wall time 4x the CPU time
        n = sizer.next_size()
        cpu = 0.01 + 1e-4 * n
        sizer.observe(n, cpu, wall_s=4 * cpu)
    # Binds still queued at each session's end: no pause, the CPU rule alone.
    sizer.fed(1.0, 1.0, dry=False)
    assert abs(sizer.next_size() - 2400) <= 10
    sizer.fed(1.0, 1.0, dry=True)  # the binder ran dry: the sessions are the limit
    # By CPU alone (0.25 - 0.01) / 1e-4 = 2400 pods, 0.25 s of CPU, 1 s of wall time; within
    # 0.5 s of wall time (0.125 s of CPU): (0.125 - 0.01) / 1e-4 = 1150.
    assert abs(sizer.next_size() - 1150) <= 10
    sizer.fed(5000.0, 4.0, dry=True)  # the binder-fed floor does not pass the bound either
    assert abs(sizer.next_size() - 1150) <= 10
    # A machine so loaded that nothing fits: the least session still runs.
    for _ in range(20):
        sizer.observe(100, 0.02, wall_s=2.0)
    sizer.fed(1.0, 1.0, dry=True)
    assert sizer.next_size() == 100
    # A large fixed cost (0.2 s: tens of thousands of pods pending) on a loaded machine: the
    # cut stops where the fixed cost is half the session, not at the least session.
    heavy = SessionSizer(SessionSizing(target_s=0.25, min_pods=100, max_wall_s=0.75))
    for _ in range(30):
        n = heavy.next_size()
        cpu = 0.2 + 1e-4 * n
        heavy.observe(n, cpu, wall_s=4 * cpu)
        heavy.fed(1.0, 4 * cpu, dry=True)
    assert abs(heavy.next_size() - 2000) <= 20
    # Without the bound, the CPU rule (and the floor) again.
    free = SessionSizer(SessionSizing(target_s=0.25, min_pods=100, max_wall_s=0))
    for _ in range(20):
        n = free.next_size()
        free.observe(n, 0.01 + 1e-4 * n, wall_s=4 * (0.01 + 1e-4 * n))
    free.fed(1.0, 1.0, dry=True)
    # (the binder-fed floor: twice the last session when the binder ran dry, no wall bound)
    assert abs(free.next_size() - 4800) <= 20


@given(
    st.integers(1, 500),
    st.integers(0, 5000),
    st.lists(
        st.tuples(
            st.integers(0, 20_000), st.floats(1e-4, 10.0), st.floats(0.0, 1e4), st.booleans()
        ),
        max_size=20,
    ),
)
def test_size_stays_within_its_bounds_when_fed(
    low: int, high: int, sessions: list[tuple[int, float, float, bool]]
) -> None:
    high = 0 if high < low else high
    sizer = SessionSizer(SessionSizing(target_s=0.25, min_pods=low, max_pods=high))
    for pods, seconds, rate, dry in sessions:
        sizer.observe(pods, seconds)
        sizer.fed(rate, seconds, dry=dry)
        n = sizer.next_size()
        assert n >= low
        assert not high or n <= high


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"target_s": 0.0}, "--session-target"),
        ({"min_pods": 0}, "--min-session-pods"),
        ({"min_pods": 10, "max_pods": 5}, "--max-session-pods"),
        ({"memory": 1.0}, "memory"),
    ],
)
def test_bad_sizing_is_one_line_naming_the_setting(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        SessionSizing(**kwargs)


# -- on the real API server ------------------------------------------------------------------


@pytest.mark.controlplane
async def test_backlog_drains_session_after_session_without_the_idle_timeout(
    cluster: Cluster,
) -> None:
    nodes = [inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(4)]
    await asyncio.to_thread(cluster.add_nodes, nodes)
    names = [f"d{i:02d}" for i in range(30)]
    bodies = [pod_body(n, resources={"nvidia.com/gpu": "1"}) for n in names]
    await asyncio.to_thread(cluster.create_pods, bodies)
    client = await KubeClient.connect(cluster.cp.kubeconfig_path)
    _, core = build_scheduler("kallot")
    # Six sessions of 5 pods, and an idle wait of an hour: if any session waited for the idle
    # timeout instead of starting on the pods the previous one left, this would not finish.
    config = ControllerConfig(
        leader_elect=False,
        metrics_port=0,
        idle_wait_s=3600.0,
        watch_crds=False,
        sizing=SessionSizing(min_pods=5, max_pods=5),
    )
    ctl = Controller(client, core, config)
    task = asyncio.create_task(ctl.run())
    try:
        deadline = time.monotonic() + 120
        pods: list[dict[str, Any]] = []
        while True:
            assert not task.done(), task
            pods = await asyncio.to_thread(cluster.pods)
            if all(p["spec"].get("nodeName") for p in pods):
                break
            assert time.monotonic() < deadline, "timed out waiting for the 30 pods to be bound"
            await asyncio.sleep(0.2)
        assert sorted(p["metadata"]["name"] for p in pods) == names
        assert ctl.sessions >= 6
        cluster.assert_no_overcommit(pods)
    finally:
        ctl.stop()
        await asyncio.wait_for(task, 30)
        await client.close()


@pytest.mark.controlplane
async def test_first_list_reaches_the_cache_page_by_page_and_a_relist_replaces(
    cluster: Cluster,
) -> None:
    await asyncio.to_thread(cluster.create_pods, [pod_body(f"r{i}") for i in range(7)])
    client = await KubeClient.connect(cluster.cp.kubeconfig_path)
    cache = Cache()
    calls: list[tuple[str, int]] = []  # ("event", pods in the cache after it), ("replace", items)

    def on_event(kind: str, obj: Mapping[str, Any]) -> None:
        cache.apply_pod(kind, obj)
        calls.append(("event", len(list(cache.pods()))))

    def on_replace(items: Any) -> None:
        items = list(items)
        cache.replace_pods(items)
        calls.append(("replace", len(items)))

    path = f"/api/v1/namespaces/{cluster.ns}/pods"
    pods = Reflector(
        client, path, name="pods", on_replace=on_replace, on_event=on_event, page_size=2
    )
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 30)
        # Seven pods in pages of two, each handed over as it came: the cache grew one pod at a
        # time, no replace.
        assert calls == [("event", i) for i in range(1, 8)]
        assert {e.name for e in cache.pods()} == {f"r{i}" for i in range(7)}
        # A later list is a replace: it carries what is left, and the cache follows it.
        await asyncio.to_thread(cluster.delete_pod, "r3")
        calls.clear()
        await asyncio.wait_for(pods.relist(), 30)
        assert ("replace", 6) in calls
        assert {e.name for e in cache.pods()} == {f"r{i}" for i in range(7)} - {"r3"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


@pytest.mark.parametrize(
    ("env", "proxy"),
    [
        ({"HTTPS_PROXY": "http://proxy.example:3128"}, "http://proxy.example:3128"),
        ({"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "10.0.0.1"}, None),
        ({}, None),
    ],
)
def test_proxy_environment_is_read_once_not_per_request(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], proxy: str | None
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    configuration = aio_client.Configuration(host="https://10.0.0.1:6443")
    proxy_once(configuration)
    assert configuration.proxy == proxy
    assert configuration.client_session_kwargs is not None
    # aiohttp no longer consults the environment (in a thread) on every request.
    assert configuration.client_session_kwargs["trust_env"] is False


def _reference_cut(cache: Cache, max_tasks: int) -> tuple[list[str], int]:
    """The cut as a full sort does it: every eligible pod in priority order, gang members
    always, plain pods while the session has fewer than max_tasks tasks."""
    entries = sorted(
        (e for e in cache.pods() if e.state.value == "pending" and e.task is not None),
        key=lambda e: (-e.task.priority, e.task.created, e.uid),  # type: ignore[union-attr]
    )
    taken: list[str] = []
    backlog = 0
    for e in entries:
        assert e.task is not None
        if not e.task.job and max_tasks and len(taken) >= max_tasks:
            backlog += 1
            continue
        taken.append(e.uid)
    return taken, backlog


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.booleans()), max_size=40),
    st.integers(0, 12),
)
def test_the_cut_selects_what_a_full_sort_would(
    pods: list[tuple[int, int, bool]], max_tasks: int
) -> None:
    cache = Cache()
    cache.apply_node("ADDED", inventory_node_body("n0", 8))
    cache.apply_pod_group(
        "ADDED",
        {
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"minMember": 1},
        },
    )
    for i, (priority, age, in_gang) in enumerate(pods):
        body = _pod(i, priority)
        body["metadata"]["creationTimestamp"] = f"2026-12-05T12:00:0{age}Z"
        if in_gang:
            body["metadata"]["labels"]["kallot.io/pod-group"] = "g"
        cache.apply_pod("ADDED", body)
    want, backlog = _reference_cut(cache, max_tasks)
    inp = cache.session_input(max_tasks=max_tasks)
    assert [t.id for t in inp.tasks] == want
    assert cache.backlog == backlog
