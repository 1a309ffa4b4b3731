"""Per-GPU feasibility and device assignment for one request: the single source of truth for
"can this GPU take this share", used by the DeviceFit filter, by DeviceScore plugins and by the
property tests' brute-force oracle cross-check.

Rules (docs/design/001-core.md):
- a whole GPU needs an idle, healthy, non-MIG GPU (no clients); it is charged all compute and
  memory and is given exclusively;
- a share needs a TIMESLICE or MPS GPU with enough compute left, enough memory left and a free
  client slot; EXCLUSIVE GPUs take whole requests only;
- MIG requests are handled by core.mig and the MigFit plugin (instances, not slots);
  ``mig_assignment`` charges one instance: compute ``compute * 1000 // 7`` milli-GPU and memory
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
    valid = s.gpu_valid[rows]
    if req.models:
        valid = valid & np.isin(s.gpu_model[rows], s.model_codes(req.models))
    ok = valid & _mode_ok(s.gpu_mode[rows], req) & s.gpu_healthy[rows]
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


def gpu_equivalents(device: DeviceAssignment, gpu_mem_mib: int) -> float:
    """One accounting unit for every kind of placement: the larger of the compute share and the
    memory share of the GPU a device takes (a whole GPU 1.0; an MPS client with 250 milli and
    40 of 80 GiB 0.5; a 3g.40gb instance on an A100-80GB max(428/1000, 4/8) = 0.5)."""
    mem = device.mem_mib / gpu_mem_mib if gpu_mem_mib > 0 else 0.0
    return max(device.milli / MILLI, mem)
