"""Live MIG re-layout, the scheduler's half (issue 21): plan, write, wait, then bind.

Where it sits: between the session and the binder (``kube.schedule.loop``); its ``adjust`` is
the pipeline's MIG stage (``kube.state.pipeline.MigStage``). A node agent started
with ``--mig-reconfigure`` publishes its MIG GPUs as ``migReconfigurable`` in the inventory, so
the core may plan a layout change of such a GPU (``MigFit``: idle instances only, the cheapest
change, ``core.mig.reconfigure``) for a MIG pod no existing instance serves. Such a placement
is not bound. Instead (``carry_out``):

1. the GPU's target layout (``core.mig.changed_layout`` of the layout the node published) is
   written on the Node as ``kallot.io/mig-plan`` (``config.mig_plan``, the generation one above
   the last seen on the node), with the waiting pods; Events ``MigReconfigurationPlanned`` on
   the pod and the Node;
2. the pod sits out the sessions (``waiting``) while the plan is in flight, and the GPU is
   neither planned again nor given out on the instances the plan destroys (``adjust``);
3. the node agent (``node.migapply``) applies the layout, re-advertises through the device
   plugin and publishes the inventory; when the inventory the node publishes shows the target
   layout (``observe``: the nodes reflector's events), the plan is done and the pod takes part
   in the next session, which places it on the new idle instance like any other: so it is
   never bound against a layout the node has not advertised;
4. a ``Refused`` or ``Failed`` status from the agent (``kallot.io/mig-plan-status``), or no
   answer within ``timeout_s``, drops the plan: a Warning Event on the pod, and the GPU is not
   planned again for ``cooldown_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kallot.config import inventory, mig_plan
from kallot.config.mig_plan import MigPlan, MigPlanStatus, PlanGpu, PlanInstance, PlanPod
from kallot.core import mig
from kallot.core.decision import Decision
from kallot.core.errors import ConfigError
from kallot.core.snapshot import Snapshot
from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.ops.reporter import PodRef, Reporter

logger = logging.getLogger(__name__)

REASON_PLANNED = "MigReconfigurationPlanned"
REASON_DONE = "MigReconfigurationAdvertised"
REASON_DROPPED = "MigReconfigurationAbandoned"


@dataclass(slots=True)
class _GpuPlan:
    node: str
    uuid: str
    target: tuple[mig.Instance, ...]
    destroy: frozenset[mig.Instance]  # instances of the planned-on layout that go
    pods: dict[str, PodRef]  # uid -> the pods waiting for it
    generation: int = 0
    deadline: float = 0.0


@dataclass(slots=True)
class _NodeView:
    """What the planner reads from one Node object."""

    layouts: dict[str, frozenset[mig.Instance]] = field(default_factory=dict)  # GPU uuid ->
    plan: MigPlan | None = None
    status: MigPlanStatus | None = None

    @property
    def generation(self) -> int:
        return max(
            self.plan.generation if self.plan else 0, self.status.generation if self.status else 0
        )


def _view(obj: Mapping[str, Any]) -> _NodeView:
    ann: Mapping[str, str] = (obj.get("metadata") or {}).get("annotations") or {}
    out = _NodeView()
    text = ann.get(inventory.ANNOTATION)
    if text:
        try:
            inv = inventory.NodeInventory.from_json(text)
            out.layouts = {
                d.uuid: frozenset((m.profile, m.start) for m in d.mig) for d in inv.devices
            }
        except ConfigError:
            pass  # the cache reports a bad inventory
    try:
        if ann.get(mig_plan.ANNOTATION):
            out.plan = MigPlan.from_json(ann[mig_plan.ANNOTATION])
        if ann.get(mig_plan.STATUS_ANNOTATION):
            out.status = MigPlanStatus.from_json(ann[mig_plan.STATUS_ANNOTATION])
    except ConfigError as exc:
        logger.warning("unreadable MIG plan annotations on a node: %s", exc)
    return out


class MigPlanner:
    """Plans in flight, per (node, GPU uuid). Runs on the event loop."""

    def __init__(
        self,
        client: KubeClient,
        reporter: Reporter,
        *,
        timeout_s: float = 120.0,
        cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        on_outcome: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.client = client
        self.on_outcome = on_outcome  # planned / advertised / abandoned (a metric)
        self.reporter = reporter
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._nodes: dict[str, _NodeView] = {}
        self._texts: dict[str, tuple[str, ...]] = {}  # node -> the annotations last parsed
        self._plans: dict[tuple[str, str], _GpuPlan] = {}
        self._cooling: dict[tuple[str, str], float] = {}  # (node, uuid) -> until
        self._writes: set[asyncio.Task[None]] = set()
        self.planned = 0
        self.done = 0
        self.dropped = 0

    # -- the nodes reflector -------------------------------------------------------------------

    def on_event(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self._nodes.pop(name, None)
            self._texts.pop(name, None)
            for key in [k for k in self._plans if k[0] == name]:
                self._drop(key, f"node {name} was deleted")
            return
        ann: Mapping[str, str] = (obj.get("metadata") or {}).get("annotations") or {}
        texts = tuple(
            ann.get(k, "")
            for k in (inventory.ANNOTATION, mig_plan.ANNOTATION, mig_plan.STATUS_ANNOTATION)
        )
        if name in self._nodes and self._texts.get(name) == texts:
            return  # heartbeats: nothing the planner reads changed (no JSON parsed again)
        self._texts[name] = texts
        self._nodes[name] = _view(obj)
        self._settle(name)

    def on_replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in items:
            seen.add(str((obj.get("metadata") or {}).get("name", "")))
            self.on_event("ADDED", obj)
        for name in [n for n in self._nodes if n not in seen]:
            self.on_event("DELETED", {"metadata": {"name": name}})

    def _settle(self, node: str) -> None:
        view = self._nodes[node]
        if (
            view.plan is not None
            and view.generation == view.plan.generation
            and (view.status is None or view.status.generation < view.plan.generation)
        ):
            # A plan on the node that no status answers yet, perhaps from a previous scheduler:
            # in flight, so nothing else is planned on its GPUs until it is answered.
            for g in view.plan.gpus:
                key = (node, g.uuid)
                if key not in self._plans and view.layouts.get(g.uuid) != frozenset(g.instances()):
                    self._plans[key] = _GpuPlan(
                        node,
                        g.uuid,
                        g.instances(),
                        frozenset(view.layouts.get(g.uuid, frozenset()) - set(g.instances())),
                        {},
                        view.plan.generation,
                        self._clock() + self.timeout_s,
                    )
        for key, plan in list(self._plans.items()):
            if key[0] != node or not plan.generation:
                continue  # another node, or its write has not gone out yet
            if view.layouts.get(plan.uuid) == frozenset(plan.target):
                self._finish(key)
            elif (
                view.status is not None
                and view.status.generation >= plan.generation
                and view.status.state != "Applied"
            ):
                self._drop(
                    key, f"the node agent answered {view.status.state}: {view.status.message}"
                )

    def _finish(self, key: tuple[str, str]) -> None:
        plan = self._plans.pop(key)
        self.done += 1
        self.on_outcome("advertised")
        text = (
            f"MIG layout of GPU {plan.uuid} on {plan.node} is advertised "
            f"({_fmt(plan.target)}); the pod is placed in the next session"
        )
        logger.info("mig plan done node=%s gpu=%s generation=%d", *key, plan.generation)
        for ref in plan.pods.values():
            self.reporter.note(ref, "", REASON_DONE, text, warning=False)

    def _drop(self, key: tuple[str, str], why: str) -> None:
        plan = self._plans.pop(key, None)
        if plan is None:
            return
        self.dropped += 1
        self.on_outcome("abandoned")
        self._cooling[key] = self._clock() + self.cooldown_s
        text = (
            f"MIG re-layout of GPU {plan.uuid} on {plan.node} abandoned ({why}); "
            f"the GPU is not re-planned for {self.cooldown_s:.0f} s"
        )
        logger.warning("mig plan dropped node=%s gpu=%s why=%s", *key, why)
        self.reporter.note(None, plan.node, REASON_DROPPED, text, warning=True)
        for ref in plan.pods.values():
            self.reporter.note(ref, "", REASON_DROPPED, text, warning=True)

    # -- the session ---------------------------------------------------------------------------

    def waiting(self) -> frozenset[str]:
        """Pods that sit out this session: their plan is in flight (expired plans dropped)."""
        now = self._clock()
        for key, plan in list(self._plans.items()):
            if plan.deadline and now >= plan.deadline:
                self._drop(key, f"no answer from the node agent within {self.timeout_s:.0f} s")
        for key in [k for k, until in self._cooling.items() if now >= until]:
            del self._cooling[key]
        return frozenset(uid for p in self._plans.values() for uid in p.pods)

    def adjust(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with GPUs that have a plan in flight (or just failed one) not
        reconfigurable, and the instances a plan in flight destroys given to nobody."""
        dynamic = snapshot.gpu_mig_dynamic
        if dynamic is None or not (self._plans or self._cooling):
            return snapshot
        rows = {n: i for i, n in enumerate(snapshot.node_names)}
        dyn = np.array(dynamic, copy=True)
        used = np.array(snapshot.mig.used, copy=True)
        layout = snapshot.mig
        for node, uuid in [*self._plans, *self._cooling]:
            row = rows.get(node)
            if row is None or uuid not in snapshot.gpu_uuid[row]:
                continue
            slot = snapshot.gpu_uuid[row].index(uuid)
            dyn[row, slot] = False
            plan = self._plans.get((node, uuid))
            if plan is None:
                continue
            for k in np.flatnonzero((layout.node == row) & (layout.slot == slot)):
                inst = (layout.profiles[int(layout.profile[k])], int(layout.start[k]))
                if inst in plan.destroy:
                    used[k] = True
        dyn.flags.writeable = False
        used.flags.writeable = False
        return dataclasses.replace(
            snapshot, gpu_mig_dynamic=dyn, mig=dataclasses.replace(layout, used=used)
        )

    def carry_out(self, decision: Decision, refs: Mapping[str, PodRef]) -> set[str]:
        """Write the plans of ``decision.reconfigurations``; the task ids not to bind now
        (each waits for its plan; ``refs`` names the pods)."""
        if not decision.reconfigurations:
            return set()
        held: set[str] = set()
        touched: dict[str, list[_GpuPlan]] = {}
        for rec in decision.reconfigurations:
            held.add(rec.for_task)
            key = (rec.node, rec.uuid)
            plan = self._plans.get(key)
            base = plan.target if plan is not None else self._layout(rec.node, rec.uuid)
            destroy = [(d.profile, d.start) for d in rec.destroy]
            target = mig.changed_layout(base, destroy, [(c.profile, c.start) for c in rec.create])
            if target is None:
                logger.warning(
                    "mig plan skipped node=%s gpu=%s: planned on a layout that has moved on",
                    *key,
                )
                continue
            if plan is None:
                plan = _GpuPlan(rec.node, rec.uuid, target, frozenset(destroy), {})
                self._plans[key] = plan
            else:
                plan.target = target
                plan.destroy = plan.destroy | frozenset(destroy)
            ref = refs.get(rec.for_task)
            if ref is not None:
                plan.pods[rec.for_task] = ref
            plan.deadline = self._clock() + self.timeout_s
            touched.setdefault(rec.node, []).append(plan)
        for node in touched:
            self._write(node)
        return held

    def _layout(self, node: str, uuid: str) -> tuple[mig.Instance, ...]:
        view = self._nodes.get(node)
        current = view.layouts.get(uuid, frozenset()) if view is not None else frozenset()
        return tuple(sorted(current, key=lambda x: (x[1], x[0])))

    def _write(self, node: str) -> None:
        """Write the node's plan (every GPU of it in flight) with the next generation."""
        view = self._nodes.setdefault(node, _NodeView())
        generation = (
            max(
                view.generation,
                max((p.generation for k, p in self._plans.items() if k[0] == node), default=0),
            )
            + 1
        )
        plans = [p for k, p in self._plans.items() if k[0] == node]
        for p in plans:
            p.generation = generation
        body = MigPlan(
            generation=generation,
            gpus=tuple(
                PlanGpu(
                    uuid=p.uuid,
                    layout=tuple(PlanInstance(profile=n, start=s) for n, s in p.target),
                )
                for p in plans
            ),
            pods=tuple(
                PlanPod(namespace=r.namespace, name=r.name, uid=r.uid)
                for p in plans
                for r in p.pods.values()
            ),
        )
        self.planned += 1
        self.on_outcome("planned")
        for p in plans:
            text = (
                f"MIG re-layout planned on {node} GPU {p.uuid} (generation {generation}): "
                f"{_fmt(p.target)}; destroys idle {_fmt(p.destroy) or 'nothing'}; the pod is "
                "bound once the node advertises the new instance"
            )
            logger.info("mig plan node=%s gpu=%s generation=%d", node, p.uuid, generation)
            self.reporter.note(None, node, REASON_PLANNED, text, warning=False)
            for ref in p.pods.values():
                self.reporter.note(ref, "", REASON_PLANNED, text, warning=False)
        task = asyncio.create_task(self._patch(node, body))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _patch(self, node: str, plan: MigPlan) -> None:
        try:
            await self.client.patch(
                f"/api/v1/nodes/{node}",
                {"metadata": {"annotations": {mig_plan.ANNOTATION: plan.to_json()}}},
            )
        except ApiError as exc:
            for key in [k for k, p in self._plans.items() if k[0] == node]:
                if self._plans[key].generation == plan.generation:
                    self._drop(key, f"writing {mig_plan.ANNOTATION} failed: {exc}")


def _fmt(instances: Iterable[mig.Instance]) -> str:
    return ", ".join(f"{n}@{s}" for n, s in sorted(instances, key=lambda x: (x[1], x[0])))
