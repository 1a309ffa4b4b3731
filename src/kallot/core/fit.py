"""Per-GPU feasibility and device assignment for one request: the single source of truth for
"can this GPU take this share", used by the DeviceFit filter, by DeviceScore plugins and by the
property tests' brute-force oracle cross-check.

Rules (docs/design/001-core.md):
- a whole GPU needs an idle, healthy, non-MIG GPU (no clients); it is charged all compute and
  memory and is given exclusively;
- a share needs a TIMESLICE or MPS GPU with enough compute left, enough memory left and a free
  client slot; EXCLUSIVE GPUs take whole requests only;
- MIG requests are handled by core.mig and the MigFit plugin (instances, not slots);
  a share that accepts MIG may be served by one instance too: ``mig_profile_for`` names the
  profile (the smallest that holds the share, ``mig.profile_for_share``), and MigFit weighs it
  against a share slot (``option_key``); ``mig_assignment`` charges one instance: compute ``compute * 1000 // 7`` milli-GPU and memory
  in proportion to its memory slices (``mem_slices * gpu_mem // 8``), so the instances of a
  valid layout never sum to more than the GPU.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kallot.core import mig
from kallot.core.decision import DeviceAssignment, MigInstance
from kallot.core.resources import MILLI, SharingMode
from kallot.core.snapshot import Scratch, Snapshot
from kallot.core.workload import DeviceRequest

BOOL = NDArray[np.bool_]
I64 = NDArray[np.int64]


def model_ok(snapshot: Snapshot, req: DeviceRequest) -> BOOL:
    """[N, G] mask of valid slots whose model the request allows."""
    if not req.models:
        return snapshot.gpu_valid
    codes = snapshot.model_codes(req.models)
    return snapshot.gpu_valid & np.isin(snapshot.gpu_model, codes)


def mode_ok(snapshot: Snapshot, req: DeviceRequest) -> BOOL:
    """[N, G] mask of slots whose sharing mode can serve the request's shape and constraints."""
    return _mode_ok(snapshot.gpu_mode, req)


def _mode_ok(mode: NDArray[np.int8], req: DeviceRequest) -> BOOL:
    if req.whole:
        # Given wholly to one task, any non-MIG GPU is exclusive; the task must accept that.
        if not req.accepts(SharingMode.EXCLUSIVE):
            return np.zeros(mode.shape, dtype=np.bool_)
        return np.asarray(mode != SharingMode.MIG, dtype=np.bool_)
    ok = np.zeros(mode.shape, dtype=np.bool_)
    for m in (SharingMode.TIMESLICE, SharingMode.MPS):
        if req.accepts(m):
            ok |= mode == m
    return ok


def static_ok(snapshot: Snapshot, req: DeviceRequest) -> BOOL:
    """[N, G] read-only mask of the slots that could ever serve ``req`` in this snapshot: valid,
    an allowed model, a mode the request's shape, modes and isolation accept, healthy. It
    depends only on the snapshot's static arrays, so it is computed once per request signature
    and snapshot (on 10,000 nodes it was a third of the per-placement filter cost)."""
    key = ("static_ok", req.whole, req.models, req.modes, req.isolation)
    found = snapshot.memo.get(key)
    if found is None:
        found = model_ok(snapshot, req) & _mode_ok(snapshot.gpu_mode, req) & snapshot.gpu_healthy
        found.setflags(write=False)
        snapshot.memo[key] = found
    return found


def slot_fit(snapshot: Snapshot, scratch: Scratch, req: DeviceRequest) -> BOOL:
    """[N, G] mask: slot (n, g) can take one device of ``req`` right now."""
    return _slot_fit(snapshot, scratch, req, slice(None))


def slot_fit_node(snapshot: Snapshot, scratch: Scratch, req: DeviceRequest, node: int) -> BOOL:
    """[G] mask: the same rule as ``slot_fit`` for the slots of one node."""
    return _slot_fit(snapshot, scratch, req, node)


def slot_fit_rows(
    snapshot: Snapshot, scratch: Scratch, req: DeviceRequest, rows: NDArray[np.intp]
) -> BOOL:
    """[k, G] mask: the same rule as ``slot_fit`` for the node rows ``rows``."""
    return _slot_fit(snapshot, scratch, req, rows)


def _slot_fit(
    snapshot: Snapshot,
    scratch: Scratch,
    req: DeviceRequest,
    rows: slice | int | NDArray[np.intp],
) -> BOOL:
    s, x = snapshot, scratch
    ok = static_ok(s, req)[rows]
    if req.whole:
        return np.asarray(
            ok & (x.gpu_clients[rows] == 0) & (x.gpu_used_milli[rows] == 0), dtype=np.bool_
        )
    left_milli = s.gpu_cap_milli[rows] - x.gpu_used_milli[rows]
    left_mem = s.gpu_cap_mem[rows] - x.gpu_used_mem[rows]
    need_mem = share_memory(s.gpu_mem_mib[rows], req)
    return (
        ok
        & (left_milli >= req.milli)
        & (left_mem >= need_mem)
        & (x.gpu_clients[rows] < s.gpu_max_clients[rows])
    )


