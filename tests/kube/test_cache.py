"""The scheduler's cache (kube.state.cache) under random event sequences (hypothesis): whatever order
sessions, binds, failed binds, deletions, node changes and re-lists come in, no GPU is ever
charged beyond what it holds, the incremental usage equals a recount from the pods, and a cache
rebuilt from the API objects alone (a restarted scheduler) charges exactly what the bound pods'
device records say.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.cli.scheduler import build_scheduler
from kallot.config import device_record
from kallot.kube import translate
from kallot.kube.state.cache import Cache, PodState
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")
KINDS = [
    {"nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2"},
    {"kallot.io/gpu-milli": "300", "kallot.io/gpu-memory": "20Gi"},
    {"kallot.io/gpu-milli": "700", "kallot.io/gpu-memory": "40Gi"},
]


class World:
    """The API's truth (dicts) next to the cache fed from it, as the reflectors would."""

    def __init__(self) -> None:
        self.cache = Cache()
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.binds: list[tuple[str, str, str]] = []  # (uid, node, record json) in flight
        self.rv = 0
        self.n = 0

    def _touch(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def add_node(self, i: int) -> None:
        name = f"n{i}"
        if name not in self.nodes:
            self.nodes[name] = inventory_node_body(name, 4)
            self.cache.apply_node("ADDED", self._touch(self.nodes[name]))

    def delete_node(self, i: int) -> None:
        body = self.nodes.pop(f"n{i}", None)
        if body is not None:
            self.cache.apply_node("DELETED", body)

    def add_pod(self, kind: int) -> None:
        self.n += 1
        body = pod_body(f"p{self.n}", resources=KINDS[kind])
        body["metadata"].update(uid=f"u{self.n}", namespace="ns")
        body["spec"]["containers"][0]["resources"]["requests"] = dict(
            body["spec"]["containers"][0]["resources"]["limits"]
        )
        self.pods[f"u{self.n}"] = body
        self.cache.apply_pod("ADDED", self._touch(body))

    def session(self) -> None:
        inp = self.cache.session_input()
        if not inp.tasks:
            return
        decision = CORE.run_session(
            inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
        )
        for p in decision.placements:
            if self.cache.assume(p) is not None:
                record = translate.record_annotations(device_record.DeviceRecord.of(p), 0)
                self.binds.append((p.task_id, p.node, record[translate.ANN_DEVICES]))

    def finish_bind(self, index: int, succeed: bool) -> None:
        if not self.binds:
            return
        uid, node, record = self.binds.pop(index % len(self.binds))
        pod = self.pods.get(uid)
        if succeed and pod is not None and node in self.nodes and not pod["spec"].get("nodeName"):
            pod["spec"]["nodeName"] = node
            pod["metadata"]["annotations"][translate.ANN_DEVICES] = record
            self.cache.apply_pod("MODIFIED", self._touch(pod))
        else:
            self.cache.forget(uid, reason="bind failed")

    def delete_pod(self, index: int) -> None:
        if self.pods:
            uid = sorted(self.pods)[index % len(self.pods)]
            self.cache.apply_pod("DELETED", self.pods.pop(uid))

    def relist(self) -> None:
        self.cache.replace_nodes([copy.deepcopy(n) for n in self.nodes.values()])
        self.cache.replace_pods([copy.deepcopy(p) for p in self.pods.values()])

    def check(self) -> None:
        snap = self.cache.snapshot()
        self.cache.check_invariants()
        assert (snap.gpu_used_milli <= snap.gpu_cap_milli).all()
        assert (snap.gpu_used_mem <= snap.gpu_cap_mem).all()
        # A restarted scheduler knows only the API objects: it must charge exactly what the
        # bound pods' records say, i.e. what the live cache charges minus binds in flight.
        fresh = Cache()
        fresh.replace_nodes([copy.deepcopy(n) for n in self.nodes.values()])
        fresh.replace_pods([copy.deepcopy(p) for p in self.pods.values()])
        rebuilt = fresh.snapshot()
        in_flight = {uid for uid, _, _ in self.binds}
        expected = snap.gpu_used_milli.copy()
        for e in self.cache.pods():
            if e.state is PodState.ASSUMED and e.uid in in_flight and e.charge is not None:
                for slot, milli, _ in e.charge.gpus:
                    expected[e.charge.row, slot] -= milli
        assert rebuilt.node_names == snap.node_names
        assert (rebuilt.gpu_used_milli == expected).all()


OPS = st.one_of(
    st.tuples(st.just("add_node"), st.integers(0, 3)),
    st.tuples(st.just("delete_node"), st.integers(0, 3)),
    st.tuples(st.just("add_pod"), st.integers(0, len(KINDS) - 1)),
    st.tuples(st.just("session"), st.just(0)),
    st.tuples(st.just("bind_ok"), st.integers(0, 50)),
    st.tuples(st.just("bind_fail"), st.integers(0, 50)),
    st.tuples(st.just("delete_pod"), st.integers(0, 50)),
    st.tuples(st.just("relist"), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=5, max_size=40))
def test_random_event_orders_never_overcommit(ops: list[tuple[str, int]]) -> None:
    w = World()
    w.add_node(0)
    w.add_node(1)
    for op, arg in ops:
        if op == "bind_ok":
            w.finish_bind(arg, succeed=True)
        elif op == "bind_fail":
            w.finish_bind(arg, succeed=False)
        elif op in ("session", "relist"):
            getattr(w, op)()
        else:
            getattr(w, op)(arg)
        w.check()


def test_a_forgotten_bind_frees_its_gpus_for_the_next_session() -> None:
    w = World()
    w.add_node(0)  # 4 GPUs
    for _ in range(4):
        w.add_pod(1)  # 2 GPUs each: two fit
    w.session()
    assert len(w.binds) == 2
    w.finish_bind(0, succeed=False)
    w.cache.tuning = type(w.cache.tuning)(backoff_initial=0.0, retry_interval=0.0)
    for e in w.cache.pods():
        e.backoff_until = 0.0
        e.parked_generation = -1
    w.session()  # the freed 2 GPUs go to a waiting pod
    assert len(w.binds) == 2
    w.check()


def test_an_annotation_added_to_a_running_pod_reaches_preemption() -> None:
    # karpenter.sh/do-not-disrupt set after the bind (the disruption guard does this while a
    # model server loads): the running allocation the core's preemption reads must carry it.
    w = World()
    w.add_node(0)
    w.add_pod(0)
    w.session()
    w.finish_bind(0, succeed=True)
    (alloc,) = w.cache.snapshot().running
    assert not alloc.task.do_not_disrupt
    pod = w.pods[alloc.task.id]
    pod["metadata"]["annotations"][translate.ANN_KARPENTER_DO_NOT_DISRUPT] = "true"
    w.cache.apply_pod("MODIFIED", w._touch(pod))
    (alloc,) = w.cache.snapshot().running
    assert alloc.task.do_not_disrupt
    w.check()


def test_a_pod_that_trips_a_bug_waits_with_its_reason_and_the_rest_go_on(
    monkeypatch: Any,
) -> None:
    # A bug in reading one unusual pod (anything but the ConfigError of a bad request) must not
    # escape into the watch: that pod gets an error (an Event, pending), the others schedule.
    real = translate.pod_to_task

    def buggy(pod: dict[str, Any]) -> Any:
        if pod["metadata"]["name"] == "p1":
            raise RuntimeError("boom")
        return real(pod)

    monkeypatch.setattr(translate, "pod_to_task", buggy)
    w = World()
    w.add_node(0)
    w.add_pod(0)
    w.add_pod(0)
    bad = w.cache.pod("u1")
    assert bad is not None and bad.task is None
    assert "RuntimeError: boom" in str(bad.error) and "\n" not in str(bad.error)
    assert [t.id for t in w.cache.session_input().tasks] == ["u2"]
