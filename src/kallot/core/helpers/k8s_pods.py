"""What the k8s plugins (``plugins.k8s_node``, ``plugins.k8s_affinity``) share: which pods sit on
which node during a session, node masks derived from the snapshot, and kube-scheduler's score
normalization.

``placed(cycle)`` starts from the snapshot's ``placed`` pods (every pod bound or assumed on a
node, any scheduler's) and replays the Scratch's ``pod_log`` (allocations and evictions, in
order; a rollback pops entries, and the index is rebuilt when its last entry is gone), so a pod placed earlier in the same session counts for inter-pod affinity,
topology spread and host ports exactly like a bound one, and a rolled-back what-if does not.
Node masks that depend only on the snapshot and a hashable pod field (tolerations, a node
selector) are memoized in ``snapshot.memo``, once per distinct value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core import k8s
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import MAX_SCORE
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]
F64 = NDArray[np.float64]


@dataclass(slots=True)
class PlacedIndex:
    """Pods per node row (id -> PodInfo), current as of ``cursor`` entries of the pod log."""

    by_node: list[dict[str, k8s.PodInfo]]
    cursor: int = 0
    last: object = None  # the log entry at cursor - 1 (a rollback replaces or removes it)
    version: int = 0
    memo: dict[object, object] = field(default_factory=dict)  # cleared when version moves
    # How many indexed pods have each ``_HAVING`` feature, kept as pods come and go: when none
    # has it (the common case) ``having`` answers without a pass over every placed pod, which
    # it would otherwise make for every task after each placement (a session's cost grew with
    # the pods on the cluster, to 14 ms a pod on a nearly full 1,000-node cluster).
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, node: int, pod_id: str, pod: k8s.PodInfo) -> None:
        old = self.by_node[node].get(pod_id)
        if old is not None:
            self._count(old, -1)
        self.by_node[node][pod_id] = pod
        self._count(pod, 1)

    def remove(self, node: int, pod_id: str) -> None:
        old = self.by_node[node].pop(pod_id, None)
        if old is not None:
            self._count(old, -1)

    def _count(self, pod: k8s.PodInfo, sign: int) -> None:
        for what, test in _HAVING.items():
            if test(pod):
                self.counts[what] = self.counts.get(what, 0) + sign

    def pods(self) -> list[tuple[int, k8s.PodInfo]]:
        """Every (node row, pod), memoized until the next change."""
        got = self.memo.get("pods")
        if got is None:
            got = [(n, p) for n, pods in enumerate(self.by_node) for p in pods.values()]
            self.memo["pods"] = got
        return got  # type: ignore[return-value]

    def having(self, what: str) -> list[tuple[int, k8s.PodInfo]]:
        """The pods with required anti-affinity ("anti"), with terms that score others
        ("symmetric": affinity, preferred affinity or anti-affinity) or with host ports
        ("ports"), memoized: most pods have none, and every task asks."""
        if not self.counts.get(what):
            return []
        key = ("having", what)
        got = self.memo.get(key)
        if got is None:
            test: Callable[[k8s.PodInfo], bool] = _HAVING[what]
            got = [(n, p) for n, p in self.pods() if test(p)]
            self.memo[key] = got
        return got  # type: ignore[return-value]


_HAVING: dict[str, Callable[[k8s.PodInfo], bool]] = {
    "anti": lambda p: bool(p.anti_affinity),
    "symmetric": lambda p: bool(p.affinity or p.preferred_affinity or p.preferred_anti_affinity),
    "ports": lambda p: bool(p.host_ports),
}

_PLACED: StateKey[PlacedIndex] = StateKey("k8s/placed")


def placed(cycle: Cycle) -> PlacedIndex:
    index = cycle.session.get(_PLACED)
    log = cycle.scratch.pod_log
    stale = index is not None and (
        index.cursor > len(log) or (index.cursor > 0 and log[index.cursor - 1] is not index.last)
    )
    if index is None or stale:
        index = PlacedIndex(by_node=[{} for _ in range(cycle.snapshot.n_nodes)])
        for p in cycle.snapshot.placed:
            index.add(p.node, p.id, p.pod)
        cycle.session.put(_PLACED, index)
    if index.cursor < len(log):
        for sign, node, task in log[index.cursor :]:
            if sign > 0:
                if task.k8s is not None:
                    index.add(node, task.id, task.k8s)
            else:
                index.remove(node, task.id)
        index.cursor = len(log)
        index.last = log[-1]
        index.version += 1
        index.memo.clear()
    return index


def all_nodes(snapshot: Snapshot) -> BOOL:
    """An all-True [N] mask (shared, read-only: callers combine it, never write it)."""
    key = ("k8s", "all")
    mask = snapshot.memo.get(key)
    if mask is None:
        mask = np.ones(snapshot.n_nodes, dtype=np.bool_)
        mask.flags.writeable = False
        snapshot.memo[key] = mask
    return mask


def _label_mask(snapshot: Snapshot, req: k8s.Requirement) -> BOOL:
    labels = snapshot.labels
    return k8s.requirement_mask(
        labels.codes.get(req.key), labels.vocab.get(req.key, {}), req, snapshot.n_nodes
    )


def term_mask(snapshot: Snapshot, term: k8s.NodeSelectorTerm) -> BOOL:
    """Nodes a NodeSelectorTerm matches (labels vectorized per distinct value; fields by name)."""
    key = ("k8s", "term", term)
    mask = snapshot.memo.get(key)
    if mask is None:
        n = snapshot.n_nodes
        if not term.expressions and not term.fields:
            mask = np.zeros(n, dtype=np.bool_)
        else:
            mask = np.ones(n, dtype=np.bool_)
            for req in term.expressions:
                mask &= _label_mask(snapshot, req)
            for req in term.fields:
                mask &= np.fromiter(
                    (
                        req.matches_value(name if req.key == k8s.FIELD_NODE_NAME else None)
                        for name in snapshot.node_names
                    ),
                    dtype=np.bool_,
                    count=n,
                )
        snapshot.memo[key] = mask
    return mask


def selector_mask(snapshot: Snapshot, selector: k8s.NodeSelector) -> BOOL:
    """Nodes a NodeSelector (terms ORed) matches."""
    key = ("k8s", "selector", selector)
    mask = snapshot.memo.get(key)
    if mask is None:
        mask = np.zeros(snapshot.n_nodes, dtype=np.bool_)
        for term in selector.terms:
            mask |= term_mask(snapshot, term)
        snapshot.memo[key] = mask
    return mask


def plain_selector_mask(snapshot: Snapshot, selector: tuple[tuple[str, str], ...]) -> BOOL:
    """Nodes carrying every label of a spec.nodeSelector."""
    key = ("k8s", "nodeSelector", selector)
    mask = snapshot.memo.get(key)
    if mask is None:
        mask = np.ones(snapshot.n_nodes, dtype=np.bool_)
        for k, v in selector:
            mask &= snapshot.labels.equals(k, v)
        snapshot.memo[key] = mask
    return mask


def taint_mask(
    snapshot: Snapshot, tolerations: tuple[k8s.Toleration, ...], effects: frozenset[str]
) -> BOOL:
    """Nodes without a taint of ``effects`` the tolerations miss (computed once per distinct
    set of tolerations: nodes share few taint sets)."""
    if not snapshot.node_taints:
        return all_nodes(snapshot)
    key = ("k8s", "taints", tolerations, effects)
    mask = snapshot.memo.get(key)
    if mask is None:
        verdict: dict[tuple[k8s.Taint, ...], bool] = {}
        out = np.ones(snapshot.n_nodes, dtype=np.bool_)
        for n, taints in enumerate(snapshot.node_taints):
            if not taints:
                continue
            ok = verdict.get(taints)
            if ok is None:
                ok = k8s.untolerated(taints, tolerations, effects) is None
                verdict[taints] = ok
            out[n] = ok
        mask = out
        snapshot.memo[key] = mask
    return mask


def node_labels(snapshot: Snapshot, node: int) -> dict[str, str]:
    """One node's labels as a dict (for explanations, not the hot path)."""
    out = {}
    for key in snapshot.labels.codes:
        value = snapshot.labels.value_of(key, node)
        if value is not None:
            out[key] = value
    return out


def normalize(raw: F64, *, reverse: bool = False) -> F64:
    """kube-scheduler's default normalization: scale to [0, MAX_SCORE] by the largest (after
    shifting by the smallest when ``reverse`` is False and scores can be negative)."""
    if raw.size == 0:
        return raw
    lo, hi = float(raw.min()), float(raw.max())
    if reverse:
        if hi <= 0:
            return np.full(raw.size, MAX_SCORE)
        return MAX_SCORE * (hi - raw) / hi
    if hi == lo:
        return np.zeros(raw.size) if hi == 0 else np.full(raw.size, MAX_SCORE)
    return MAX_SCORE * (raw - lo) / (hi - lo)


def node_selector_filter(cycle: Cycle, task: Task) -> BOOL:
    """spec.nodeSelector as a mask (NodeSelector plugin's rule), for PodTopologySpread's
    nodeAffinityPolicy."""
    return plain_selector_mask(cycle.snapshot, tuple(sorted(task.node_selector.items())))
