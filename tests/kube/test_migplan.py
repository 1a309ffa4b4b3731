"""The scheduler's half of the live MIG re-layout (``kube.schedule.migplan``), driven with Node objects as
the watch delivers them, the real cache's Snapshot, and an explicit clock (no sleeps): a plan
is written with the target layout, holds its pod, keeps the GPU from being planned again and its
doomed instances from other pods; it ends when the node publishes the layout, or is abandoned on
a refusal or a timeout, after which the GPU cools down.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kallot.config import mig_plan
from kallot.config.inventory import ANNOTATION, Device, MigDevice, NodeInventory
from kallot.config.mig_plan import MigPlan, MigPlanStatus
from kallot.core.decision import Decision, MigInstance, MigReconfiguration
from kallot.kube.ops.reporter import PodRef
from kallot.kube.schedule.migplan import REASON_DONE, REASON_DROPPED, REASON_PLANNED, MigPlanner
from kallot.kube.state.cache import Cache
from kallot.testing.controlplane import gpu_node_body

NODE = "n1"
GPU = "GPU-n1-0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingClient:
    """Records the node patches (the only write the planner makes)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    async def patch(self, path: str, body: Any) -> dict[str, Any]:
        self.patches.append((path, body))
        return {}


class RecordingReporter:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str, str, bool]] = []  # (pod or "", node, reason, warning)

    def note(
        self, ref: PodRef | None, node: str, reason: str, message: str, *, warning: bool
    ) -> None:
        self.notes.append((ref.name if ref else "", node, reason, warning))


def node(layout: list[tuple[str, int]], **ann: str) -> dict[str, Any]:
    body = gpu_node_body(NODE, 1)
    inv = NodeInventory(
        devices=(
            Device(
                index=0,
                uuid=GPU,
                model="H100-80GB",
                mem_mib=81559,
                mode="mig",
                mig=tuple(MigDevice(profile=p, start=s, uuid=f"MIG-{s}") for p, s in layout),
                mig_reconfigurable=True,
            ),
        )
    )
    body["metadata"]["annotations"] = {ANNOTATION: inv.to_json(), **ann}
    return body


SEVEN = [("1g.10gb", s) for s in range(7)]
TARGET = [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]


def decision(task: str) -> Decision:
    return Decision(
        reconfigurations=(
            MigReconfiguration(
                node=NODE,
                slot=0,
                uuid=GPU,
                destroy=tuple(MigInstance(profile="1g.10gb", start=s) for s in (4, 5, 6)),
                create=(MigInstance(profile="3g.40gb", start=4),),
                for_task=task,
            ),
        )
    )


def setup() -> tuple[MigPlanner, RecordingClient, RecordingReporter, Clock, Cache]:
    client, reporter, clock = RecordingClient(), RecordingReporter(), Clock()
    planner = MigPlanner(
        client,  # type: ignore[arg-type]
        reporter,  # type: ignore[arg-type]
        timeout_s=120,
        cooldown_s=60,
        clock=clock,
    )
    cache = Cache()
    for p in (planner.on_event, cache.apply_node):
        p("ADDED", node(SEVEN))
    return planner, client, reporter, clock, cache


