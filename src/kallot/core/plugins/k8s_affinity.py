"""InterPodAffinity and PodTopologySpread, after kube-scheduler's plugins of the same names.

Both count the pods on each node (``helpers.k8s_pods.placed``: bound, assumed and placed earlier in
this session) per topology domain, a domain being one value of the term's or constraint's
``topologyKey`` node label. Counts are dictionaries keyed by (key, value code); masks over
nodes come from the label codes of ``snapshot.labels``, so a filter costs one pass over the
pods and a few vector operations over the nodes.

InterPodAffinity (filter): every required affinity term has a matching pod in the node's domain
(or, when no pod anywhere matches and the pod matches its own terms, any node with the keys);
no required anti-affinity term has a matching pod in the node's domain; and no pod already
placed has a required anti-affinity term the new pod matches in the node's domain. Score: the
weights of preferred terms (the pod's and, symmetrically, placed pods') per matching pod.

PodTopologySpread (filter): for each DoNotSchedule constraint, pods matching its selector in
the node's domain, plus one if the pod matches itself, minus the fewest in any domain (0 when
fewer domains than minDomains), is at most maxSkew. Domains are those of nodes with every
constraint's key that pass the pod's node affinity (nodeAffinityPolicy Honor, the default) and,
with nodeTaintsPolicy Honor, its tolerations. Score (ScheduleAnyway): fewer matching pods is
better.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import k8s
from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import FilterPlugin, Rejection, ScorePlugin
from kallot.core.helpers.k8s_pods import (
    all_nodes,
    node_selector_filter,
    normalize,
    placed,
    selector_mask,
    taint_mask,
)
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]
F64 = NDArray[np.float64]
Counts = dict[tuple[str, int], float]


def _add(counts: Counts, snapshot: Snapshot, key: str, node: int, value: float) -> None:
    code = int(snapshot.labels.domain(key)[node])
    if code >= 0:
        pair = (key, code)
        counts[pair] = counts.get(pair, 0.0) + value
        if counts[pair] == 0:
            del counts[pair]


def _positive(snapshot: Snapshot, counts: Counts, key: str) -> BOOL:
    """Nodes whose domain of ``key`` has a positive count."""
    dom = snapshot.labels.domain(key)
    codes = [c for (k, c), v in counts.items() if k == key and v > 0]
    if not codes:
        return np.zeros(snapshot.n_nodes, dtype=np.bool_)
    return np.asarray(np.isin(dom, codes), dtype=np.bool_)


def _weights(snapshot: Snapshot, counts: Counts, candidates: NDArray[np.intp]) -> F64:
    raw = np.zeros(candidates.size, dtype=np.float64)
    for (key, code), value in counts.items():
        raw += value * (snapshot.labels.domain(key)[candidates] == code)
    return raw


class InterPodAffinity:
    name: ClassVar[str] = "InterPodAffinity"

    def _masks(self, cycle: Cycle, task: Task) -> tuple[BOOL, BOOL, BOOL]:
        """(affinity ok, anti-affinity ok, placed pods' anti-affinity ok) over all nodes."""
        s = cycle.snapshot
        me = task.k8s
        assert me is not None
        index = placed(cycle)
        pods = index.pods() if me.affinity or me.anti_affinity else []
        affinity = all_nodes(s)
        if me.affinity:
            counts: Counts = {}
            for node, pod in pods:
                if all(t.matches(me.namespace, pod) for t in me.affinity):
                    for t in me.affinity:
                        _add(counts, s, t.topology_key, node, 1.0)
            has_keys = np.ones(s.n_nodes, dtype=np.bool_)
            exists = np.ones(s.n_nodes, dtype=np.bool_)
            for t in me.affinity:
                has_keys &= s.labels.domain(t.topology_key) >= 0
                exists &= _positive(s, counts, t.topology_key)
            if not counts and all(t.matches(me.namespace, me) for t in me.affinity):
                affinity = has_keys  # the first of a group with affinity to itself
            else:
                affinity = has_keys & exists
        anti = all_nodes(s)
        if me.anti_affinity:
            counts = {}
            for node, pod in pods:
                for t in me.anti_affinity:
                    if t.matches(me.namespace, pod):
                        _add(counts, s, t.topology_key, node, 1.0)
            bad = np.zeros(s.n_nodes, dtype=np.bool_)
            for key in {t.topology_key for t in me.anti_affinity}:
                bad |= _positive(s, counts, key)
            anti = ~bad
        existing = all_nodes(s)
        counts = {}
        for node, pod in index.having("anti"):
            for t in pod.anti_affinity:
                if t.matches(pod.namespace, me):
                    _add(counts, s, t.topology_key, node, 1.0)
        if counts:
            bad = np.zeros(s.n_nodes, dtype=np.bool_)
            for key in {k for k, _ in counts}:
                bad |= _positive(s, counts, key)
            existing = ~bad
        return affinity, anti, existing

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None:
            return None
        if (
            not task.k8s.affinity
            and not task.k8s.anti_affinity
            and not placed(cycle).having("anti")
        ):
            return None
        a, b, c = self._masks(cycle, task)
        return a & b & c

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        a, b, c = self._masks(cycle, task)
        return (
            Rejection("node(s) didn't match pod affinity rules", rejected & ~a),
            Rejection("node(s) didn't match pod anti-affinity rules", rejected & ~b),
            Rejection("node(s) didn't satisfy existing pods anti-affinity rules", rejected & ~c),
        )

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        me = task.k8s
        if me is None:
            return None
        s = cycle.snapshot
        index = placed(cycle)
        counts: Counts = {}
        if me.preferred_affinity or me.preferred_anti_affinity:
            for node, pod in index.pods():
                for w in me.preferred_affinity:
                    if w.term.matches(me.namespace, pod):
                        _add(counts, s, w.term.topology_key, node, float(w.weight))
                for w in me.preferred_anti_affinity:
                    if w.term.matches(me.namespace, pod):
                        _add(counts, s, w.term.topology_key, node, -float(w.weight))
        for node, pod in index.having("symmetric"):
            # Symmetry: placed pods' terms that the new pod matches (hard affinity weighs 1).
            for t in pod.affinity:
                if t.matches(pod.namespace, me):
                    _add(counts, s, t.topology_key, node, 1.0)
            for w in pod.preferred_affinity:
                if w.term.matches(pod.namespace, me):
                    _add(counts, s, w.term.topology_key, node, float(w.weight))
            for w in pod.preferred_anti_affinity:
                if w.term.matches(pod.namespace, me):
                    _add(counts, s, w.term.topology_key, node, -float(w.weight))
        if not counts:
            return None
        return normalize(_weights(s, counts, candidates))


def _inclusion(cycle: Cycle, task: Task, c: k8s.SpreadConstraint) -> BOOL:
    """Nodes whose pods count for constraint ``c`` (node inclusion policies)."""
    s = cycle.snapshot
    me = task.k8s
    assert me is not None
    mask = all_nodes(s)
    if c.honor_node_affinity:
        mask = mask & node_selector_filter(cycle, task)
        if me.required_nodes is not None:
            mask = mask & selector_mask(s, me.required_nodes)
    if c.honor_node_taints:
        mask = mask & taint_mask(s, me.tolerations, k8s.HARD_EFFECTS)
    return mask


def _matching_per_node(cycle: Cycle, task: Task, c: k8s.SpreadConstraint) -> NDArray[np.int64]:
    me = task.k8s
    assert me is not None
    return np.fromiter(
        (
            sum(
                1
                for p in pods.values()
                if p.namespace == me.namespace
                and not p.terminating
                and k8s.selector_matches(c.selector, p.labels)
            )
            for pods in placed(cycle).by_node
        ),
        dtype=np.int64,
        count=cycle.snapshot.n_nodes,
    )


def _keys_mask(s: Snapshot, constraints: Iterable[k8s.SpreadConstraint]) -> BOOL:
    mask = np.ones(s.n_nodes, dtype=np.bool_)
    for c in constraints:
        mask &= s.labels.domain(c.topology_key) >= 0
    return mask


class PodTopologySpread:
    name: ClassVar[str] = "PodTopologySpread"

    def _skew_ok(self, cycle: Cycle, task: Task) -> list[tuple[k8s.SpreadConstraint, BOOL]]:
        s = cycle.snapshot
        me = task.k8s
        assert me is not None
        hard = [c for c in me.spread if c.hard]
        eligible = _keys_mask(s, hard)
        out = []
        for c in hard:
            dom = s.labels.domain(c.topology_key)
            counted = eligible & _inclusion(cycle, task, c)
            per_node = _matching_per_node(cycle, task, c)
            size = len(s.labels.vocab.get(c.topology_key, {}))
            counts = np.bincount(dom[counted], weights=per_node[counted], minlength=size)
            present = np.unique(dom[counted])
            few = present.size < max(1, c.min_domains)
            low = 0.0 if few else float(counts[present].min())
            self_match = 1 if k8s.selector_matches(c.selector, me.labels) else 0
            here = np.where(dom >= 0, counts[np.maximum(dom, 0)] if size else 0.0, 0.0)
            ok = (dom >= 0) & (here + self_match - low <= c.max_skew)
            out.append((c, ok))
        return out

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None or not any(c.hard for c in task.k8s.spread):
            return None
        hard = [c for c in task.k8s.spread if c.hard]
        mask = _keys_mask(cycle.snapshot, hard)
        for _, ok in self._skew_ok(cycle, task):
            mask &= ok
        return mask

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        assert task.k8s is not None
        hard = [c for c in task.k8s.spread if c.hard]
        keys = _keys_mask(cycle.snapshot, hard)
        out = [
            Rejection(
                "node(s) didn't match pod topology spread constraints (missing required label)",
                rejected & ~keys,
                unresolvable=True,
            )
        ]
        for c, ok in self._skew_ok(cycle, task):
            out.append(
                Rejection(
                    f"node(s) didn't match pod topology spread constraints "
                    f"({c.topology_key}, maxSkew {c.max_skew})",
                    rejected & ~ok,
                )
            )
        return tuple(out)

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        me = task.k8s
        if me is None:
            return None
        soft = [c for c in me.spread if not c.hard]
        if not soft:
            return None
        s = cycle.snapshot
        eligible = _keys_mask(s, soft)
        raw = np.zeros(candidates.size, dtype=np.float64)
        for c in soft:
            dom = s.labels.domain(c.topology_key)
            counted = eligible & _inclusion(cycle, task, c)
            per_node = _matching_per_node(cycle, task, c)
            size = len(s.labels.vocab.get(c.topology_key, {}))
            counts = np.bincount(dom[counted], weights=per_node[counted], minlength=size)
            domains = max(1, np.unique(dom[counted]).size)
            cd = dom[candidates]
            here = np.where(cd >= 0, counts[np.maximum(cd, 0)] if size else 0.0, 0.0)
            raw += (here + c.max_skew - 1) * np.log(domains + 2)
        scores = normalize(raw, reverse=True)
        scores[~eligible[candidates]] = 0.0
        return scores


_f1: type[FilterPlugin] = InterPodAffinity
_f2: type[FilterPlugin] = PodTopologySpread
_s1: type[ScorePlugin] = InterPodAffinity
_s2: type[ScorePlugin] = PodTopologySpread
