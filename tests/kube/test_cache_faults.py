"""The cache (kube.state.cache) and the binder (kube.bind.binder) under API faults (hypothesis): watch
streams that replay, duplicate and reorder events, re-lists, and binds whose writes are
applied-but-failed (a lost response: 500 after the write), failed (503 before it) or refused
(409), in random order, with sessions of the real core in between.

The API's truth is a dict of pods with resourceVersions and an event log; the cache is fed
from that log the way a reflector would, except that the stream may go back (a watch resumed
from an older version), repeat an event or deliver two out of order. The binder is the real
one, its workers running on an event loop, talking to an in-memory API whose bind calls wait
until the test decides their outcome.

Invariants, after every step:
- truth: no device is held by bound pods beyond what it holds (compute, memory, an exclusive
  GPU by one pod, a MIG instance by one pod);
- the cache covers the truth: on every device it charges at least what the bound pods'
  records give it (a lagging cache may charge more, never less), MIG instances included;
- the cache's incremental usage equals a recount of its own charges (``check_invariants``);
and once every event is delivered and every bind settled, the cache charges exactly what a
cache rebuilt from the API objects alone charges.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.cli.scheduler import build_scheduler
from kallot.config.device_record import DeviceRecord
from kallot.core.resources import MILLI
from kallot.core.snapshot import Snapshot
from kallot.kube import translate
from kallot.kube.api.client import ApiError
from kallot.kube.bind.binder import Binder
from kallot.kube.state.cache import Cache
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")
KINDS = [
    {"nvidia.com/mig-3g.40gb": "1"},
    {"nvidia.com/mig-3g.40gb": "1"},
    {"nvidia.com/gpu": "1"},
    {"kallot.io/gpu-milli": "400", "kallot.io/gpu-memory": "30Gi"},
]
# n0: GPU 0 split into two 3g.40gb instances, GPU 1 whole; n1: one GPU.
NODES = [
    inventory_node_body("n0", 2, mig={0: [("3g.40gb", 0), ("3g.40gb", 4)]}),
    inventory_node_body("n1", 1),
]
OUTCOMES = ("ok", "applied_500", "failed_503", "conflict_409")


class MemoryApi:
    """The API server's truth for the binder: binds wait for the test to decide them."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.pending: list[tuple[str, str, Mapping[str, str], asyncio.Future[str]]] = []

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        del namespace, name
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append((uid, node, annotations, fut))
        outcome = await fut
        path = f"/pods/{uid}/binding"
        if outcome in ("ok", "applied_500"):
            refused = self.world.api_bind(uid, node, annotations)
            if refused:
                raise ApiError("POST", path, refused, "refused")
        if outcome in {"applied_500", "failed_503"}:
            raise ApiError("POST", path, 500 if outcome == "applied_500" else 503, "injected")
        if outcome == "conflict_409":
            raise ApiError("POST", path, 409, "injected conflict")

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        del namespace
        for pod in self.world.pods.values():
            if pod["metadata"]["name"] == name:
                return copy.deepcopy(pod)
        raise ApiError("GET", f"/pods/{name}", 404, "not found")