def count_per_row(mask: BOOL) -> I64:
    """``mask.sum(axis=1)`` for a 2-D bool mask, fast on the hot path: numpy's bool reduction
    along a short axis costs ~40 ns per element, a popcount of 8 slots as one uint64 ~2 ns."""
    cols = mask.shape[1]
    if cols and cols % 8 == 0:
        packed = np.ascontiguousarray(mask).view(np.uint64)
        counts = np.bitwise_count(packed)
        return counts.sum(axis=1, dtype=np.int64) if cols > 8 else counts[:, 0].astype(np.int64)
    return np.asarray(np.count_nonzero(mask, axis=1), dtype=np.int64)


def share_memory(device_mem: I64, req: DeviceRequest) -> I64:
    """Memory ``req`` takes on devices of ``device_mem`` MiB (vectorized DeviceRequest.memory_for)."""
    if req.whole:
        return device_mem
    if req.mem_mib:
        return np.full_like(device_mem, req.mem_mib)
    return (req.milli * device_mem) // MILLI


def charge(snapshot: Snapshot, node: int, slot: int, req: DeviceRequest) -> tuple[int, int]:
    """(milli, mem_mib) charged to GPU (node, slot) for one device of ``req``."""
    if req.whole:
        return int(snapshot.gpu_cap_milli[node, slot]), int(snapshot.gpu_cap_mem[node, slot])
    return req.milli, req.memory_for(int(snapshot.gpu_mem_mib[node, slot]))


def assign(
    snapshot: Snapshot, node: int, slots: tuple[int, ...], req: DeviceRequest
) -> tuple[DeviceAssignment, ...]:
    """Device assignments for ``req`` on the chosen ``slots`` of ``node``."""
    out = []
    for slot in slots:
        milli, mem = charge(snapshot, node, slot, req)
        mode = (
            SharingMode.EXCLUSIVE if req.whole else SharingMode(int(snapshot.gpu_mode[node, slot]))
        )
        out.append(
            DeviceAssignment(
                slot=slot,
                uuid=snapshot.gpu_uuid[node][slot],
                milli=milli,
                mem_mib=mem,
                mode=mode,
            )
        )
    return tuple(out)


def mig_assignment(
    snapshot: Snapshot, node: int, slot: int, instance: MigInstance
) -> DeviceAssignment:
    """The device for one MIG instance on GPU (node, slot), charged as the module docstring says."""
    model = snapshot.models[int(snapshot.gpu_model[node, slot])]
    p = mig.profile(model, instance.profile)
    if p is None:
        raise ValueError(f"{model} has no MIG profile {instance.profile}")
    mem = int(snapshot.gpu_mem_mib[node, slot]) * p.mem_slices // mig.MEMORY_SLICES
    return DeviceAssignment(
        slot=slot,
        uuid=snapshot.gpu_uuid[node][slot],
        milli=p.milli,
        mem_mib=mem,
        mode=SharingMode.MIG,
        mig=instance,
    )


def may_use_mig(req: DeviceRequest) -> bool:
    """A share (compute and/or memory) that accepts MIG: a MIG instance may serve it."""
    return req.is_fractional and req.accepts(SharingMode.MIG)


def mig_profile_for(req: DeviceRequest, model: str, gpu_mem_mib: int) -> str:
    """The MIG profile that serves ``req`` on a GPU of ``model`` with ``gpu_mem_mib`` MiB, or ''.

    A MIG request: its own profile when the model has it. A share that accepts MIG: the smallest
    profile whose instance memory holds the share's memory on that GPU (``memory_for``: its
    ``mem_mib``, or in proportion to compute) and whose compute ``slices x 1000 // 7`` holds its
    milli (``mig.profile_for_share``). Anything else: ''.
    """
    if req.mig_profile:
        return req.mig_profile if mig.profile(model, req.mig_profile) is not None else ""
    if not may_use_mig(req):
        return ""
    p = mig.profile_for_share(model, req.memory_for(gpu_mem_mib), req.milli)
    return "" if p is None else p.name


def option_key(
    *, opens_gpu: bool, charged: float, needed: float, left_after: float
) -> tuple[int, float, float]:
    """How the core compares the mechanisms that could serve one share (smaller is better):

    1. ``opens_gpu``: the device starts using a GPU that held nothing (a new GPU for the fleet);
    2. waste = ``charged - needed`` in GPU-equivalents (``gpu_equivalents``): what the mechanism
       takes beyond what the share asks (an MPS or time-sliced share: 0; a MIG instance: its
       slices minus the share, a 23 GiB share in a 3g.40gb of an H100-80GB max(428/1000, 4/8)
       - max(100/1000, 23552/81559) = 0.5 - 0.289 = 0.211);
    3. ``left_after``: the fraction of the GPU still free after placing (best fit: fill the
       fullest GPU first).

    Lexicographic, so a share never opens a GPU while some mechanism fits it on one in use, and
    among GPUs in use the least wasteful mechanism wins. Rounded to 1e-6 so that float noise
    never breaks a tie the seeded node order should break.
    """
    return (int(opens_gpu), round(max(0.0, charged - needed), 6), round(left_after, 6))


def gpu_equivalents(device: DeviceAssignment, gpu_mem_mib: int) -> float:
    """One accounting unit for every kind of placement: the larger of the compute share and the
    memory share of the GPU a device takes (a whole GPU 1.0; an MPS client with 250 milli and
    40 of 80 GiB 0.5; a 3g.40gb instance on an A100-80GB max(428/1000, 4/8) = 0.5)."""
    mem = device.mem_mib / gpu_mem_mib if gpu_mem_mib > 0 else 0.0
    return max(device.milli / MILLI, mem)
