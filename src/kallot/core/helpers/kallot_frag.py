"""kallot's fragmentation score: FGD's gradient plus three terms FGD cannot see.

Where it sits: below the plugins. The KallotScore plugin (``plugins.kallot_score``, the
``kallot`` profile's score) is this score; the Topology plugin weighs it against locality. The
session calls ``score`` over the feasible nodes and ``choose`` for the GPU of a share on the
chosen node.

The score is FGD's, ``floor(100 * sigmoid(delta / 1000))``, with a richer ``delta`` (milli-GPU;
positive is good):

    delta = dF  +  cpu_weight * dStranded  +  tail_weight * dTail  -  model_weight * Pressure

``dF``: FGD's decrease of the node's expected fragment over the target workload.
``dStranded``: decrease of the node's *CPU-stranded* GPU milli. The target workload's GPU tasks
need ``c`` milli-CPU per milli-GPU on average; a node with ``idle`` milli-GPU and ``cpu`` milli-CPU
free can feed at most ``cpu / c`` of its idle GPU, the rest, ``max(0, idle - cpu / c)``, waits for
CPU that will not come. FGD's per-shape check only sees this once a single typical shape no
longer fits, which is too late: it happily spends a GPU node's CPU on GPU-light tasks.
``dTail``: for a share, the decrease of ``V(free)`` on the chosen GPU, where ``V(l)`` is the
milli a GPU with ``l`` free is expected to leave idle once the cluster is full. FGD's fragment of
a GPU with ``l`` free is ``l * P(share > l)``, one step of look-ahead. Three models of ``V``
(``tail=``):

- ``"lp"`` (the default): the packing LP of the target workload (``core.packing``). If the
  target's GPU requests, in its proportions, exactly filled the cluster, the best packing into
  GPUs prices each share size at what it is worth elsewhere (``pi_s``, the LP's dual); a share
  is worth ``r_s = s - pi_s`` to its host and a GPU with ``l`` free is worth ``U(l)``, the best
  sum of ``r`` that fits in ``l``. ``V(l) = l - U(l)``, so ``V(l) - V(l - s) = pi_s - loss``
  where ``loss = U(l) - U(l - s) - r_s >= 0`` is what the placement costs the best packing: 0
  for a placement that belongs to it, e.g. on openb's default target a 470 on a 530 tail (470 +
  470 is how the optimum pairs them), 175 for a 200 share on a 700 tail that a 700 share should
  have had (``tests/core/test_packing.py``). Weight 12.
- ``"learned"`` (``learned_tail_values``): shapes drawn from the target fill 4,000 simulated
  GPUs, each share on the tightest GPU that takes it, until the request reaches their capacity;
  every move of a GPU from ``l`` free to ``l - s`` free and every GPU left at ``l`` is counted,
  and ``V`` is the value of that Markov chain with its odds *pooled over the levels that admit
  the same shares*: for the class ``C(l)`` of levels where exactly the same target share sizes
  fit (``s_k <= l < s_k+1``),
  ``V(l) = (ends(C) * l + sum_s fills(C, s) * V(l - s)) / (ends(C) + sum_s fills(C, s))``,
  with ``ends(C)`` the GPUs left at a level of ``C`` and ``fills(C, s)`` the moves by a share
  ``s`` from a level of ``C`` (an idle GPU keeps its own odds). Pooling matters because best
  fit's order among tails a share fits equally well in is a tie-break, not a fact about the
  workload (design note 002, section 5.3). Classes never visited take the closed form. Weight 4.
  It was the default until the LP replaced it: the chain knows *scarcity* (with 810 shares
  common and shares of 190 or less rare, a 190 tail stays empty: ``V(190) = 183``), but only
  as best fit experiences it; the LP knows it as the optimum does.
- ``"closed"`` (``tail_values``): ``V(l) = l`` when no target share fits in ``l``, else the
  probability-weighted mean of ``V(l - s)``; it assumes every tail is eventually offered a share
  that fits (``V(190) = 30`` on default). The tests' hand arithmetic uses it. Weight 4.

``Pressure``: for a task that accepts any GPU model, what it takes (milli) times the pressure
of the GPU's model: the share of the target's GPU demand that *only* some models can serve,
split evenly over them, divided by the model's share of the cluster's GPU capacity. A T4 that
20% of the demand insists on, in a fleet where T4s are 14% of the GPUs, has pressure 1.4; a
model nobody insists on has 0. FGD sees a constrained shape only through fragments on the
nodes it may use, so it spends scarce models on tasks that could have gone anywhere.

What was tried and measured, and why the score stays quantized: ``docs/design/002-openb.md``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import frag, packing
from kallot.core.errors import ConfigError
from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.helpers.frag_score import FragScore, frag_deltas_stats
from kallot.core.resources import MILLI, SharingMode
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.workload import Task

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# The middle of a plateau (3-6) on seeds 52..61 of all 8 openb workloads once the LP prices
# the target's whole GPU demand (docs/design/002-openb.md, section 5.5); 1.5 before.
CPU_WEIGHT = 4.0
# Per tail model: the LP's V is 0 on every placement an optimal packing makes and steep off
# it, the learned and closed-form V are smooth; each weight is the middle of its plateau
# (docs/design/002-openb.md, sections 5.2 and 5.4).
TAIL_WEIGHTS = {"lp": 12.0, "learned": 4.0, "closed": 4.0}
# The simulation behind the learned tail values (``learned_tail_values``).
TAIL_SIM_GPUS = 4000
TAIL_SIM_ROUNDS = 3
TAIL_MODELS = ("lp", "learned", "closed")
MODEL_WEIGHT = 1.0


def cpu_per_gpu(inputs: frag.FragInputs) -> float:
    """Milli-CPU per milli-GPU the target workload's GPU shapes ask for (0 if none)."""
    gpu = inputs.gpu_shape
    milli = float((inputs.weight * inputs.milli * inputs.count)[gpu].sum())
    cpu = float((inputs.weight * inputs.cpu)[gpu].sum())
    return cpu / milli if milli > 0 else 0.0