class World:
    """API truth (pods, resourceVersions, the event log) and the cache fed from it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.cache = Cache()
        self.api = MemoryApi(self)
        self.binder = Binder(self.api, self.cache, workers=8, verify_retry_s=0.0)  # type: ignore[arg-type]
        self.pods: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, dict[str, Any]]] = []  # (event type, object)
        self.delivered = 0  # how far the watch has delivered
        self.rv = 0
        self.n = 0
        for body in NODES:
            self.cache.apply_node("ADDED", copy.deepcopy(body))
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        self.binder.start()

    def close(self) -> None:
        self.loop.run_until_complete(self.binder.stop())
        self.loop.close()

    def _spin(self) -> None:
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    # -- the API -----------------------------------------------------------------------------

    def _emit(self, event: str, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((event, copy.deepcopy(pod)))

    def api_bind(self, uid: str, node: str, annotations: Mapping[str, str]) -> int:
        """Bind as the API server does; returns the refusal's status (0: bound)."""
        pod = self.pods.get(uid)
        if pod is None:
            return 404
        if pod["spec"].get("nodeName"):
            return 409
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"].update(annotations)
        self._emit("MODIFIED", pod)
        return 0

    def add_pod(self, kind: int) -> None:
        self.n += 1
        body = pod_body(f"p{self.n}", resources=KINDS[kind])
        body["metadata"].update(uid=f"u{self.n}", namespace="ns")
        c = body["spec"]["containers"][0]
        c["resources"]["requests"] = dict(c["resources"]["limits"])
        self.pods[f"u{self.n}"] = body
        self._emit("ADDED", body)

    def delete_pod(self, index: int) -> None:
        if self.pods:
            uid = sorted(self.pods)[index % len(self.pods)]
            self._emit("DELETED", self.pods.pop(uid))

    # -- the watch ---------------------------------------------------------------------------

    def _deliver(self, i: int) -> None:
        event, obj = self.log[i]
        self.cache.apply_pod(event, copy.deepcopy(obj))

    def deliver(self, k: int) -> None:
        for _ in range(k + 1):
            if self.delivered >= len(self.log):
                return
            self._deliver(self.delivered)
            self.delivered += 1

    def replay(self, k: int) -> None:
        """The watch resumes from an older version: the last ``k + 1`` events come again."""
        end = self.delivered
        self.delivered = max(0, self.delivered - k - 1)
        self.deliver(end - self.delivered)

    def duplicate(self, _: int) -> None:
        if self.delivered:
            self._deliver(self.delivered - 1)

    def reorder(self, _: int) -> None:
        """The next two events arrive swapped."""
        if self.delivered + 2 <= len(self.log):
            self._deliver(self.delivered + 1)
            self._deliver(self.delivered)
            self.delivered += 2

    def relist(self, _: int) -> None:
        """410 Gone: a fresh list; the watch continues after it."""
        self.cache.replace_pods([copy.deepcopy(p) for p in self.pods.values()])
        self.delivered = len(self.log)

    # -- the scheduler -----------------------------------------------------------------------

    def session(self, _: int) -> None:
        inp = self.cache.session_input()
        if not inp.tasks:
            return
        decision = CORE.run_session(
            inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
        )
        for p in decision.placements:
            entry = self.cache.assume(p)
            if entry is not None:
                self.binder.submit(p, entry.namespace, entry.name)
        self._spin()

    def finish_bind(self, index: int, outcome: str) -> None:
        self._spin()
        if not self.api.pending:
            return
        *_, fut = self.api.pending.pop(index % len(self.api.pending))
        fut.set_result(outcome)
        self._spin()

    def settle(self) -> None:
        """Faults stop: every bind answers, the watch delivers everything."""
        self._spin()
        while self.api.pending:
            self.finish_bind(0, "ok")
        self.deliver(len(self.log))
        self._spin()

    # -- checks ------------------------------------------------------------------------------

    def truth_usage(self, snap: Snapshot) -> tuple[np.ndarray[Any, Any], ...]:
        """Per-device usage from the bound pods' records, laid out like ``snap``; fails on
        any device held beyond what it holds."""
        milli = np.zeros_like(snap.gpu_used_milli)
        mem = np.zeros_like(snap.gpu_used_mem)
        mig = np.zeros(snap.mig.node.size, np.int64)
        holders: dict[tuple[str, str], list[str]] = {}
        exclusive: set[tuple[str, str]] = set()
        rows = {n: i for i, n in enumerate(snap.node_names)}
        for pod in self.pods.values():
            node = pod["spec"].get("nodeName")
            text = pod["metadata"]["annotations"].get(translate.ANN_DEVICES)
            if not node:
                continue
            assert text, f"{pod['metadata']['name']} bound without a device record"
            record = DeviceRecord.from_json(text)
            row = rows[node]
            for d in record.devices:
                slot = list(snap.gpu_uuid[row]).index(d.uuid)
                milli[row, slot] += d.milli
                mem[row, slot] += d.mem_mib
                holders.setdefault((node, d.uuid), []).append(pod["metadata"]["name"])
                if d.mode == "exclusive":
                    exclusive.add((node, d.uuid))
                if d.mig is not None:
                    code = snap.mig.profiles.index(d.mig.profile)
                    (idx,) = np.flatnonzero(
                        (snap.mig.node == row)
                        & (snap.mig.slot == slot)
                        & (snap.mig.profile == code)
                        & (snap.mig.start == d.mig.start)
                    )
                    mig[idx] += 1
        assert (milli <= MILLI).all(), f"compute over-committed: {milli.tolist()}"
        assert (mem <= snap.gpu_cap_mem).all(), f"memory over-committed: {mem.tolist()}"
        for g in exclusive:
            assert len(holders[g]) == 1, f"exclusive GPU {g} held by {holders[g]}"
        assert (mig <= 1).all(), f"a MIG instance held by two bound pods: {mig.tolist()}"
        return milli, mem, mig

    def check(self) -> None:
        self.cache.check_invariants()
        snap = self.cache.snapshot()
        milli, mem, mig = self.truth_usage(snap)
        assert (snap.gpu_used_milli >= milli).all(), "the cache charges less than the records"
        assert (snap.gpu_used_mem >= mem).all(), "the cache charges less memory than the records"
        assert (snap.mig.used >= (mig > 0)).all(), (
            f"the cache has a MIG instance free that a bound pod holds: "
            f"cache {snap.mig.used.tolist()} records {mig.tolist()}"
        )

    def check_settled(self) -> None:
        self.check()
        fresh = Cache()
        for body in NODES:
            fresh.apply_node("ADDED", copy.deepcopy(body))
        fresh.replace_pods([copy.deepcopy(p) for p in self.pods.values()])
        want, got = fresh.snapshot(), self.cache.snapshot()
        assert (got.gpu_used_milli == want.gpu_used_milli).all()
        assert (got.gpu_used_mem == want.gpu_used_mem).all()
        assert (got.gpu_clients == want.gpu_clients).all()
        assert (got.mig.used == want.mig.used).all()
        assert (got.node_cpu_used == want.node_cpu_used).all()