async def test_plan_is_written_holds_the_pod_and_ends_when_the_layout_is_published() -> None:
    planner, client, reporter, clock, cache = setup()
    snap = cache.snapshot()
    assert snap.gpu_mig_dynamic is not None and snap.gpu_mig_dynamic[0, 0]  # the opt-in
    held = planner.carry_out(decision("uid-big"), {"uid-big": PodRef("ns", "big", "uid-big")})
    assert held == {"uid-big"}
    await asyncio.sleep(0)  # the patch task runs
    ((path, body),) = client.patches
    assert path == f"/api/v1/nodes/{NODE}"
    plan = MigPlan.from_json(body["metadata"]["annotations"][mig_plan.ANNOTATION])
    assert plan.generation == 1 and sorted(plan.gpus[0].instances()) == TARGET
    assert [(p.namespace, p.name) for p in plan.pods] == [("ns", "big")]
    assert ("big", "", REASON_PLANNED, False) in reporter.notes
    assert ("", NODE, REASON_PLANNED, False) in reporter.notes
    # In flight: the pod sits out, the GPU is not re-planned, the doomed instances are taken.
    assert planner.waiting() == {"uid-big"}
    adjusted = planner.adjust(cache.snapshot())
    assert adjusted.gpu_mig_dynamic is not None and not adjusted.gpu_mig_dynamic[0, 0]
    starts_used = {
        int(adjusted.mig.start[k]) for k in range(len(adjusted.mig.used)) if adjusted.mig.used[k]
    }
    assert starts_used == {4, 5, 6}
    # The node echoes the plan (no status yet), then publishes the layout: done.
    planner.on_event("MODIFIED", node(SEVEN, **{mig_plan.ANNOTATION: plan.to_json()}))
    assert planner.waiting() == {"uid-big"}
    planner.on_event("MODIFIED", node(TARGET, **{mig_plan.ANNOTATION: plan.to_json()}))
    assert planner.waiting() == frozenset()
    assert ("big", "", REASON_DONE, False) in reporter.notes
    assert planner.adjust(snap) is snap  # nothing in flight or cooling: the snapshot as is
    clock.now += 1000
    assert planner.dropped == 0


async def test_refusal_and_timeout_abandon_the_plan_and_the_gpu_cools_down() -> None:
    planner, client, reporter, clock, cache = setup()
    planner.carry_out(decision("a"), {"a": PodRef("ns", "a", "a")})
    await asyncio.sleep(0)
    plan = MigPlan.from_json(client.patches[-1][1]["metadata"]["annotations"][mig_plan.ANNOTATION])
    refused = MigPlanStatus(generation=plan.generation, state="Refused", message="busy")
    planner.on_event(
        "MODIFIED",
        node(
            SEVEN,
            **{mig_plan.ANNOTATION: plan.to_json(), mig_plan.STATUS_ANNOTATION: refused.to_json()},
        ),
    )
    assert planner.waiting() == frozenset()
    assert ("a", "", REASON_DROPPED, True) in reporter.notes
    cooling = planner.adjust(cache.snapshot())
    assert cooling.gpu_mig_dynamic is not None and not cooling.gpu_mig_dynamic[0, 0]
    clock.now += 61
    planner.waiting()
    warm = planner.adjust(cache.snapshot())
    assert warm.gpu_mig_dynamic is not None and warm.gpu_mig_dynamic[0, 0]

    # The next plan takes the next generation; no answer within the timeout abandons it.
    planner.carry_out(decision("b"), {"b": PodRef("ns", "b", "b")})
    await asyncio.sleep(0)
    second = MigPlan.from_json(
        client.patches[-1][1]["metadata"]["annotations"][mig_plan.ANNOTATION]
    )
    assert second.generation == plan.generation + 1
    clock.now += 119
    assert planner.waiting() == {"b"}
    clock.now += 1
    assert planner.waiting() == frozenset()
    assert ("b", "", REASON_DROPPED, True) in reporter.notes
    assert planner.dropped == 2


async def test_a_plan_on_the_node_no_status_answers_is_in_flight_for_a_new_scheduler() -> None:
    planner, _, _, _, cache = setup()
    left = MigPlan(
        generation=7,
        gpus=(
            mig_plan.PlanGpu(
                uuid=GPU,
                layout=tuple(mig_plan.PlanInstance(profile=p, start=s) for p, s in TARGET),
            ),
        ),
    )
    planner.on_event("MODIFIED", node(SEVEN, **{mig_plan.ANNOTATION: left.to_json()}))
    adjusted = planner.adjust(cache.snapshot())
    assert adjusted.gpu_mig_dynamic is not None and not adjusted.gpu_mig_dynamic[0, 0]
    assert {int(s) for s, u in zip(adjusted.mig.start, adjusted.mig.used, strict=True) if u} == {
        4,
        5,
        6,
    }