def cpu_scarcity(inputs: frag.FragInputs, snapshot: Snapshot) -> float:
    """``rho``: the CPU the target workload asks for (CPU-only shapes included) at the moment its
    GPU requests reach the cluster's GPU capacity, over the cluster's CPU. From ``rho >= 1`` on,
    the target runs out of CPU before GPU (``plugins.cpu_reserve``). 0 without GPU demand or
    CPU."""
    milli = float((inputs.weight * inputs.milli * inputs.count).sum())
    cpu = float((inputs.weight * inputs.cpu).sum())
    gpus = float(snapshot.gpu_cap_milli[snapshot.gpu_valid].sum())
    total = float(snapshot.node_cpu_milli.sum())
    if milli <= 0 or total <= 0:
        return 0.0
    return gpus / milli * cpu / total


def idle_milli(snapshot: Snapshot, scratch: Scratch, rows: NDArray[np.intp]) -> I64:
    """``[k]`` idle milli-GPU of ``rows`` over the GPUs a share or whole GPU can use (valid,
    healthy, not MIG)."""
    key = ("kallot_frag", "usable")
    usable = snapshot.memo.get(key)
    if usable is None:
        usable = snapshot.gpu_valid & snapshot.gpu_healthy & (snapshot.gpu_mode != SharingMode.MIG)
        snapshot.memo[key] = usable
    free = snapshot.gpu_cap_milli[rows] - scratch.gpu_used_milli[rows]
    return np.asarray(np.where(usable[rows], np.maximum(free, 0), 0).sum(axis=1), dtype=np.int64)


def stranded(idle: F64 | I64, cpu: F64 | I64, ratio: float) -> F64:
    """Idle milli-GPU that the free CPU cannot feed at ``ratio`` milli-CPU per milli-GPU."""
    if ratio <= 0:
        return np.zeros(np.shape(idle), dtype=np.float64)
    return np.asarray(np.maximum(0.0, idle - cpu / ratio), dtype=np.float64)


