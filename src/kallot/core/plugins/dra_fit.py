"""DraAllocation: a pod's ResourceClaims (DRA) as a filter and score of the session.

Where it sits: the core's side of the live scheduler's DRA support. The shell resolves a pod's
claims and the cluster's DRA inventory into ``PodInfo.dra`` (``core.dra.pod.PodClaims``);
this plugin runs ``core.dra.allocator.allocate`` on every node (kube-scheduler's
DynamicResources Filter), keeps the nodes where the claims can be allocated, and scores them
by the DRA policy's key of the best allocation there (``core.dra.policy``: locality, opened
GPUs, MIG headroom, best fit), so the node is chosen by the quality of its allocation, not
the first node that fits.

Within a session, an allocation of a task placed earlier occupies its devices for the tasks
after it: the plugin replays the Scratch's ``pod_log`` (rolled-back placements drop out of it)
and takes, for each placed task, the allocation it computed on that node when it filtered
that task. A claim allocated earlier in the session (shared by two pods) is then only reserved
by the next pod, on a node its allocation reaches.

Reserve (``reserve``): once the session chose a node for a pod, its allocation there is
computed on the state its predecessors left, with the policy the nodes were scored by, and
goes into the Placement (``core.decision.ClaimDecision``): the shell writes exactly that and
runs no allocator of its own. The outcome is kept for the replay, so the pods after it see
what it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.decision import ClaimDecision
from kallot.core.dra.allocator import Inventory, Outcome, Policy, allocate
from kallot.core.dra.model import ClaimAllocation, Pool, ResourceClaim
from kallot.core.dra.pod import PodClaims
from kallot.core.dra.policy import KallotPolicy
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import (
    MAX_SCORE,
    FilterPlugin,
    Rejection,
    ReservePlugin,
    ScorePlugin,
)
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]
Summary = tuple[bool, Any, str]  # fits, policy key, why not (Outcome.reason)
F64 = NDArray[np.float64]

# (task id, node row) -> the outcome computed when that task was filtered (session-wide).
_OUTCOMES: StateKey[dict[tuple[str, int], Outcome]] = StateKey("DraAllocation/outcomes")
# node row -> (fits, policy key) for the task being placed.
_CYCLE: StateKey[dict[int, Summary]] = StateKey("DraAllocation/cycle")
# (claims' signature, node row, the row's version) -> (fits, policy key): pods asking the same
# on an unchanged node get the same answer without a new search.
_SUMMARY: StateKey[dict[Any, Summary]] = StateKey("DraAllocation/summary")
# id(inventory) -> node name -> the pools whose devices may serve that node, and the
# allocations on them (so one node's allocation does not walk the whole cluster's).
_POOLS: StateKey[dict[int, dict[str, NodeInventory]]] = StateKey("DraAllocation/pools")
# (inventory, row, version) -> the node's state by content (the summary cache's key).
_STATES: StateKey[dict[Any, tuple[Any, ...]]] = StateKey("DraAllocation/states")
_CLASSES: StateKey[dict[int, str]] = StateKey("DraAllocation/classes")
_LABELS: StateKey[dict[int, dict[str, str]]] = StateKey("DraAllocation/labels")
# id(PodClaims.off_nodes) -> the nodes where a special claim applies (shared by the pods the
# shell gave the same set).
_ON: StateKey[dict[int, tuple[frozenset[str], BOOL]]] = StateKey("DraAllocation/on")


def node_labels(snapshot: Snapshot, row: int) -> dict[str, str]:
    out = {}
    for key in snapshot.labels.codes:
        value = snapshot.labels.value_of(key, row)
        if value is not None:
            out[key] = value
    return out


NodeInventory = tuple[list[Pool], list[ClaimAllocation]]


def by_node(inventory: Inventory) -> dict[str, NodeInventory]:
    """Node-local pools by node name, pools with network-attached devices under "", each with
    the allocations that use a device of theirs."""
    out: dict[str, NodeInventory] = {}
    where: dict[tuple[str, str], str] = {}
    for pool in inventory.pools:
        names = {d.placement.node_name for d in pool.devices}
        node = names.pop() if len(names) == 1 and "" not in names else ""
        if not pool.devices:
            continue
        out.setdefault(node, ([], []))[0].append(pool)
        where[(pool.driver, pool.name)] = node
    for alloc in inventory.allocated:
        for at in {where.get((r.driver, r.pool)) for r in alloc.results}:
            if at is not None:
                out[at][1].append(alloc)
    return out


def _near(
    index: Mapping[str, NodeInventory], extra: Sequence[ClaimAllocation]
) -> dict[str, list[ClaimAllocation]] | None:
    """The session's allocations by the node whose pools they use, in order (what
    ``allocate_on`` keeps of ``extra`` for that node, found once rather than per node); None
    when there are network-attached pools (every node sees those)."""
    if "" in index:
        return None
    where = {(p.driver, p.name): node for node, (pools, _) in index.items() for p in pools}
    out: dict[str, list[ClaimAllocation]] = {}
    for alloc in extra:
        nodes = {where.get((r.driver, r.pool)) for r in alloc.results}
        for node in nodes:
            if node is not None:
                out.setdefault(node, []).append(alloc)
    return out


def node_inventory(index: Mapping[str, NodeInventory], node: str) -> NodeInventory:
    """What may serve ``node``: its own pools and the network-attached ones."""
    local = index.get(node, ([], []))
    network = index.get("", ([], []))
    if not network[0]:
        return local
    return [*local[0], *network[0]], [*local[1], *network[1]]


def in_session(
    cycle: Cycle, index: Mapping[str, NodeInventory], policy: Policy | None = None
) -> tuple[list[ClaimAllocation], dict[str, ClaimAllocation], dict[int, tuple[str, ...]]]:
    """Allocations made by the tasks placed so far in this session, replayed from the
    Scratch's pod log in placement order (each computed once, on the state its predecessors
    left: what the shell will write), the claims they allocated by key, and per node row the
    ids of the tasks with claims placed there (the row's version for the summary cache)."""
    outcomes = _session_dict(cycle, _OUTCOMES)
    labels_memo = _session_dict(cycle, _LABELS)
    s = cycle.snapshot
    allocations: list[ClaimAllocation] = []
    claims: dict[str, ClaimAllocation] = {}
    placed: dict[int, tuple[str, ...]] = {}
    for sign, row, task in cycle.scratch.pod_log:
        if sign <= 0 or task.k8s is None or task.k8s.dra is None:
            continue
        dra = task.k8s.dra
        placed[row] = (*placed.get(row, ()), task.id)
        out = outcomes.get((task.id, row))
        if out is None:
            name = s.node_names[row]
            labels = labels_memo.get(row)
            if labels is None:
                labels = labels_memo[row] = node_labels(s, row)
            local = node_inventory(index, name)
            out = allocate_on(dra, name, labels, local, allocations, claims, policy)
            outcomes[(task.id, row)] = out
        for key, alloc in out.allocations.items():
            if key not in claims:
                claims[key] = alloc
                allocations.append(alloc)
    return allocations, claims, placed


T = TypeVar("T")


def _session_dict(cycle: Cycle, key: StateKey[dict[Any, T]]) -> dict[Any, T]:
    got = cycle.session.get(key)
    if got is None:
        got = {}
        cycle.session.put(key, got)
    return got


def _signature(dra: PodClaims, claimed: Mapping[str, ClaimAllocation], classes: str) -> str:
    """What the outcome on a node depends on besides the node's state, by content (compiled
    selectors are kept for good by their text, so their identity is content too): the
    classes, the unallocated claims' requests and constraints (not their names), and the
    allocated claims' node selectors."""
    parts = [classes]
    for c in dra.claims:
        if c.allocation is not None:
            parts.append(f"A:{c.key}:{c.allocation.node_selector!r}")
        elif c.key in claimed:
            parts.append(f"C:{c.key}:{claimed[c.key].node_selector!r}")
        else:
            parts.append(f"U:{c.requests!r}:{c.constraints!r}")
    return "|".join(parts)


def _node_state(local: NodeInventory, extra: Sequence[ClaimAllocation]) -> tuple[Any, ...]:
    """A node's DRA state by content: its pools (name, generation) and what allocations,
    existing and in this session, hold on them."""
    pools = {(p.driver, p.name) for p in local[0]}
    held = sorted(
        (r.driver, r.pool, r.device, tuple(sorted(r.consumed.items())))
        for alloc in (*local[1], *extra)
        for r in alloc.results
        if (r.driver, r.pool) in pools and not r.admin_access
    )
    return (tuple((p.driver, p.name, p.generation) for p in local[0]), tuple(held))


def allocate_on(  # noqa: PLR0917 - one call shape for the filter, the replay and Reserve
    dra: PodClaims,
    node: str,
    labels: Mapping[str, str],
    local: NodeInventory,
    extra: Sequence[ClaimAllocation],
    claimed: Mapping[str, ClaimAllocation],
    policy: Policy | None = None,
) -> Outcome:
    """The pod's claims on one node (``local``: ``node_inventory``), given allocations made
    since the inventory was taken (``extra``, ``claimed``: by claim key), chosen by ``policy``
    (kallot's by default)."""
    inv = dra.inventory
    # Only the allocations on this node's pools occupy anything here (the session's are
    # cluster-wide).
    pools = {(p.driver, p.name) for p in local[0]}
    mine = [a for a in extra if any((r.driver, r.pool) in pools for r in a.results)]
    claims: list[ResourceClaim] = [
        dataclasses.replace(c, allocation=claimed[c.key])
        if c.allocation is None and c.key in claimed
        else c
        for c in dra.claims
    ]
    return allocate(
        claims,
        node,
        labels,
        Inventory(local[0], inv.classes, (*local[1], *mine)),
        policy=policy or KallotPolicy(),
    )


class DraAllocation:
    """Filter: nodes where the pod's claims can be allocated; Score: the best allocation's
    policy key, ranked among the candidates."""

    name: ClassVar[str] = "DraAllocation"

    def __init__(self, policy: Policy | None = None) -> None:
        # One policy for the filter's summaries, the score's keys and Reserve's allocation.
        self.policy: Policy = policy or KallotPolicy()

    def reserve(self, cycle: Cycle, task: Task, node: int) -> ClaimDecision | str | None:
        """The pod's claim allocations on ``node`` (Reserve), computed once on the state the
        pods placed before it left and kept for the replay (``in_session``), so the pods
        after it see what it holds; the reason when they do not fit there after all."""
        dra = task.k8s.dra if task.k8s is not None else None
        if dra is None:
            return None
        if dra.error:
            return dra.error
        s = cycle.snapshot
        index = self._index(cycle, dra)
        extra, claimed, _ = in_session(cycle, index, self.policy)
        name = s.node_names[node]
        labels_memo = _session_dict(cycle, _LABELS)
        labels = labels_memo.get(node)
        if labels is None:
            labels = labels_memo[node] = node_labels(s, node)
        out = allocate_on(
            dra, name, labels, node_inventory(index, name), extra, claimed, self.policy
        )
        if not out.ok:
            return dra.say(out.reason)
        # Written now, read by the replay: a placement made again on this node after a
        # rollback gets the allocation of the state it is made on, not an older one.
        _session_dict(cycle, _OUTCOMES)[(task.id, node)] = out
        return ClaimDecision(allocations=dict(out.allocations), reserve=tuple(out.reserve_only))

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        s = cycle.snapshot
        n = s.n_nodes
        dra = task.k8s.dra if task.k8s is not None else None
        if dra is None:
            return None  # no claims: nothing to say (an all-True mask cost an AND over N)
        if dra.error:
            return np.zeros(n, dtype=np.bool_)
        memo = cycle.state.get(_CYCLE)
        if memo is None:
            memo = self._summaries(cycle, dra)
            cycle.state.put(_CYCLE, memo)
        out = np.fromiter((memo[r][0] for r in range(n)), dtype=np.bool_, count=n)
        if dra.off_nodes:
            out &= self._on(cycle, dra)
        return out

    @staticmethod
    def _on(cycle: Cycle, dra: PodClaims) -> BOOL:
        """Nodes where a special claim applies (not serving its resources by device plugin)."""
        memo = _session_dict(cycle, _ON)
        hit = memo.get(id(dra.off_nodes))
        if hit is not None and hit[0] is dra.off_nodes:
            return hit[1]
        names = cycle.snapshot.node_names
        on = np.fromiter(
            (name not in dra.off_nodes for name in names), dtype=np.bool_, count=len(names)
        )
        memo[id(dra.off_nodes)] = (dra.off_nodes, on)
        return on

    def _index(self, cycle: Cycle, dra: PodClaims) -> dict[str, NodeInventory]:
        pools_memo = _session_dict(cycle, _POOLS)
        index = pools_memo.get(id(dra.inventory))
        if index is None:
            index = by_node(dra.inventory)
            pools_memo[id(dra.inventory)] = index
        return index

    def _summaries(self, cycle: Cycle, dra: PodClaims) -> dict[int, Summary]:
        s = cycle.snapshot
        index = self._index(cycle, dra)
        extra, claimed, placed = in_session(cycle, index, self.policy)
        labels_memo = _session_dict(cycle, _LABELS)
        # Across sessions when the shell hands a memo (kube.dra.cache), else this session's.
        cache = dra.memo if dra.memo is not None else _session_dict(cycle, _SUMMARY)
        states = _session_dict(cycle, _STATES)
        classes = _session_dict(cycle, _CLASSES)
        text = classes.get(id(dra.inventory))
        if text is None:
            text = classes[id(dra.inventory)] = repr(sorted(dra.inventory.classes.items()))
        sig = _signature(dra, claimed, text)
        # Network-attached pools are shared by every node: any placement changes them.
        everywhere = tuple(t for ids in placed.values() for t in ids) if "" in index else ()
        near = _near(index, extra)
        out: dict[int, Summary] = {}
        for row, name in enumerate(s.node_names):
            labels = labels_memo.get(row)
            if labels is None:
                labels = labels_memo[row] = node_labels(s, row)
            version = (id(dra.inventory), row, placed.get(row, ()), everywhere)
            state = states.get(version)
            local = node_inventory(index, name)
            if state is None:
                state = states[version] = (
                    name,
                    tuple(sorted(labels.items())),
                    _node_state(local, extra),
                )
            key = (sig, state)
            hit = cache.get(key)
            if hit is None:
                mine = extra if near is None else near.get(name, ())
                result = allocate_on(dra, name, labels, local, mine, claimed, self.policy)
                hit = cache[key] = (result.ok, result.key, result.reason)
            out[row] = hit
        return out

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        assert task.k8s is not None and task.k8s.dra is not None
        dra = task.k8s.dra
        if dra.error:
            return (Rejection(dra.error, rejected, unresolvable=True),)
        # The reasons name the claims: the filter's outcomes for this pod in this cycle (the
        # same inputs), computed again only for a row the filter did not see.
        memo = cycle.state.get(_CYCLE) or {}
        index = self._index(cycle, dra)
        extra: list[ClaimAllocation] | None = None
        claimed: dict[str, ClaimAllocation] = {}
        labels_memo = _session_dict(cycle, _LABELS)
        groups: dict[str, BOOL] = {}
        names = cycle.snapshot.node_names
        if dra.off_nodes and dra.extended is not None:
            off = rejected & ~self._on(cycle, dra)
            if off.any():
                groups[
                    f"node advertises {', '.join(sorted(dra.extended.resources))} (device plugin)"
                ] = off
            rejected = rejected & ~off
        for row in np.flatnonzero(rejected):
            name = names[int(row)]
            seen = memo.get(int(row))
            if seen is not None and not seen[0]:
                why = seen[2]
            else:
                if extra is None:
                    extra, claimed, _ = in_session(cycle, index, self.policy)
                labels = labels_memo.get(int(row))
                if labels is None:
                    labels = labels_memo[int(row)] = node_labels(cycle.snapshot, int(row))
                local = node_inventory(index, name)
                why = allocate_on(dra, name, labels, local, extra, claimed, self.policy).reason
            reason = why.replace(f" on node {names[int(row)]}", "")
            reason = dra.say(reason.replace(f" from node {names[int(row)]}", " from the node"))
            mask = groups.setdefault(reason, np.zeros(rejected.size, dtype=np.bool_))
            mask[int(row)] = True
        # Evicting pods does not free claims' devices in this scheduler (no DRA preemption).
        return tuple(Rejection(r, m, unresolvable=True) for r, m in groups.items())

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        dra = task.k8s.dra if task.k8s is not None else None
        if dra is None:
            return None  # no claims: no opinion
        out = np.zeros(candidates.size, dtype=np.float64)
        memo = cycle.state.get(_CYCLE)
        if memo is None:
            return out
        keys = [memo[int(r)][1] for r in candidates]
        ranked = sorted({k for k in keys if k is not None})
        if not ranked:
            return out
        rank = {k: i for i, k in enumerate(ranked)}
        for i, k in enumerate(keys):
            if k is not None:
                out[i] = MAX_SCORE * (1.0 - rank[k] / len(ranked))
        return out


_f: type[FilterPlugin] = DraAllocation
_s: type[ScorePlugin] = DraAllocation
_r: type[ReservePlugin] = DraAllocation
