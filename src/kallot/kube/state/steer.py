"""Where the replacements of pods consolidation evicted go (docs/autoscaling.md, "Replacements").

Where it sits: the store (kube.state.store) asks it about every pending kallot pod it reads;
the consolidation loop (kube.autoscale.consolidate) tells it, before each eviction, which owner's pod it
evicts and the node the move planned for it. The owner's controller (a ReplicaSet, a
StatefulSet, ...) then makes a new pod, which is a different pod with a new uid: kallot's
session would place it afresh, perhaps back on the node being emptied. So the first new
pending pod of that owner (``metadata.ownerReferences``, the controller) is nominated, in
kallot's memory only, to the planned node: the core's NominatedNode score sends it there and
NominatedReservation keeps the node's CPU, memory and pod slot for it from lower priorities,
as for a preemptor. Nothing is written to the API: the nomination is kallot's plan, not an
instruction to another scheduler, and a new leader simply places replacements afresh.

An expectation no new pod took within ``ttl_s`` is dropped (the owner made none, or scaled
down); a pod keeps its nomination while it is pending, as long as the store knows it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kallot.core.workload import Task

log = logging.getLogger(__name__)

TTL_S = 120.0


def controller_uid(pod: Mapping[str, Any]) -> str:
    """The uid of the pod's controlling owner, "" when it has none."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


class Steering:
    """Expected replacements by owner, and the nominations already handed out by pod."""

    def __init__(self, *, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        # (namespace, controller uid) -> [(node, deadline)], one per evicted pod, oldest first
        self._expected: dict[tuple[str, str], list[tuple[str, float]]] = {}
        self._given: dict[str, str] = {}  # pod uid -> node
        self.steered = 0  # replacements nominated (tests, logs)

    def expect(self, namespace: str, owner_uid: str, node: str) -> None:
        """A pod of ``owner_uid`` is about to be evicted; its replacement belongs on ``node``."""
        if owner_uid and node:
            slot = self._expected.setdefault((namespace, owner_uid), [])
            slot.append((node, self.clock() + self.ttl_s))

    def cancel(self, namespace: str, owner_uid: str, node: str) -> None:
        """The eviction did not happen: no replacement comes."""
        slot = self._expected.get((namespace, owner_uid), [])
        for i, (n, _) in enumerate(slot):
            if n == node:
                del slot[i]
                break

    def apply(self, uid: str, namespace: str, pod: Mapping[str, Any], task: Task) -> Task:
        """``task`` (pending pod ``uid``) nominated to its owner's planned node, if it is a
        replacement kallot expects and names no nominated node of its own."""
        if task.k8s is None or task.k8s.nominated_node:
            return task
        node = self._given.get(uid)
        if node is None:
            key = (namespace, controller_uid(pod))
            now = self.clock()
            slot = [(n, d) for n, d in self._expected.get(key, []) if d > now]
            if not slot:
                self._expected.pop(key, None)
                return task
            node = slot.pop(0)[0]
            self._expected[key] = slot
            self._given[uid] = node
            self.steered += 1
            log.info("replacement nominated pod=%s/%s node=%s", namespace, uid, node)
        return dataclasses.replace(task, k8s=dataclasses.replace(task.k8s, nominated_node=node))

    def incoming(self) -> set[str]:
        """The nodes replacements are on their way to: expected and not yet made, or nominated
        to a pod that is not bound yet (consolidation must not empty them meanwhile)."""
        now = self.clock()
        out = {n for slot in self._expected.values() for n, d in slot if d > now}
        return out | set(self._given.values())

    def forget(self, uid: str) -> None:
        """Pod ``uid`` is bound or gone."""
        self._given.pop(uid, None)