def model_pressure(inputs: frag.FragInputs, snapshot: Snapshot) -> F64:
    """``[M + 1]`` pressure per snapshot model code (module docstring); the last entry, for the
    padding code -1, is 0."""
    n_models = len(snapshot.models)
    capacity = np.bincount(
        snapshot.gpu_model[snapshot.gpu_valid],
        weights=snapshot.gpu_cap_milli[snapshot.gpu_valid],
        minlength=n_models,
    ).astype(np.float64)
    demand = inputs.weight * inputs.milli * inputs.count
    insisted = np.zeros(n_models, dtype=np.float64)
    for j, shape in enumerate(inputs.target.shapes):
        allowed = np.flatnonzero(inputs.access[:n_models, j])
        if shape.models and shape.gpu_milli > 0 and allowed.size > 0:
            insisted[allowed] += demand[j] / allowed.size
    total, cap = float(demand.sum()), float(capacity.sum())
    pressure = np.zeros(n_models + 1, dtype=np.float64)
    if total > 0 and cap > 0:
        share = capacity / cap
        pressure[:n_models] = np.divide(
            insisted / total, share, out=np.zeros(n_models), where=share > 0
        )
    return pressure


def share_demand(inputs: frag.FragInputs) -> dict[int, float]:
    """The target's GPU requests by size, the demand ``packing.lp_tail_values`` prices: GPUs
    asked for at each per-GPU milli (1000 for whole GPUs), from every task the target was
    learned from (``TargetWorkload.gpu_demand``), else the probability-weighted count over its
    shapes."""
    if inputs.target.gpu_demand:
        return dict(inputs.target.gpu_demand)
    gpu = inputs.gpu_shape
    demand: dict[int, float] = {}
    sizes = np.minimum(inputs.milli[gpu], MILLI).tolist()
    counts = np.maximum(inputs.count[gpu], 1).tolist()
    for size, count, weight in zip(sizes, counts, inputs.weight[gpu].tolist(), strict=True):
        demand[size] = demand.get(size, 0.0) + weight * count
    return demand


def tail_values(inputs: frag.FragInputs) -> F64:
    """``V[l]`` for ``l = 0..1000`` free milli on one GPU (module docstring)."""
    gpu = inputs.gpu_shape
    sizes = np.minimum(inputs.milli[gpu], MILLI)
    weight = inputs.weight[gpu]
    v = np.zeros(MILLI + 1, dtype=np.float64)
    for free in range(1, MILLI + 1):
        fits = sizes <= free
        w = weight[fits]
        v[free] = free if w.size == 0 else float((w * v[free - sizes[fits]]).sum() / w.sum())
    return v


