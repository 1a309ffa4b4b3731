"""bench/dra.py's claim/pod sequence without a control plane: where the unallocated GPU goes.

The same cluster and sequence as ``bench/dra.py`` (``dra.arrivals``: openb default trace, cut
where requested GPUs reach capacity; 8 consumable-capacity GPUs of 80Gi per node, 128 CPUs,
1 TiB), replayed pod by pod, in arrival order, through three placers:

- ``kallot-dra``: kallot's core session with the pods as DRA tasks (``PodInfo.dra``), profile
  ``kallot``: the live scheduler's decision path (``core.plugins.dra_fit``) without the API;
- ``first-fit-dra``: an emulation of kube-scheduler v1.36 on the same claims: nodes where the
  claim fits (``FirstFit``: first device in slice order) and CPU/memory fit, scored by its
  default NodeResourcesFit (LeastAllocated, cpu and memory) + NodeResourcesBalancedAllocation,
  ties broken at random (seeded);
- ``kallot-dp``: kallot's core on the same pods as device-plugin pods (MPS GPUs of 80 GiB,
  ``milli`` shares): what the core policy achieves on this sequence.

Per placer: unallocated GPU % at the end (failed pods' GPUs plus the holes they did not fit),
the pods not placed (whole / shares), GPUs partly used, and the free GPU memory stranded on
nodes whose CPU is gone. Fast (seconds): for analysis across many seeds and sizes; the numbers
to report are ``bench/dra.py``'s (the real kube-scheduler).

    .venv/bin/python bench/dra_offline.py --nodes 16 --seeds 1..10 [--placers kallot-dra,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from kallot.config import presets
from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core import k8s, policies
from kallot.core.dra.allocator import Inventory, allocate
from kallot.core.dra.model import ClaimAllocation, assemble_pools
from kallot.core.dra.pod import PodClaims
from kallot.core.dra.policy import FirstFit, KallotPolicy
from kallot.core.framework.runner import Framework
from kallot.core.resources import SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.testing.dra import nvidia_classes, nvidia_node_slices

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dra import GPU_MEMORY, GPUS_PER_NODE, Arrival, _claim, arrivals, packing_bound

CPU, MEM = 128_000, 1024 * 1024
GPU_MIB = 80 * 1024


@dataclasses.dataclass(slots=True)
class Outcome:
    placer: str
    unallocated_pct: float
    failed_whole: int
    failed_share: int
    partial_gpus: int
    stranded_gpus: float  # free GPU (in GPUs) on nodes with < 1 CPU core left
    digest: str = ""  # every placement and allocation in order (decisions compared by it)


def digest(placed: Sequence[tuple[str, str]], allocs: Sequence[ClaimAllocation]) -> str:
    """A hash of every pod's node and every allocation's devices and consumed capacity, in
    order: two runs made the same decisions iff their digests are equal."""
    h = hashlib.sha256()
    for pod, node in placed:
        h.update(f"P {pod} {node}\n".encode())
    for alloc in allocs:
        for r in alloc.results:
            consumed = sorted((k, str(v)) for k, v in r.consumed.items())
            h.update(
                f"A {r.request} {r.driver}/{r.pool}/{r.device} {r.share_id} {consumed}\n".encode()
            )
        h.update(f"S {alloc.node_selector!r}\n".encode())
    return h.hexdigest()[:16]


def _names(nodes: int) -> list[str]:
    return [f"n{i:02d}" for i in range(nodes)]


def inventory(nodes: int) -> Inventory:
    slices = [s for n in _names(nodes) for s in nvidia_node_slices(n, gpus=0, shared=GPUS_PER_NODE)]
    pools, skipped = assemble_pools([slice_from_json(s) for s in slices])
    assert not skipped
    classes = {c.name: c for c in map(device_class_from_json, nvidia_classes())}
    return Inventory(tuple(pools), classes, ())


def _summary(
    placer: str,
    seq: Sequence[Arrival],
    nodes: int,
    placed: dict[str, str],
    used: dict[tuple[str, str], Fraction],
) -> Outcome:
    total = nodes * GPUS_PER_NODE
    allocated = sum(used.values(), Fraction(0)) / GPU_MEMORY
    cpu = dict.fromkeys(_names(nodes), 0)
    for a in seq:
        if a.name in placed:
            cpu[placed[a.name]] += a.cpu_milli
    stranded = Fraction(0)
    for n in _names(nodes):
        if CPU - cpu[n] < 1000:
            free = sum(GPU_MEMORY - used.get((n, f"gpu-{g}"), Fraction(0)) for g in range(8))
            stranded += free / GPU_MEMORY
    failed = [a for a in seq if a.name not in placed]
    return Outcome(
        placer,
        float(100 * (1 - allocated / total)),
        sum(1 for a in failed if not a.share_gib),
        sum(1 for a in failed if a.share_gib),
        sum(1 for u in used.values() if 0 < u < GPU_MEMORY),
        float(stranded),
    )


def _usage(allocs: Sequence[ClaimAllocation]) -> dict[tuple[str, str], Fraction]:
    used: dict[tuple[str, str], Fraction] = {}
    for alloc in allocs:
        for r in alloc.results:
            mem = next((v for k, v in r.consumed.items() if k.endswith("memory")), GPU_MEMORY)
            used[(r.pool, r.device)] = used.get((r.pool, r.device), Fraction(0)) + mem
    return used


def kallot_dra(seq: Sequence[Arrival], nodes: int, seed: int) -> Outcome:
    inv = inventory(nodes)
    tasks = []
    for i, a in enumerate(seq):
        c = claim_from_json(_claim(a))
        info = k8s.PodInfo(namespace="default", dra=PodClaims((c,), inv))
        tasks.append(
            Task(id=a.name, cpu_milli=a.cpu_milli, mem_mib=a.mem_mib, created=float(i), k8s=info)
        )
    b = SnapshotBuilder()
    for n in _names(nodes):
        b.add(NodeSpec(name=n, cpu_milli=CPU, mem_mib=MEM, gpus=[], max_pods=1000))
    sched = Scheduler(Framework(presets.profile("kallot"), policies.builtin_registry()))
    decision = sched.run_session(b.build(), tasks, now=0.0, rng=np.random.default_rng(seed))
    placed = {p.task_id: p.node for p in decision.placements}
    # The allocations the shell would write: each placed pod's claims on its node, in order.
    allocs: list[ClaimAllocation] = []
    by_id = {t.id: t for t in tasks}
    for p in decision.placements:
        t = by_id[p.task_id]
        assert t.k8s is not None and t.k8s.dra is not None
        out = allocate(
            list(t.k8s.dra.claims),
            p.node,
            {},
            dataclasses.replace(inv, allocated=tuple(allocs)),
            policy=KallotPolicy(),
        )
        assert out.ok, out.reason
        allocs.extend(out.allocations.values())
    result = _summary("kallot-dra", seq, nodes, placed, _usage(allocs))
    result.digest = digest([(p.task_id, p.node) for p in decision.placements], allocs)
    return result


def first_fit_dra(seq: Sequence[Arrival], nodes: int, seed: int) -> Outcome:
    """kube-scheduler's default scoring (LeastAllocated + BalancedAllocation on cpu and memory,
    equal weights) and its first-fit device choice; ties at random."""
    rng = np.random.default_rng(seed)
    inv = inventory(nodes)
    names = _names(nodes)
    cpu = dict.fromkeys(names, 0)
    mem = dict.fromkeys(names, 0)
    allocs: list[ClaimAllocation] = []
    placed: dict[str, str] = {}
    for a in seq:
        c = claim_from_json(_claim(a))
        best: list[tuple[float, str, ClaimAllocation]] = []
        for n in names:
            if cpu[n] + a.cpu_milli > CPU or mem[n] + a.mem_mib > MEM:
                continue
            out = allocate(
                [c], n, {}, dataclasses.replace(inv, allocated=tuple(allocs)), policy=FirstFit()
            )
            if not out.ok:
                continue
            fc, fm = (cpu[n] + a.cpu_milli) / CPU, (mem[n] + a.mem_mib) / MEM
            least = ((1 - fc) + (1 - fm)) / 2 * 100
            balanced = (1 - abs(fc - fm) / 2) * 100
            score = float(int(least) + int(balanced))
            best.append((score, n, next(iter(out.allocations.values()))))
        if not best:
            continue
        top = max(s for s, _, _ in best)
        ties = [x for x in best if x[0] == top]
        _, n, alloc = ties[int(rng.integers(len(ties)))]
        placed[a.name] = n
        cpu[n] += a.cpu_milli
        mem[n] += a.mem_mib
        allocs.append(alloc)
    result = _summary("first-fit-dra", seq, nodes, placed, _usage(allocs))
    result.digest = digest(list(placed.items()), allocs)
    return result


def kallot_dp(seq: Sequence[Arrival], nodes: int, seed: int) -> Outcome:
    b = SnapshotBuilder()
    for n in _names(nodes):
        gpus = [
            GpuSpec(
                model="H100-80GB",
                mem_mib=GPU_MIB,
                uuid=f"{n}-{g}",
                mode=SharingMode.MPS,
                max_clients=1000,
            )
            for g in range(GPUS_PER_NODE)
        ]
        b.add(NodeSpec(name=n, cpu_milli=CPU, mem_mib=MEM, gpus=gpus, max_pods=1000))
    tasks = []
    for i, a in enumerate(seq):
        milli = 1000 if not a.share_gib else a.share_gib * 1000 // 80
        tasks.append(
            Task(
                id=a.name,
                cpu_milli=a.cpu_milli,
                mem_mib=a.mem_mib,
                gpu=DeviceRequest(count=a.count, milli=milli),
                created=float(i),
            )
        )
    sched = Scheduler(Framework(presets.profile("kallot"), policies.builtin_registry()))
    decision = sched.run_session(b.build(), tasks, now=0.0, rng=np.random.default_rng(seed))
    placed = {p.task_id: p.node for p in decision.placements}
    by_id = {a.name: a for a in seq}
    used: dict[tuple[str, str], Fraction] = {}
    for p in decision.placements:
        a = by_id[p.task_id]
        for d in p.devices:
            key = (p.node, f"gpu-{d.slot}")
            amount = GPU_MEMORY if not a.share_gib else Fraction(a.share_gib * 2**30)
            used[key] = used.get(key, Fraction(0)) + amount
    return _summary("kallot-dp", seq, nodes, placed, used)


PLACERS: dict[str, Callable[[Sequence[Arrival], int, int], Outcome]] = {
    "first-fit-dra": first_fit_dra,
    "kallot-dra": kallot_dra,
    "kallot-dp": kallot_dp,
}


def _seeds(text: str) -> list[int]:
    if ".." in text:
        lo, hi = text.split("..")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seeds", default="42,7")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--placers", default=",".join(PLACERS))
    args = parser.parse_args()
    placers = args.placers.split(",")
    got: dict[str, list[float]] = {p: [] for p in placers}
    for seed in _seeds(args.seeds):
        seq = arrivals(args.workload, args.nodes, seed)
        demand = sum(a.count if not a.share_gib else a.share_gib / 80 for a in seq)
        bound = packing_bound(seq, args.nodes)
        got.setdefault("bound", []).append(bound)
        print(
            f"seed {seed}: {len(seq)} pods, demand {demand:.2f} of {args.nodes * GPUS_PER_NODE} "
            f"GPUs, packing bound: unallocated >= {bound:.2f}%",
            flush=True,
        )
        for name in placers:
            t0 = time.process_time()
            o = PLACERS[name](seq, args.nodes, seed)
            cpu = time.process_time() - t0
            got[name].append(o.unallocated_pct)
            print(
                f"  {name:14s} unallocated {o.unallocated_pct:5.2f}%  failed whole {o.failed_whole} "
                f"shares {o.failed_share}  partial GPUs {o.partial_gpus}  "
                f"stranded (no CPU) {o.stranded_gpus:.2f} GPUs  cpu {cpu:.2f}s"
                + (f"  digest {o.digest}" if o.digest else ""),
                flush=True,
            )
    for name, xs in got.items():
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        print(f"{name:14s} mean {statistics.mean(xs):5.2f}%  sd {sd:4.2f}  over {len(xs)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
