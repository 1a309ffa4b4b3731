"""Problem reports of the live scheduler: what is wrong with a pod, a node or a Queue, said
once per object and text, as an Event (and the pod's ``PodScheduled`` condition).

Where it sits: the session loop (``kube.schedule.loop``) calls the ``report_*`` methods at the
start of each session (the cache holds the problems the watch found: pods whose request does
not translate, unknown ``kallot.io/`` keys, device records naming GPUs the node does not have,
bad GPU inventories, pods no gang could be derived for), ``fault`` when the core faulted on a
pod, and the session actions (``kube.schedule.actions``) ``queue_problem`` for a Queue the tree
ignores. The writes themselves go through the Reporter (``kube.ops.reporter``), which drops what
it cannot keep up with.
"""

from __future__ import annotations

import logging

from kallot.core.status import Diagnosis
from kallot.kube.ops import logs
from kallot.kube.ops.metrics import Metrics
from kallot.kube.ops.reporter import REASON_NO_GANG, PodRef, Reporter
from kallot.kube.state.cache import FAULT_KIND, Cache, PodEntry

logger = logging.getLogger(__name__)


def pod_ref(entry: PodEntry) -> PodRef:
    return PodRef(entry.namespace, entry.name, entry.uid)


class Problems:
    """What has been said, per object, so each text is said once. Runs on the event loop."""

    def __init__(self, cache: Cache, reporter: Reporter, metrics: Metrics) -> None:
        self.cache = cache
        self.reporter = reporter
        self.metrics = metrics
        self._invalid: dict[str, str] = {}
        self._pods: dict[str, set[str]] = {}
        self._nodes: dict[str, str] = {}
        self._queues: dict[str, str] = {}
        self._owner_notes: dict[str, str] = {}

    def report_invalid(self) -> None:
        """Pods whose request does not translate: the error is their pending reason."""
        for entry in self.cache.pending_pods():
            if not entry.kallot:
                continue
            if entry.error is None:
                self._invalid.pop(entry.uid, None)
                continue
            text = str(entry.error)
            if self._invalid.get(entry.uid) == text:
                continue
            self._invalid[entry.uid] = text
            self.cache.invalid(entry.uid, text)
            self.metrics.attempts.labels("invalid").inc()
            logger.info("invalid request pod=%s error=%s", entry.key, logs.truncate(text))
            self.reporter.invalid(pod_ref(entry), text)
        for uid in [u for u in self._invalid if self.cache.pod(u) is None]:
            del self._invalid[uid]

    def report_pods(self) -> None:
        """Once per pod and text: unknown kallot.io/ keys, and device records that name GPUs
        the node does not have (charged conservatively by the cache)."""
        for entry in list(self.cache.pods()):
            missing = entry.held.missing_devices
            if not entry.warnings and not missing:
                continue
            texts = [("UnknownAnnotation", w) for w in entry.warnings]
            if missing:
                texts.append(
                    (
                        "UnknownDevice",
                        f"the device record names GPU {', '.join(missing)}, which "
                        f"node {entry.node} does not have; kallot charges an idle GPU of the node "
                        "for each until the pod ends",
                    )
                )
            seen = self._pods.setdefault(entry.uid, set())
            for reason, text in texts:
                if text in seen:
                    continue
                seen.add(text)
                logger.warning("pod problem pod=%s reason=%s text=%s", entry.key, reason, text)
                self.reporter.pod_warning(pod_ref(entry), reason, text)
        for uid in [u for u in self._pods if self.cache.pod(u) is None]:
            del self._pods[uid]

    def report_owner_notes(self) -> None:
        """Pods whose owner names no gang kallot can derive, and why."""
        for uid, text in list(self.cache.owners.notes.items()):
            entry = self.cache.pod(uid)
            if entry is None or self._owner_notes.get(uid) == text:
                continue
            self._owner_notes[uid] = text
            logger.info("no gang derived pod=%s why=%s", entry.key, text)
            self.reporter.pod_warning(pod_ref(entry), REASON_NO_GANG, text)
        for uid in [u for u in self._owner_notes if self.cache.pod(u) is None]:
            del self._owner_notes[uid]

    def report_nodes(self) -> None:
        """Nodes whose GPU inventory does not parse (kallot ignores their GPUs)."""
        for name, err in list(self.cache.node_errors.items()):
            text = str(err)
            if self._nodes.get(name) == text:
                continue
            self._nodes[name] = text
            logger.warning("invalid node inventory node=%s error=%s", name, text)
            self.reporter.node_problem(
                name, "InvalidGPUInventory", f"kallot ignores this node's GPUs: {text}"
            )

    def queue_problem(self, name: str, text: str) -> None:
        """A Queue the tree ignores, or a tree that keeps its previous form."""
        if self._queues.get(name) == text:
            return
        self._queues[name] = text
        logger.warning("invalid Queue queue=%s error=%s", name, text)
        self.reporter.queue_problem(name, "InvalidQueue", text)

    def fault(self, entry: PodEntry, diagnosis: Diagnosis) -> None:
        """The core faulted on this pod (a plugin raised): Event and pending reason, backoff;
        the session placed everyone else."""
        delay = self.cache.back_off_fault(entry.uid, diagnosis)
        self.metrics.task_faults.inc()
        logger.warning(
            "fault pod=%s fault=%s retry_in=%.0fs",
            entry.key,
            logs.truncate(diagnosis.fault),
            delay,
        )
        self.reporter.unschedulable(pod_ref(entry), diagnosis.message(), FAULT_KIND)
