"""Disruption safety for model servers: ``karpenter.sh/do-not-disrupt`` set and cleared by the
scheduler from readiness and a grace window (docs/serving.md, "Disruption safety").

Where it sits: the kube shell, a loop of its own next to the Controller (``kallot scheduler
--disruption-grace``). Every ``interval_s`` it lists the pods kallot schedules and patches the
annotation where ``plan`` says so. A pod that names a model (``kube.translate.models.task_model``) and is
bound to a node is protected while

- it is loading: not Ready yet (a cold start pulls tens to hundreds of GB);
- it became Ready less than ``grace_s`` ago (caches warm up, clients reconnect);
- it is the last Ready replica of its model in its namespace (taking it means a cold start for
  every request until a replacement is ready).

The annotation is what Karpenter reads (its consolidation and drift leave such pods alone) and
what kallot's own preemption reads (``translate``: ``do_not_disrupt``). Pods kallot protects get
the marker ``kallot.io/disruption-guard`` with the reason; kallot clears only annotations it set,
never one a user or another controller wrote.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kallot.config import wire
from kallot.core.errors import ConfigError
from kallot.kube import translate
from kallot.kube.api.client import KubeClient
from kallot.kube.translate.models import task_model

log = logging.getLogger(__name__)

MARKER = wire.ANN_DISRUPTION_GUARD
GRACE_S = 300.0
INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class Patch:
    """Set (``reason`` non-empty) or clear kallot's do-not-disrupt on one pod."""

    namespace: str
    name: str
    reason: str

    def body(self) -> dict[str, Any]:
        if self.reason:
            value: dict[str, str | None] = {
                translate.ANN_KARPENTER_DO_NOT_DISRUPT: "true",
                MARKER: self.reason,
            }
        else:
            value = {translate.ANN_KARPENTER_DO_NOT_DISRUPT: None, MARKER: None}
        return {"metadata": {"annotations": value}}


def ready_since(pod: Mapping[str, Any]) -> float | None:
    """When the pod's Ready condition last became True (epoch seconds), None if not Ready."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            return translate.parse_time(c.get("lastTransitionTime")) or 0.0
    return None


def _model_key(pod: Mapping[str, Any]) -> str | None:
    try:
        model = task_model(pod)
    except ConfigError:
        return None  # the pod has its Event from the scheduler; nothing to guard
    return None if model is None else model.id


def plan(pods: Iterable[Mapping[str, Any]], now: float, grace_s: float = GRACE_S) -> list[Patch]:
    """The patches that bring every bound model server to its wanted protection."""
    out = []
    for pod, reason in protection(pods, now, grace_s):
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        ann = meta.get("annotations") or {}
        ours = MARKER in ann
        # a do-not-disrupt someone else wrote (no marker) is theirs: never changed
        theirs = not ours and translate.ANN_KARPENTER_DO_NOT_DISRUPT in ann
        current = (
            ann.get(MARKER) if ann.get(translate.ANN_KARPENTER_DO_NOT_DISRUPT) == "true" else None
        )
        if reason and not theirs and current != reason:
            out.append(Patch(ns, name, reason))
        elif not reason and ours:
            out.append(Patch(ns, name, ""))
    return out


def protection(
    pods: Iterable[Mapping[str, Any]], now: float, grace_s: float = GRACE_S
) -> list[tuple[Mapping[str, Any], str]]:
    """Every bound model server with why it must not move now (``loading``, ``grace``,
    ``last-ready-replica``; "" when it may). Consolidation (``kube.autoscale.consolidate``) reads it
    directly, not through the annotation, which lags by one guard round."""
    servers: list[tuple[Mapping[str, Any], str, float | None]] = []
    ready_count: dict[tuple[str, str], int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (
            not translate.pod_node(pod)
            or translate.pod_finished(pod)
            or meta.get("deletionTimestamp")
        ):
            continue
        model = _model_key(pod)
        if model is None:
            continue
        since = ready_since(pod)
        group = (str(meta.get("namespace", "")), model)
        if since is not None:
            ready_count[group] = ready_count.get(group, 0) + 1
        servers.append((pod, model, since))
    out: list[tuple[Mapping[str, Any], str]] = []
    for pod, model, since in servers:
        ns = str((pod.get("metadata") or {}).get("namespace", ""))
        if since is None:
            reason = "loading"
        elif now - since < grace_s:
            reason = "grace"
        elif ready_count[(ns, model)] == 1:
            reason = "last-ready-replica"
        else:
            reason = ""
        out.append((pod, reason))
    return out


class DisruptionGuard:
    """Applies ``plan`` every ``interval_s`` to the pods of ``scheduler_name``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        scheduler_name: str = translate.SCHEDULER_NAME,
        grace_s: float = GRACE_S,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
        wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self.client = client
        self.scheduler_name = scheduler_name
        self.grace_s = grace_s
        self.interval_s = interval_s
        self.clock = clock
        # Whether any bound pod names a model (the scheduler's cache knows): the list of every
        # kallot pod is skipped otherwise; at 50,000 pods it costs seconds of the scheduler's
        # CPU each round, and at start-up it competed with the first lists.
        self.wanted = wanted
        self.patched = 0

    async def once(self) -> list[Patch]:
        if not self.wanted():
            return []
        pods, _ = await self.client.list_all(
            "/api/v1/pods", query=[("fieldSelector", f"spec.schedulerName={self.scheduler_name}")]
        )
        patches = plan(pods, self.clock(), self.grace_s)
        for p in patches:
            try:
                await self.client.patch(f"/api/v1/namespaces/{p.namespace}/pods/{p.name}", p.body())
                self.patched += 1
            except Exception as exc:  # gone or briefly unreachable: the next round retries
                log.warning("do-not-disrupt on pod %s/%s: %s", p.namespace, p.name, exc)
        return patches

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except Exception as exc:
                log.warning("disruption guard: %s", exc)
            await asyncio.sleep(self.interval_s)
