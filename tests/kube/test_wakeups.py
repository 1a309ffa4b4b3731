"""No lost wake-ups in the live cache (issue 16), as a hypothesis state machine.

Events come in any order: pods created and deleted, PodGroups and their members in either order,
nodes added, removed and relabelled, and sessions that run *while* events arrive (a session
takes its input, events land, then its decision is applied: placements assumed and bound, the
rest parked with the generation the session's snapshot saw, as ``Controller.schedule_once``
does). After quiescence (sessions every ``retry_interval`` until none has work, never waiting
for the flush interval), no pending pod, and no pending gang, that fits the free capacity is
left parked. The oracle is brute force over the API objects (the bound pods' device records),
sharing no code with the cache or the core.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kallot.cli.scheduler import build_scheduler
from kallot.config import device_record
from kallot.core.decision import Decision
from kallot.kube import translate
from kallot.kube.state.cache import Cache, CacheTuning, PodState, SessionInput
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")
GPUS = 4
H100_MEM = 81559
# (resources, whole GPUs or 0, share milli, share MiB)
KINDS: list[tuple[dict[str, str], int, int, int]] = [
    ({"nvidia.com/gpu": "1"}, 1, 0, 0),
    ({"nvidia.com/gpu": "2"}, 2, 0, 0),
    ({"nvidia.com/gpu": "4"}, 4, 0, 0),
    ({"kallot.io/gpu-milli": "300", "kallot.io/gpu-memory": "20Gi"}, 0, 300, 20 * 1024),
    ({"kallot.io/gpu-milli": "700", "kallot.io/gpu-memory": "40Gi"}, 0, 700, 40 * 1024),
]


# Events that may land while a session runs (method name, argument).
EVENTS = st.one_of(
    st.tuples(st.just("delete_pod"), st.integers(0, 50)),
    st.tuples(st.just("create_pod"), st.integers(0, len(KINDS) - 1)),
    st.tuples(st.just("add_node"), st.integers(0, 2)),
    st.tuples(st.just("delete_node"), st.integers(0, 2)),
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Wakeups(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.tuning = CacheTuning()
        self.cache = Cache(clock=self.clock, tuning=self.tuning)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.kind: dict[str, int] = {}  # uid -> KINDS index
        self.groups: dict[str, int] = {}  # PodGroup name -> minAvailable
        self.rv = 0
        self.n = 0
        self.in_flight: tuple[SessionInput, Decision] | None = None
        for i in range(2):
            self.add_node(i)
        # Both nodes full from the start: contention (and so parking) comes within a few steps.
        self._pod(2)
        self._pod(2)
        self.start_session()
        self.finish_session()

    # -- the API's truth, fed to the cache as the reflectors would -----------------------------

    def _touch(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    @rule(i=st.integers(0, 2))
    def add_node(self, i: int) -> None:
        name = f"n{i}"
        if name not in self.nodes:
            self.nodes[name] = inventory_node_body(name, GPUS)
            self.cache.apply_node("ADDED", self._touch(self.nodes[name]))

    @rule(i=st.integers(0, 2))
    def delete_node(self, i: int) -> None:
        body = self.nodes.pop(f"n{i}", None)
        if body is not None:
            self.cache.apply_node("DELETED", body)

    @rule(i=st.integers(0, 2), value=st.sampled_from(["a", "b"]))
    def relabel_node(self, i: int, value: str) -> None:
        body = self.nodes.get(f"n{i}")
        if body is not None:
            body["metadata"]["labels"]["kallot.io/rack"] = value
            self.cache.apply_node("MODIFIED", self._touch(body))

    def _pod(self, kind: int, group: str = "") -> None:
        self.n += 1
        uid = f"u{self.n}"
        labels = {translate.LABEL_POD_GROUP: group} if group else {}
        body = pod_body(f"p{self.n}", resources=KINDS[kind][0], labels=labels)
        body["metadata"].update(uid=uid, namespace="ns")
        res = body["spec"]["containers"][0]["resources"]
        res["requests"] = dict(res["limits"])
        self.pods[uid] = body
        self.kind[uid] = kind
        self.cache.apply_pod("ADDED", self._touch(body))

    @rule(kind=st.integers(0, len(KINDS) - 1))
    def create_pod(self, kind: int) -> None:
        self._pod(kind)

    @rule(g=st.sampled_from(["g0", "g1"]), min_available=st.integers(2, 3))
    def create_group(self, g: str, min_available: int) -> None:
        if g in self.groups:
            return
        self.groups[g] = min_available
        body = {
            "apiVersion": "kallot.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": g, "namespace": "ns"},
            "spec": {"minAvailable": min_available},
        }
        self.cache.apply_pod_group("ADDED", self._touch(body))

    @rule(g=st.sampled_from(["g0", "g1"]), kind=st.integers(0, 1))
    def create_member(self, g: str, kind: int = 0) -> None:
        self._pod(kind, group=g)

    @rule(index=st.integers(0, 50))
    def delete_pod(self, index: int) -> None:
        if self.pods:
            uid = sorted(self.pods)[index % len(self.pods)]
            self.cache.apply_pod("DELETED", self.pods.pop(uid))

    @rule(dt=st.sampled_from([0.01, 0.3]))
    def tick(self, dt: float) -> None:
        self.clock.t += dt

    # -- sessions: input now, decision applied later (events may land in between) -----------

    @precondition(lambda self: self.in_flight is None)
    @rule()
    def start_session(self) -> None:
        inp = self.cache.session_input()
        decision = CORE.run_session(
            inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
        )
        self.in_flight = (inp, decision)

    @precondition(lambda self: self.in_flight is None)
    @rule(events=st.lists(EVENTS, min_size=1, max_size=3))
    def session_during(self, events: list[tuple[str, int]]) -> None:
        """A session whose input is taken before ``events`` land and applied after them."""
        self.start_session()
        for name, arg in events:
            getattr(self, name)(arg)
        self.finish_session()

    @precondition(lambda self: self.in_flight is not None)
    @rule()
    def finish_session(self) -> None:
        assert self.in_flight is not None
        inp, decision = self.in_flight
        self.in_flight = None
        self._apply(inp, decision)

    def _apply(self, inp: SessionInput, decision: Decision) -> None:
        # What Controller.schedule_once does with a decision, with binds that succeed at once.
        for uid, diagnosis in inp.waiting.items():
            self.cache.park(uid, diagnosis, generation=inp.capacity_generation)
        for p in decision.placements:
            if self.cache.assume(p) is None:
                continue
            pod = self.pods[p.task_id]
            record = translate.record_annotations(device_record.DeviceRecord.of(p), 0)
            pod["spec"]["nodeName"] = p.node
            pod["metadata"]["annotations"][translate.ANN_DEVICES] = record[translate.ANN_DEVICES]
            self.cache.apply_pod("MODIFIED", self._touch(pod))
        for u in decision.unschedulable:
            self.cache.park(u.task_id, u.diagnosis, generation=inp.capacity_generation)

    # -- quiescence and the oracle ---------------------------------------------------------------

    @rule()
    def quiesce_and_check(self) -> None:
        if self.in_flight is not None:
            self.finish_session()
        for _ in range(30):
            self.clock.t += self.tuning.retry_interval
            inp = self.cache.session_input()
            if not inp.tasks and not inp.waiting:
                break
            decision = CORE.run_session(
                inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
            )
            self._apply(inp, decision)
        else:
            raise AssertionError("sessions never quiesced")
        assert self.clock.t - 1000.0 < self.tuning.flush_interval * 100  # sanity
        free = self._free()
        for uid, body in self.pods.items():
            if body["spec"].get("nodeName") or body["metadata"]["labels"]:
                continue
            entry = self.cache.pod(uid)
            assert entry is not None and entry.state is PodState.PENDING
            assert not _fits_one(free, self.kind[uid]), (
                f"pod {uid} ({KINDS[self.kind[uid]][0]}) fits the free capacity but is parked: "
                f"{entry.reason}"
            )
        for g, min_available in self.groups.items():
            members = [
                u
                for u, b in self.pods.items()
                if b["metadata"]["labels"].get(translate.LABEL_POD_GROUP) == g
            ]
            bound = sum(1 for u in members if self.pods[u]["spec"].get("nodeName"))
            pending = [self.kind[u] for u in members if not self.pods[u]["spec"].get("nodeName")]
            need = max(1, min_available - bound) if bound else min_available
            if not pending or len(pending) < need:
                continue
            assert not _gang_fits(free, pending, need), (
                f"gang {g} (min {min_available}, {bound} bound, pending {pending}) fits the free "
                "capacity but is parked"
            )

    def _free(self) -> dict[str, list[tuple[int, int, bool]]]:
        """Per node, per GPU: (milli free, MiB free, idle) from the bound pods' records."""
        used: dict[tuple[str, str], tuple[int, int]] = {}
        for body in self.pods.values():
            node = body["spec"].get("nodeName")
            text = body["metadata"]["annotations"].get(translate.ANN_DEVICES)
            if not node or not text:
                continue
            record = device_record.DeviceRecord.from_json(text)
            for d in record.devices:
                m, b = used.get((node, d.uuid), (0, 0))
                used[(node, d.uuid)] = (m + d.milli, b + d.mem_mib)
        out: dict[str, list[tuple[int, int, bool]]] = {}
        for name in self.nodes:
            gpus = []
            for i in range(GPUS):
                m, b = used.get((name, f"GPU-{name}-{i}"), (0, 0))
                gpus.append((1000 - m, H100_MEM - b, (name, f"GPU-{name}-{i}") not in used))
            out[name] = gpus
        return out

    @invariant()
    def cache_is_consistent(self) -> None:
        self.cache.check_invariants()

    def teardown(self) -> None:
        self.quiesce_and_check()