def learned_tail_values(
    inputs: frag.FragInputs,
    *,
    gpus: int = TAIL_SIM_GPUS,
    rounds: int = TAIL_SIM_ROUNDS,
    seed: int = 0,
    pooled: bool = True,
) -> F64:
    """``V[l]`` for ``l = 0..1000``, learned by filling ``gpus`` simulated GPUs with the target
    workload's GPU shapes (module docstring). Deterministic for a given target and ``seed``.

    Each round draws shapes with the target's probabilities until their GPU request reaches
    ``gpus * 1000``: a share goes to the GPU with the least free milli that takes it (best fit),
    a k-GPU shape to k idle GPUs; a shape that fits nowhere is dropped. ``pooled`` (the
    default) pools the chain's odds over the levels that admit the same share sizes (module
    docstring); without it each level keeps its own odds (the first version, kept for
    comparison). Levels (classes) never visited take ``tail_values`` (the closed form).
    """
    prior = tail_values(inputs)
    gpu = inputs.gpu_shape
    sizes = np.minimum(inputs.milli[gpu], MILLI)
    counts = np.maximum(inputs.count[gpu], 1)
    weight = inputs.weight[gpu]
    if weight.size == 0 or weight.sum() <= 0:
        return prior
    p = weight / weight.sum()
    mean = float((p * sizes * counts).sum())
    budget = gpus * MILLI
    rng = np.random.default_rng(seed)
    moves = np.zeros((MILLI + 1, MILLI + 1), dtype=np.float64)  # [from, to] free milli
    ends = np.zeros(MILLI + 1, dtype=np.float64)
    for _ in range(rounds):
        level = np.zeros(MILLI + 1, dtype=np.int64)  # GPUs per free-milli level
        level[MILLI] = gpus
        arrived = 0
        for j in rng.choice(p.size, size=int(2 * budget / mean) + 10, p=p):
            size, k = int(sizes[j]), int(counts[j])
            arrived += size * k
            if arrived > budget:
                break
            if k == 1 and size < MILLI:
                room = np.flatnonzero(level[size:])
                if room.size == 0:
                    continue
                free = size + int(room[0])
            elif level[MILLI] >= k:
                free = MILLI
            else:
                continue
            level[free] -= k
            level[free - size] += k
            moves[free, free - size] += k
        ends += level
    if pooled:
        return _pooled_values(moves, ends, sizes, prior)
    v = np.zeros(MILLI + 1, dtype=np.float64)
    seen = moves.sum(axis=1) + ends
    for free in range(1, MILLI + 1):
        if seen[free] > 0:
            v[free] = (ends[free] * free + float(moves[free, :free] @ v[:free])) / seen[free]
        else:
            v[free] = prior[free]
    return v


def _pooled_values(moves: F64, ends: F64, sizes: I64, prior: F64) -> F64:
    """``V`` from the fill's counts with the odds pooled over each class of levels that admit
    the same share sizes (module docstring): ``stays[c]`` GPUs left at a level of class ``c``,
    ``fills[c, k]`` moves by share ``shares[k]`` out of it. Class ``c`` is the levels where
    exactly ``shares[:c]`` fit; an idle GPU (1000 free) keeps its own odds."""
    shares = np.unique(sizes[(sizes > 0) & (sizes < MILLI)])
    levels = np.arange(MILLI + 1)
    cls = np.searchsorted(shares, levels, side="right")  # how many share sizes fit in l
    n_cls = int(shares.size) + 1
    fills = np.zeros((n_cls, int(shares.size)), dtype=np.float64)
    stays = np.zeros(n_cls, dtype=np.float64)
    idx = {int(s): i for i, s in enumerate(shares)}
    frm, to = np.nonzero(moves)
    for f, t in zip(frm.tolist(), to.tolist(), strict=True):
        i = idx.get(f - t)
        if i is not None and f < MILLI:
            fills[cls[f], i] += moves[f, t]
    np.add.at(stays, cls[:MILLI], ends[:MILLI])
    v = np.zeros(MILLI + 1, dtype=np.float64)
    seen_c = stays + fills.sum(axis=1)
    seen_l = moves.sum(axis=1) + ends
    for free in range(1, MILLI + 1):
        c = int(cls[free])
        if free == MILLI:
            if seen_l[free] > 0:
                v[free] = (ends[free] * free + float(moves[free, :free] @ v[:free])) / seen_l[free]
            else:
                v[free] = prior[free]
        elif seen_c[c] > 0:
            after = free - shares[:c]  # shares[:c] fit in ``free``
            v[free] = (stays[c] * free + float(fills[c, :c] @ v[after])) / seen_c[c]
        else:
            v[free] = prior[free]
    return v


