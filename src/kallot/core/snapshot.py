"""Cluster state for one session: ``Snapshot`` (read-only arrays) and ``Scratch`` (what a session
writes while it decides).

Layout: structure of arrays in integer units. Node arrays have one row per node ``[N]``. GPUs are
a padded matrix ``[N, G]``: slot ``g`` of node ``n`` is a GPU iff ``gpu_valid[n, g]`` (G is the
largest GPU count of any node). Padding slots have zero capacity, so vectorized plugins can work
on whole matrices without masks in most places. Shells build snapshots with ``SnapshotBuilder``;
nothing mutates a snapshot after ``build()``.

Long module: the Snapshot, its builder and the Scratch with its change log are one layout
(every array of the snapshot has its scratch counterpart, and the builder fills both shapes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kallot.core.decision import DeviceAssignment
from kallot.core.k8s import PlacedPod, Taint
from kallot.core.models import ModelCache
from kallot.core.resources import MILLI, SharingMode
from kallot.core.workload import Task

I64 = NDArray[np.int64]
I32 = NDArray[np.int32]
BOOL = NDArray[np.bool_]

DEFAULT_MAX_PODS = 1 << 20  # "no pod limit" unless a node says otherwise
DEFAULT_MPS_CLIENTS = 48  # CUDA MPS supports 48 clients per GPU on Volta and later


@dataclass(frozen=True, slots=True)
class Labels:
    """Node labels as per-key integer codes: ``codes[key][n]`` is the code of node n's value
    (-1 when the node lacks the key); ``vocab[key]`` maps values to codes.
    """

    codes: Mapping[str, I32]
    vocab: Mapping[str, Mapping[str, int]]
    n: int

    def equals(self, key: str, value: str) -> BOOL:
        """Mask of nodes whose label ``key`` is ``value``."""
        code = self.vocab.get(key, {}).get(value)
        if code is None:
            return np.zeros(self.n, dtype=np.bool_)
        return np.asarray(self.codes[key] == code, dtype=np.bool_)

    def value_of(self, key: str, node: int) -> str | None:
        codes = self.codes.get(key)
        if codes is None or codes[node] < 0:
            return None
        inverse = {c: v for v, c in self.vocab[key].items()}
        return inverse[int(codes[node])]

    def domain(self, key: str) -> I32:
        """Integer domain id per node for topology key ``key`` (-1 = not in any domain)."""
        codes = self.codes.get(key)
        if codes is None:
            return np.full(self.n, -1, dtype=np.int32)
        return codes


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """A task already running (or assumed) on a node, with its devices. Victim candidates."""

    task: Task
    node_row: int
    devices: tuple[DeviceAssignment, ...] = ()
    started: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MigLayout:
    """MIG instances of all MIG-mode GPUs, one row per instance.

    ``node``/``slot`` locate the GPU, ``profile`` indexes ``profiles``, ``start`` is the memory
    slot the instance begins at, ``used`` says whether a task holds it.
    ``Scratch`` copies these rows and may add rows (instances a MIG reconfiguration creates) and
    mark rows dead (instances it destroys); rows of the snapshot keep their index.
    """

    profiles: tuple[str, ...] = ()
    node: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    slot: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    profile: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    start: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    used: BOOL = field(default_factory=lambda: np.zeros(0, np.bool_))


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Point-in-time cluster state. Every array is read-only; row n of node arrays is node n."""

    generation: int = 0
    node_names: tuple[str, ...]
    node_cpu_milli: I64
    node_mem_mib: I64
    node_max_pods: I64
    node_cpu_used: I64
    node_mem_used: I64
    node_pods_used: I64
    node_schedulable: BOOL
    labels: Labels
    models: tuple[str, ...]
    gpu_valid: BOOL  # [N, G]
    gpu_model: I32  # [N, G] index into models, -1 for padding
    gpu_uuid: tuple[tuple[str, ...], ...]  # per node, per valid slot
    gpu_mode: NDArray[np.int8]  # [N, G] SharingMode
    gpu_mem_mib: I64  # [N, G] physical memory
    gpu_cap_milli: I64  # [N, G] schedulable compute (1000, more under time-slice oversubscription)
    gpu_cap_mem: I64  # [N, G] schedulable memory
    gpu_max_clients: I32  # [N, G]
    gpu_used_milli: I64
    gpu_used_mem: I64
    gpu_clients: I32
    gpu_healthy: BOOL
    gpu_numa: I32  # [N, G] NUMA node of the GPU (-1 unknown)
    gpu_island: I32  # [N, G] NVLink island within the node (-1 unknown)
    gpu_link: NDArray[np.int8] | None = None  # [N, G, G] link level (see core.topology), optional
    # [N, G+1] tasks per node by GPU shape: column 0 = GPU shares, column k = tasks with k whole
    # GPUs (GpuClustering's affinity tags). CPU-only tasks are not counted.
    node_shapes: I32 | None = None
    mig: MigLayout = field(default_factory=MigLayout)
    # [N, G] the node can change this MIG GPU's layout (create/destroy idle instances) when a
    # Decision asks; None = no GPU can (static layouts only).
    gpu_mig_dynamic: BOOL | None = None
    running: tuple[Allocation, ...] = ()
    # Per node, the model weights it holds (core.models); empty when no node published a cache.
    node_models: tuple[ModelCache, ...] = ()
    # Kubernetes node and pod facts for the k8s plugins (core.k8s); empty in simulations.
    node_taints: tuple[tuple[Taint, ...], ...] = ()  # per node, () = no node has taints
    node_unschedulable: BOOL | None = None  # spec.unschedulable (cordoned); None = none is
    node_scalars: tuple[Mapping[str, int], ...] = ()  # allocatable of other resources
    placed: tuple[PlacedPod, ...] = ()  # every pod on a node (any scheduler's)
    # Pending pods nominated to a node (status.nominatedNodeName: preemptors waiting for their
    # victims to leave), as (node row, task): their requests are held for them there.
    nominated: tuple[tuple[int, Task], ...] = ()
    # Masks and classes derived from this snapshot's static arrays, memoized by core.fit and
    # core.frag (the arrays are
    # read-only, so a derived mask never goes stale). Not an input: dataclasses.replace() gives
    # the new snapshot a fresh, empty memo.
    memo: dict[object, NDArray[Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_valid.shape[1])

    def node_row(self, name: str) -> int:
        return self.node_names.index(name)

    def gpu_count(self) -> I64:
        return np.asarray(self.gpu_valid.sum(axis=1), dtype=np.int64)

    def total_gpus(self) -> int:
        return int(self.gpu_valid.sum())

    def model_codes(self, models: Iterable[str]) -> I32:
        """Codes of the named models present in this snapshot (unknown names are dropped)."""
        index = {m: i for i, m in enumerate(self.models)}
        return np.array(sorted(index[m] for m in models if m in index), dtype=np.int32)


_NO_ROWS: NDArray[np.intp] = np.zeros(0, dtype=np.intp)
_NO_ROWS.setflags(write=False)


# ``Scratch.changed_since`` over more touches than this (or N/16) compares ``last_touch``
# over the nodes instead of sorting the touches.
LONG_TAIL = 64


@dataclass(slots=True)
class Scratch:
    """The mutable usage arrays one session writes to. Starts as a copy of the snapshot's.

    ``node_version[n]`` increases on every change to node n, so plugins can cache per-node
    derived data and refresh only stale rows (including after a Statement rollback).
    ``changes`` lists the rows in the order they were touched: a cache that was current for
    every node when ``len(changes)`` was ``mark`` refreshes exactly ``changed_since(mark)``,
    O(changes) work instead of comparing ``node_version`` over all N nodes per placement.
    """

    node_cpu_used: I64
    node_mem_used: I64
    node_pods_used: I64
    gpu_used_milli: I64
    gpu_used_mem: I64
    gpu_clients: I32
    mig_used: BOOL
    node_shapes: I32
    node_version: I64
    changes: list[int] = field(default_factory=list)
    # Per node, its position in ``changes`` when last touched (-1: never).
    last_touch: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    # (+1 placed / -1 evicted, node row, task) per allocate and evict, in order; a rollback
    # pops its entries. The k8s plugins replay it to know which pods sit where
    # (core.plugins.k8s_pods).
    pod_log: list[tuple[int, int, Task]] = field(default_factory=list)
    # The session's MIG layout: the snapshot's rows (same index), then rows created by
    # reconfigurations; ``mig_alive`` is False for destroyed rows. Only a Statement writes these.
    mig_node: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    mig_slot: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    mig_profile: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    mig_start: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    mig_alive: BOOL = field(default_factory=lambda: np.zeros(0, np.bool_))
    mig_profiles: list[str] = field(default_factory=list)  # names of mig_profile codes
    # The last ``changed_since`` answer: (mark asked, mark then, rows). Every cache that
    # follows the scratch asks the same question once per placement (the filters' and the
    # scores'), and ``changes`` only grows, so the answer for the same two marks is the same.
    _since: tuple[int, int, NDArray[np.intp]] = (0, 0, _NO_ROWS)

    @staticmethod
    def of(snapshot: Snapshot) -> Scratch:
        mig = snapshot.mig
        return Scratch(
            node_cpu_used=snapshot.node_cpu_used.copy(),
            node_mem_used=snapshot.node_mem_used.copy(),
            node_pods_used=snapshot.node_pods_used.copy(),
            gpu_used_milli=snapshot.gpu_used_milli.copy(),
            gpu_used_mem=snapshot.gpu_used_mem.copy(),
            gpu_clients=snapshot.gpu_clients.copy(),
            mig_used=snapshot.mig.used.copy(),
            node_shapes=(
                snapshot.node_shapes.copy()
                if snapshot.node_shapes is not None
                else np.zeros((snapshot.n_nodes, snapshot.max_gpus + 1), dtype=np.int32)
            ),
            node_version=np.zeros(snapshot.n_nodes, dtype=np.int64),
            last_touch=np.full(snapshot.n_nodes, -1, dtype=np.int64),
            mig_node=mig.node.copy(),
            mig_slot=mig.slot.copy(),
            mig_profile=mig.profile.copy(),
            mig_start=mig.start.copy(),
            mig_alive=np.ones(mig.node.size, dtype=np.bool_),
            mig_profiles=list(mig.profiles),
        )

    def mig_rows(self, node: int, slot: int) -> NDArray[np.intp]:
        """Rows of the live MIG instances of GPU (node, slot)."""
        return np.flatnonzero((self.mig_node == node) & (self.mig_slot == slot) & self.mig_alive)

    def mig_instances(self, node: int, slot: int) -> list[tuple[str, int, bool]]:
        """(profile, start, used) of the live MIG instances of GPU (node, slot)."""
        return [
            (
                self.mig_profiles[int(self.mig_profile[r])],
                int(self.mig_start[r]),
                bool(self.mig_used[r]),
            )
            for r in self.mig_rows(node, slot)
        ]

    def touch(self, node: int) -> None:
        self.node_version[node] += 1
        self.last_touch[node] = len(self.changes)
        self.changes.append(node)

    @property
    def mark(self) -> int:
        """The position in ``changes`` now (pass it to ``changed_since`` later)."""
        return len(self.changes)

    def changed_since(self, mark: int) -> NDArray[np.intp]:
        """Rows touched since ``mark`` (each once, ascending)."""
        now = len(self.changes)
        last = self._since
        if last[0] == mark and last[1] == now:
            return last[2]
        if now - mark > max(LONG_TAIL, self.last_touch.size // 16):
            # A cache asking after many placements (a shape back after a while): one compare
            # over the nodes beats sorting hundreds of touches in Python.
            rows = np.flatnonzero(self.last_touch >= mark)
        else:
            tail = self.changes[mark:]
            if not tail:
                return _NO_ROWS
            # sorted(set()) beats np.unique on the few rows a placement or two touch
            rows = np.array(tail if len(tail) == 1 else sorted(set(tail)), dtype=np.intp)
        rows.setflags(write=False)  # shared by the callers that ask the same question
        self._since = (mark, now, rows)
        return rows


@dataclass(slots=True)
class GpuSpec:
    """Input for one GPU when building a snapshot."""

    model: str
    mem_mib: int
    uuid: str = ""
    mode: SharingMode = SharingMode.MPS
    replicas: int = 1  # time-slice replicas (clients); ignored for other modes
    oversubscription: float = 1.0  # time-slice compute (and memory) oversubscription factor
    max_clients: int = 0  # 0 = mode default
    healthy: bool = True
    numa: int = -1
    island: int = -1
    used_milli: int = 0
    used_mem: int = 0
    clients: int = 0
    # MIG mode: the GPU's instances as (profile, start, used); ``mig_dynamic`` lets the
    # scheduler change the layout. Collected by SnapshotBuilder unless ``mig()`` sets a layout.
    mig: Sequence[tuple[str, int, bool]] = ()
    mig_dynamic: bool = False


@dataclass(slots=True)
class NodeSpec:
    """Input for one node when building a snapshot."""

    name: str
    cpu_milli: int
    mem_mib: int
    gpus: Sequence[GpuSpec] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    max_pods: int = DEFAULT_MAX_PODS
    schedulable: bool = True
    cpu_used: int = 0
    mem_used: int = 0
    pods_used: int = 0
    link: Sequence[Sequence[int]] | None = None  # [G, G] link levels for this node's GPUs
    shapes: Mapping[int, int] = field(default_factory=dict)  # shape column -> running task count
    model_cache: ModelCache | None = None  # model weights on the node (None: unknown / none)
    taints: Sequence[Taint] = ()
    unschedulable: bool = False  # spec.unschedulable (cordoned), distinct from not Ready
    scalars: Mapping[str, int] = field(default_factory=dict)  # other allocatable resources


def _frozen(a: NDArray[np.generic]) -> NDArray[np.generic]:
    a.flags.writeable = False
    return a


class SnapshotBuilder:
    """Collects NodeSpecs (and running allocations) and builds a read-only Snapshot."""

    def __init__(self) -> None:
        self._nodes: list[NodeSpec] = []
        self._running: list[Allocation] = []
        self._mig: MigLayout | None = None

    def add(self, node: NodeSpec) -> SnapshotBuilder:
        self._nodes.append(node)
        return self

    def extend(self, nodes: Iterable[NodeSpec]) -> SnapshotBuilder:
        self._nodes.extend(nodes)
        return self

    def running(self, allocations: Iterable[Allocation]) -> SnapshotBuilder:
        self._running.extend(allocations)
        return self

    def mig(self, layout: MigLayout) -> SnapshotBuilder:
        self._mig = layout
        return self

    def build(self, generation: int = 0) -> Snapshot:
        nodes = self._nodes
        n = len(nodes)
        g = max((len(x.gpus) for x in nodes), default=0)
        models: list[str] = sorted({gpu.model for x in nodes for gpu in x.gpus})
        model_index = {m: i for i, m in enumerate(models)}

        valid = np.zeros((n, g), dtype=np.bool_)
        model = np.full((n, g), -1, dtype=np.int32)
        mode = np.zeros((n, g), dtype=np.int8)
        mem = np.zeros((n, g), dtype=np.int64)
        cap_milli = np.zeros((n, g), dtype=np.int64)
        cap_mem = np.zeros((n, g), dtype=np.int64)
        max_clients = np.zeros((n, g), dtype=np.int32)
        used_milli = np.zeros((n, g), dtype=np.int64)
        used_mem = np.zeros((n, g), dtype=np.int64)
        clients = np.zeros((n, g), dtype=np.int32)
        healthy = np.zeros((n, g), dtype=np.bool_)
        numa = np.full((n, g), -1, dtype=np.int32)
        island = np.full((n, g), -1, dtype=np.int32)
        mig_dynamic = np.zeros((n, g), dtype=np.bool_)
        link: NDArray[np.int8] | None = None
        if any(x.link is not None for x in nodes):
            link = np.full((n, g, g), -1, dtype=np.int8)
        uuids: list[tuple[str, ...]] = []
        for i, node in enumerate(nodes):
            node_uuids = []
            for j, gpu in enumerate(node.gpus):
                valid[i, j] = True
                model[i, j] = model_index[gpu.model]
                mode[i, j] = int(gpu.mode)
                mem[i, j] = gpu.mem_mib
                over = gpu.oversubscription if gpu.mode is SharingMode.TIMESLICE else 1.0
                cap_milli[i, j] = int(MILLI * over)
                cap_mem[i, j] = int(gpu.mem_mib * over)
                max_clients[i, j] = gpu.max_clients or _default_clients(gpu)
                used_milli[i, j] = gpu.used_milli
                used_mem[i, j] = gpu.used_mem
                clients[i, j] = gpu.clients
                healthy[i, j] = gpu.healthy
                numa[i, j] = gpu.numa
                island[i, j] = gpu.island
                mig_dynamic[i, j] = gpu.mig_dynamic and gpu.mode is SharingMode.MIG
                node_uuids.append(gpu.uuid or f"GPU-{node.name}-{j}")
            uuids.append(tuple(node_uuids))
            if link is not None and node.link is not None:
                k = len(node.gpus)
                link[i, :k, :k] = np.asarray(node.link, dtype=np.int8)

        shapes = np.zeros((n, g + 1), dtype=np.int32)
        for i, node in enumerate(nodes):
            for col, count in node.shapes.items():
                shapes[i, min(col, g)] += count

        label_keys = sorted({k for x in nodes for k in x.labels})
        codes: dict[str, I32] = {}
        vocab: dict[str, dict[str, int]] = {}
        for key in label_keys:
            values = sorted({x.labels[key] for x in nodes if key in x.labels})
            vocab[key] = {v: c for c, v in enumerate(values)}
            arr = np.full(n, -1, dtype=np.int32)
            for i, node in enumerate(nodes):
                if key in node.labels:
                    arr[i] = vocab[key][node.labels[key]]
            codes[key] = _frozen(arr)  # type: ignore[assignment]

        def i64(values: Iterable[int]) -> I64:
            return _frozen(np.fromiter(values, dtype=np.int64, count=n))  # type: ignore[return-value]

        return Snapshot(
            generation=generation,
            node_names=tuple(x.name for x in nodes),
            node_cpu_milli=i64(x.cpu_milli for x in nodes),
            node_mem_mib=i64(x.mem_mib for x in nodes),
            node_max_pods=i64(x.max_pods for x in nodes),
            node_cpu_used=i64(x.cpu_used for x in nodes),
            node_mem_used=i64(x.mem_used for x in nodes),
            node_pods_used=i64(x.pods_used for x in nodes),
            node_schedulable=_frozen(  # type: ignore[arg-type]
                np.fromiter((x.schedulable for x in nodes), dtype=np.bool_, count=n)
            ),
            labels=Labels(codes=codes, vocab=vocab, n=n),
            models=tuple(models),
            gpu_valid=_frozen(valid),  # type: ignore[arg-type]
            gpu_model=_frozen(model),  # type: ignore[arg-type]
            gpu_uuid=tuple(uuids),
            gpu_mode=_frozen(mode),  # type: ignore[arg-type]
            gpu_mem_mib=_frozen(mem),  # type: ignore[arg-type]
            gpu_cap_milli=_frozen(cap_milli),  # type: ignore[arg-type]
            gpu_cap_mem=_frozen(cap_mem),  # type: ignore[arg-type]
            gpu_max_clients=_frozen(max_clients),  # type: ignore[arg-type]
            gpu_used_milli=_frozen(used_milli),  # type: ignore[arg-type]
            gpu_used_mem=_frozen(used_mem),  # type: ignore[arg-type]
            gpu_clients=_frozen(clients),  # type: ignore[arg-type]
            gpu_healthy=_frozen(healthy),  # type: ignore[arg-type]
            gpu_numa=_frozen(numa),  # type: ignore[arg-type]
            gpu_island=_frozen(island),  # type: ignore[arg-type]
            gpu_link=None if link is None else _frozen(link),  # type: ignore[arg-type]
            node_shapes=_frozen(shapes),  # type: ignore[arg-type]
            mig=self._mig or _layout_of(nodes),
            gpu_mig_dynamic=_frozen(mig_dynamic) if mig_dynamic.any() else None,  # type: ignore[arg-type]
            running=tuple(self._running),
            node_models=(
                tuple(x.model_cache or ModelCache() for x in nodes)
                if any(x.model_cache is not None for x in nodes)
                else ()
            ),
            node_taints=(
                tuple(tuple(x.taints) for x in nodes) if any(x.taints for x in nodes) else ()
            ),
            node_unschedulable=(
                _frozen(np.fromiter((x.unschedulable for x in nodes), dtype=np.bool_, count=n))  # type: ignore[arg-type]
                if any(x.unschedulable for x in nodes)
                else None
            ),
            node_scalars=(
                tuple(dict(x.scalars) for x in nodes) if any(x.scalars for x in nodes) else ()
            ),
        )


def _layout_of(nodes: Sequence[NodeSpec]) -> MigLayout:
    """The MigLayout of the instances listed in the nodes' GpuSpecs."""
    rows = [
        (i, j, name, start, used)
        for i, node in enumerate(nodes)
        for j, gpu in enumerate(node.gpus)
        for name, start, used in gpu.mig
    ]
    if not rows:
        return MigLayout()
    profiles = tuple(sorted({r[2] for r in rows}))
    return MigLayout(
        profiles=profiles,
        node=_frozen(np.array([r[0] for r in rows], np.int32)),  # type: ignore[arg-type]
        slot=_frozen(np.array([r[1] for r in rows], np.int32)),  # type: ignore[arg-type]
        profile=_frozen(np.array([profiles.index(r[2]) for r in rows], np.int32)),  # type: ignore[arg-type]
        start=_frozen(np.array([r[3] for r in rows], np.int32)),  # type: ignore[arg-type]
        used=_frozen(np.array([r[4] for r in rows], np.bool_)),  # type: ignore[arg-type]
    )


def shape_column(task: Task, max_gpus: int) -> int:
    """Column of ``node_shapes`` for a GPU task: 0 for a share, k for k whole GPUs; -1 if CPU-only."""
    req = task.gpu
    if req is None or req.count == 0:
        return -1
    if req.whole:
        return min(req.count, max_gpus)
    return 0


def _default_clients(gpu: GpuSpec) -> int:
    if gpu.mode is SharingMode.EXCLUSIVE:
        return 1
    if gpu.mode is SharingMode.TIMESLICE:
        return max(1, gpu.replicas)
    if gpu.mode is SharingMode.MIG:
        return 7  # at most 7 instances on every MIG-capable GPU (core.mig)
    return DEFAULT_MPS_CLIENTS
