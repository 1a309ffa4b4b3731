"""Dynamic MIG on NVML: create and destroy a GPU instance + compute instance at a placement.

Where it sits: ``draplugin.MigManager`` on a GPU machine (the fake backend implements the same
two calls in memory). This is the only module of the agent that changes a GPU: the DRA driver
calls it in NodePrepareResources for a dynamic MIG device the scheduler allocated, and in
NodeUnprepareResources. The GPU must already be in MIG mode (enabling it needs a GPU reset, an
operator's job). Calls (nvidia-ml-py, k8s-apis.md §4): the profile index whose
``nvmlDeviceGetGpuInstanceProfileInfo(...).id`` is the GI profile id,
``nvmlDeviceCreateGpuInstanceWithPlacement``, one compute instance spanning the GPU instance
(``nvmlGpuInstanceCreateComputeInstance`` with the profile of the GI's slice count), and the MIG
device whose GPU-instance id is the new one, for its UUID. Destroy finds the GPU instance by its
placement start, destroys its compute instances, then it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection
from typing import Any

from kallot.core import mig as core_mig
from kallot.core.errors import KallotError
from kallot.core.resources import canonical_model
from kallot.node.discovery import RawNode

# GPU-instance profile index constants of pynvml, by name (the id is read from NVML).
_GI_PROFILES = (
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
)
# Compute-instance profile index by compute slices.
_CI_PROFILES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMig:
    """``draplugin.MigManager`` on NVML (initialised by the NVML backend, which owns nvmlInit)."""

    def __init__(self) -> None:
        import pynvml

        self._nv: Any = pynvml

    def _gi_profile(self, h: Any, gi_id: int) -> Any:
        nv = self._nv
        for name in _GI_PROFILES:
            index = getattr(nv, name, None)
            if index is None:
                continue
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except nv.NVMLError:
                continue
            if int(info.id) == gi_id:
                return info
        raise KallotError(f"NVML has no GPU-instance profile with id {gi_id} on this GPU")

    def _gpu_instances(self, h: Any, profile_id: int) -> list[Any]:
        nv = self._nv
        arr = (nv.c_nvmlGpuInstance_t * core_mig.MEMORY_SLICES)()
        count = ctypes.c_uint(0)
        nv.nvmlDeviceGetGpuInstances(h, profile_id, arr, ctypes.byref(count))
        return [arr[i] for i in range(count.value)]

    def _compute_instances(self, gi: Any, profile_id: int) -> list[Any]:
        nv = self._nv
        arr = (nv.c_nvmlComputeInstance_t * core_mig.MEMORY_SLICES)()
        count = ctypes.c_uint(0)
        nv.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, ctypes.byref(count))
        return [arr[i] for i in range(count.value)]

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        nv = self._nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(gpu_index)
            model = canonical_model(_text(nv.nvmlDeviceGetName(h)))
            p = core_mig.profile(model, profile)
            if p is None:
                raise KallotError(f"{model} has no MIG profile {profile}")
            info = self._gi_profile(h, p.gi_id)
            placement = nv.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = p.mem_slices
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                getattr(nv, _CI_PROFILES[p.compute]),
                nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nv.NVMLError:
                    continue
                if int(nv.nvmlDeviceGetGpuInstanceId(m)) == gi_id:
                    return _text(nv.nvmlDeviceGetUUID(m))
        except nv.NVMLError as exc:
            raise KallotError(f"NVML: {exc}") from None
        raise KallotError(f"created {profile}@{start} but NVML lists no MIG device for it")

    def destroy_mig(self, gpu_index: int, start: int) -> None:
        nv = self._nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(gpu_index)
            for name in _GI_PROFILES:
                index = getattr(nv, name, None)
                if index is None:
                    continue
                try:
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
                    instances = self._gpu_instances(h, int(info.id))
                except nv.NVMLError:
                    continue
                for gi in instances:
                    if int(nv.nvmlGpuInstanceGetInfo(gi).placement.start) != start:
                        continue
                    for ci_name in _CI_PROFILES.values():
                        try:
                            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                                gi,
                                getattr(nv, ci_name),
                                nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                            )
                            cis = self._compute_instances(gi, int(ci_info.id))
                        except nv.NVMLError:
                            continue
                        for ci in cis:
                            nv.nvmlComputeInstanceDestroy(ci)
                    nv.nvmlGpuInstanceDestroy(gi)
                    return
        except nv.NVMLError as exc:
            raise KallotError(f"NVML: {exc}") from None


def check_placements() -> int:
    """Read-only: for every GPU in MIG mode, NVML's possible placements per GPU-instance profile
    next to the core's (``core.mig``), which the DRA counters are derived from. Prints one line
    per profile; returns the number of profiles whose placements differ (``scripts/gpu-check.sh``
    runs ``python -m kallot.node.nvml_mig``)."""
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        print(f"NVML could not start ({exc}); run this on a GPU machine")
        return 1
    differ = 0
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = nv.nvmlDeviceGetMigMode(h)
            except nv.NVMLError:
                continue
            if current != nv.NVML_DEVICE_MIG_ENABLE:
                print(f"GPU {i}: not in MIG mode (dynamic MIG needs it); skipped")
                continue
            model = canonical_model(_text(nv.nvmlDeviceGetName(h)))
            table = core_mig.PROFILES.get(model, ())
            if not table:
                print(f"GPU {i}: {model} has no MIG table in kallot.core.mig")
                differ += 1
                continue
            for p in table:
                starts: tuple[int, ...] = ()
                for name in _GI_PROFILES:
                    index = getattr(nv, name, None)
                    try:
                        info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
                    except (nv.NVMLError, TypeError):
                        continue
                    if int(info.id) != p.gi_id:
                        continue
                    arr = (nv.c_nvmlGpuInstancePlacement_t * core_mig.MEMORY_SLICES)()
                    count = ctypes.c_uint(core_mig.MEMORY_SLICES)
                    nv.nvmlDeviceGetGpuInstancePossiblePlacements(
                        h, info.id, arr, ctypes.byref(count)
                    )
                    got = [(int(arr[k].start), int(arr[k].size)) for k in range(count.value)]
                    bad = [g for g in got if g[1] != p.mem_slices]
                    starts = tuple(sorted(g[0] for g in got))
                    if bad:
                        starts = (-1,)
                ok = starts == p.starts
                differ += not ok
                print(
                    f"GPU {i} {model} {p.name} (GI {p.gi_id}): NVML {list(starts)} "
                    f"core {list(p.starts)} {'ok' if ok else 'DIFFERENT'}"
                )
    finally:
        nv.nvmlShutdown()
    return differ


def relayout_dry_run(raw: RawNode, busy: Collection[str]) -> list[str]:
    """Read-only: for every GPU in MIG mode, what ``--mig-reconfigure`` would do for one more
    instance of each profile, with the instances in ``busy`` (MIG UUIDs processes run on) kept:
    the target layout and its steps (destroy, create), or why there is none. Nothing is
    changed; ``scripts/gpu-check.sh`` prints these lines (``python -m kallot.node.nvml_mig
    --relayout-dry-run``)."""
    from kallot.node.discovery import mig_profile

    out: list[str] = []
    for g in raw.gpus:
        if not g.mig_enabled:
            continue
        model = canonical_model(g.name)
        current = [(mig_profile(m.name), m.start, m.uuid in busy) for m in g.mig]
        shown = ", ".join(f"{n}@{s}{' (busy)' if u else ''}" for n, s, u in current) or "empty"
        broken = core_mig.valid_layout(model, [(n, s) for n, s, _ in current])
        out.append(f"GPU {g.index} {model}: {shown}" + (f" INVALID: {broken}" if broken else ""))
        for p in core_mig.PROFILES.get(model, ()):
            target = core_mig.relayout(model, current, p.name)
            if target is None:
                out.append(f"  +{p.name}: no layout keeps the busy instances and admits it")
                continue
            destroy, create = core_mig.layout_steps([(n, s) for n, s, _ in current], target)
            steps = [f"destroy {n}@{s}" for n, s in destroy] + [
                f"create {n}@{s}" for n, s in create
            ]
            out.append(f"  +{p.name}: {'; '.join(steps)}")
    return out


def _dry_run() -> int:
    from kallot.node.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except Exception as exc:  # no driver: one line, not a traceback
        print(f"NVML could not start ({exc}); run this on a GPU machine")
        return 1
    try:
        raw = backend.raw()
        busy = {p.uuid for p in backend.processes()}
    finally:
        backend.close()
    for line in relayout_dry_run(raw, busy) or ["no GPU in MIG mode: nothing to re-lay out"]:
        print(line)
    return 0


if __name__ == "__main__":  # pragma: no cover - run on a GPU machine by scripts/gpu-check.sh
    import sys

    if sys.argv[1:] == ["--relayout-dry-run"]:
        raise SystemExit(_dry_run())
    raise SystemExit(1 if check_placements() else 0)