class KallotFrag(FragScore):
    """Args: ``target`` (TargetWorkload; learned when absent), ``cpu_weight`` (4),
    ``tail_weight`` (12 for the "lp" tail, 4 for the others), ``model_weight`` (1.0), ``tail``
    ("lp", "learned" or "closed"), ``quantize`` (true)."""

    name: ClassVar[str] = "KallotScore"

    def __init__(
        self,
        target: frag.TargetWorkload | None = None,
        *,
        cpu_weight: float = CPU_WEIGHT,
        tail_weight: float | None = None,
        model_weight: float = MODEL_WEIGHT,
        tail: str = "lp",
        quantize: bool = True,
    ) -> None:
        super().__init__(target, quantize=quantize)
        if tail not in TAIL_MODELS:
            raise ConfigError("KallotScore args.tail", tail, f"one of {', '.join(TAIL_MODELS)}")
        self._tail = tail
        self._cpu_weight = cpu_weight
        self._tail_weight = TAIL_WEIGHTS[tail] if tail_weight is None else tail_weight
        self._model_weight = model_weight
        self._pressure_key: StateKey[F64] = StateKey(f"{self.name}/pressure")
        # The terms depend only on the target workload: cached across sessions (a live
        # scheduler runs thousands of sessions with one configured target).
        self._terms: tuple[frag.TargetWorkload, float, F64] | None = None
        # The LP's values by the demand they price: a target learned from running and pending
        # pods is a new object every session, but a bind moves a pod from pending to running
        # and leaves the demand as it was: a session after which no pod arrived or left
        # solves no LP.
        self._lp: tuple[tuple[tuple[int, float], ...], F64] | None = None

    def terms(self, view: frag.FragView) -> tuple[float, F64]:
        """``(c, V)`` for the view's target workload."""
        inputs = view.inputs
        if self._terms is None or self._terms[0] is not inputs.target:
            demand = inputs.target.gpu_demand
            if self._tail == "lp" and demand and self._lp is not None and self._lp[0] == demand:
                values = self._lp[1]
            elif self._tail == "lp":
                values = packing.lp_tail_values(share_demand(inputs))
                self._lp = (demand, values) if demand else None
            elif self._tail == "learned":
                values = learned_tail_values(inputs)
            else:
                values = tail_values(inputs)
            self._terms = (inputs.target, cpu_per_gpu(inputs), values)
        return self._terms[1], self._terms[2]

    def deltas(
        self, cycle: Cycle, task: Task, rows: NDArray[np.intp]
    ) -> tuple[F64, NDArray[np.bool_] | None]:
        """``delta`` (module docstring) for ``task`` on ``rows``: ``[k, G]`` for a share (with
        the mask of GPUs that can take it), else ``[k]`` with None."""
        view = self.view(cycle)
        delta, slots, st, left = frag_deltas_stats(cycle, view, task, rows)
        ratio, values = self.terms(view)
        # The rows' idle milli, free CPU and free milli as ``frag_deltas`` just read them
        # (current: refreshed in that call), not gathered or recomputed again.
        idle, cpu = st.idle, st.cpu_left
        gained = stranded(idle, cpu, ratio) - stranded(
            idle - task.gpu_milli_total, cpu - task.cpu_milli, ratio
        )
        req = task.gpu
        models = cycle.snapshot.gpu_model[rows]
        if slots is None:
            delta = delta + self._cpu_weight * gained
            if req is not None and not req.models and self._model_weight:
                pressure = self.pressure(view, cycle)[models[:, 0]]
                delta = delta - self._model_weight * pressure * task.gpu_milli_total
            return delta, None
        assert req is not None  # a share
        # np.clip's values without its Python wrappers (integers: the same numbers)
        free = np.minimum(np.maximum(left, 0), MILLI)
        after = np.minimum(np.maximum(free - req.milli, 0), MILLI)
        delta = (
            delta
            + self._cpu_weight * gained[:, None]
            + self._tail_weight * (values[free] - values[after])
        )
        if not req.models and self._model_weight:
            delta = delta - self._model_weight * self.pressure(view, cycle)[models] * req.milli
        return delta, slots

    def pressure(self, view: frag.FragView, cycle: Cycle) -> F64:
        """Per-session model pressure (depends on the snapshot's GPUs)."""
        pressure = cycle.session.get(self._pressure_key)
        if pressure is None:
            pressure = model_pressure(view.inputs, cycle.snapshot)
            cycle.session.put(self._pressure_key, pressure)
        return pressure