def _fits_one(free: dict[str, list[tuple[int, int, bool]]], kind: int) -> bool:
    _, whole, milli, mib = KINDS[kind]
    for gpus in free.values():
        if whole and sum(1 for _, _, idle in gpus if idle) >= whole:
            return True
        if not whole and any(m >= milli and b >= mib for m, b, _ in gpus):
            return True
    return False


def _gang_fits(free: dict[str, list[tuple[int, int, bool]]], kinds: list[int], need: int) -> bool:
    """Some ``need`` of the members (whole GPUs) fit the idle GPUs together: brute force."""
    idle = [sum(1 for _, _, i in gpus if i) for gpus in free.values()]
    for subset in itertools.combinations(kinds, need):
        for nodes in itertools.product(range(len(idle)), repeat=need):
            left = list(idle)
            ok = True
            for k, n in zip(subset, nodes, strict=True):
                left[n] -= KINDS[k][1]
                ok &= left[n] >= 0
            if ok:
                return True
    return False


Wakeups.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_no_lost_wakeups = Wakeups.TestCase


# -- the two faults of issue 16, step by step ----------------------------------------------------


def test_capacity_freed_while_a_session_runs_wakes_what_it_parks() -> None:
    m = Wakeups()  # both nodes full
    m.create_pod(0)
    m.start_session()  # finds no GPU for it
    m.delete_pod(0)  # a 4-GPU pod goes while the session runs
    m.finish_session()  # parks the 1-GPU pod with the snapshot's generation
    m.quiesce_and_check()
    assert sum(1 for b in m.pods.values() if b["spec"].get("nodeName")) == 2


def test_gang_members_arriving_one_by_one_after_their_podgroup_start_together() -> None:
    m = Wakeups()
    m.delete_pod(0)  # 4 GPUs free
    m.create_group("g0", 3)
    for _ in range(3):
        m.create_member("g0")
        m.start_session()  # each member arrives, a session sees the gang incomplete
        m.finish_session()
    bound = [b for b in m.pods.values() if b["metadata"]["labels"] and b["spec"].get("nodeName")]
    assert len(bound) == 3  # the last member brought the parked two along