# Weighted: the scheduler runs a session after every step anyway; binds and watch deliveries
# are the common steps, faults the rarer ones.
OP_NAMES = [
    *["add_pod"] * 3,
    *["delete_pod"] * 2,
    *["ok"] * 3,
    "applied_500",
    "failed_503",
    "conflict_409",
    *["deliver"] * 3,
    "replay",
    "duplicate",
    "reorder",
    "relist",
]
OPS = st.tuples(st.sampled_from(OP_NAMES), st.integers(0, 12))


def run_ops(ops: list[tuple[str, int]]) -> None:
    w = World()
    try:
        for op, arg in ops:
            if op in OUTCOMES:
                w.finish_bind(arg, op)
            else:
                getattr(w, op)(arg % len(KINDS) if op == "add_pod" else arg)
            w.check()
            w.session(0)
            w.check()
        w.settle()
        w.check_settled()
    finally:
        w.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=20, max_size=60))
def test_faults_never_double_assign_a_device(ops: list[tuple[str, int]]) -> None:
    run_ops(ops)


def test_a_replayed_delete_does_not_free_a_mig_instance_another_pod_holds() -> None:
    # The trace of issue 27: A and B get the two MIG instances; A is deleted and C takes its
    # instance; then a watch resumed from an older version replays "A added", "A bound" and
    # "A deleted".
    run_ops(
        [
            ("add_pod", 0),  # A
            ("add_pod", 0),  # B
            ("deliver", 1),  # the session places A and B
            ("ok", 0),
            ("ok", 0),
            ("deliver", 1),
            ("delete_pod", 0),  # A
            ("deliver", 0),
            ("add_pod", 0),  # C
            ("deliver", 0),  # the session places C on A's instance
            ("ok", 0),
            ("deliver", 0),
            ("replay", 7),  # everything again
        ]
    )


def test_a_placement_whose_instance_was_taken_during_the_session_is_not_assumed() -> None:
    # A session decides on a snapshot; before its placement is assumed, a read shows another
    # pod bound (by a previous leader) to the same MIG instance. The placement is dropped and
    # the pod decided again, rather than charged on top.
    w = World()
    try:
        w.add_pod(0)
        w.deliver(0)
        inp = w.cache.session_input()
        decision = CORE.run_session(
            inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
        )
        (placement,) = decision.placements
        w.add_pod(0)
        other = w.pods[f"u{w.n}"]
        record = translate.record_annotations(DeviceRecord.of(placement), 0)
        assert w.api_bind(f"u{w.n}", placement.node, record) == 0
        w.cache.apply_pod("MODIFIED", copy.deepcopy(other))
        assert w.cache.assume(placement) is None
        w.session(0)  # decided again: the other instance
        w.settle()
        w.check_settled()
    finally:
        w.close()
