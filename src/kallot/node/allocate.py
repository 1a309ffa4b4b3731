"""What the device plugin advertises, and how Allocate turns the scheduler's device record into
a container's devices. Pure: no gRPC, no Kubernetes client; table-tested.

Device IDs (what the kubelet counts, one plugin per resource):

| resource | one ID per | ID |
|---|---|---|
| ``nvidia.com/gpu`` | non-MIG GPU | the GPU UUID, ``GPU-5a3c...`` |
| ``kallot.io/gpu-milli`` | milli-GPU of a GPU in ``mps`` or ``time-slicing`` mode (1000 per GPU, 1000 x oversubscription when time-sliced) | ``<GPU UUID>::<k>`` |
| ``kallot.io/gpu-milli`` | milli-GPU of an existing MIG instance (its compute, ``slices x 1000 // 7``: 3g 428) | ``<MIG UUID>::<k>`` |
| ``nvidia.com/mig-<profile>`` | existing MIG instance of that profile | the MIG UUID, ``MIG-...`` |

A MIG instance is advertised twice, as one ``nvidia.com/mig-<profile>`` and as its milli-GPUs,
because the scheduler may put either a MIG request or a share on it (``core.fit``: a share that
accepts MIG may run on the smallest instance that holds it). The kubelet counts the two
resources independently; what keeps one instance to one pod is the scheduler's device records
(it never records one instance for two pods), and Allocate hands out only what a record says.

The kubelet's AllocateRequest carries only these IDs. Allocate finds the pod being admitted by
its device record: among the pods bound to this node (not finished), the one whose record, read
as the same IDs (its *footprint*: GPU UUID -> units), equals the request. No record, several
different ones, or a record written for another node: Allocate fails and names what was asked
and what was found; it never guesses. GetPreferredAllocation steers the kubelet to the
recorded devices, so the footprint matches; without a record it ranks GPU sets with the core's
topology ranking (``core.topology.rank_gpu_sets``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from kallot.config import record_trust, wire
from kallot.config.device_record import DeviceRecord, RecordDevice
from kallot.config.inventory import Device, MigDevice, NodeInventory
from kallot.core import mig as core_mig
from kallot.core import topology
from kallot.core.errors import KallotError

RESOURCE_GPU = wire.RESOURCE_GPU
RESOURCE_MILLI = wire.RESOURCE_GPU_MILLI
RESOURCE_MIG_PREFIX = wire.RESOURCE_MIG_PREFIX
MILLI = 1000
SHARED_MODES = record_trust.SHARED_MODES
REPLICA_SEP = "::"


class AllocationError(KallotError):
    """Allocate cannot hand out devices: the message says what was asked and what was found."""


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    """One device ID as ListAndWatch sends it."""

    id: str
    uuid: str  # the physical GPU (or MIG instance) it stands for
    healthy: bool
    numa: int


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod bound to this node, with its device record as the scheduler wrote it.

    ``record`` is None when the pod has no (or an unreadable: ``error``) record.
    ``allocated``: the agent already handed its devices out (``kallot.io/bind-phase``).
    """

    namespace: str
    name: str
    uid: str
    record: DeviceRecord | None
    allocated: bool = False
    bind_time: int = 0
    error: str = ""
    # The pod's kallot.io/gpu-milli request (summed over containers as the scheduler sums it);
    # 0 when it asks none. A MIG device in the record of a pod that asks milli-GPUs is a share
    # placed on that instance: it is handed out under kallot.io/gpu-milli.
    milli: int = 0
    # The workload the pod belongs to, "Kind/name" (k8s.pod_owner: a ReplicaSet's pods count as
    # its Deployment's); "" for a bare pod. Per-pod metrics carry it for the waste report.
    owner: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Grant:
    """What one container gets: the proto's ContainerAllocateResponse as plain data."""

    envs: dict[str, str]
    cdi_devices: tuple[str, ...]
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container path, host path, read only)
    annotations: dict[str, str] = field(default_factory=dict)


def mig_resource(profile: str) -> str:
    return RESOURCE_MIG_PREFIX + profile


def milli_capacity(mode: str, oversubscription: float) -> int:
    """Milli-GPU IDs a shared GPU advertises (the core's ``gpu_cap_milli``)."""
    return int(MILLI * oversubscription) if mode == "time-slicing" else MILLI


def instance_id(gpu: Device, m: MigDevice) -> str:
    """The ID of a MIG instance: its MIG UUID (``<GPU UUID>::mig<start>`` when NVML gave none)."""
    return m.uuid or f"{gpu.uuid}{REPLICA_SEP}mig{m.start}"


def mig_milli(gpu: Device, m: MigDevice) -> int:
    """A MIG instance's compute in milli-GPU, as the scheduler charges it
    (``core.mig.MigProfile.milli``: compute slices x 1000 // 7; 1g 142, 3g 428, 7g 1000)."""
    p = core_mig.profile(gpu.model, m.profile)
    if p is not None:
        return p.milli
    head = m.profile.split("g.", 1)[0]
    return int(head) * MILLI // core_mig.COMPUTE_SLICES if head.isdigit() else 0


def mig_mem_mib(gpu: Device, m: MigDevice) -> int:
    """A MIG instance's memory as the scheduler charges it (``core.fit.mig_assignment``:
    the GPU's memory x memory slices // 8)."""
    p = core_mig.profile(gpu.model, m.profile)
    return gpu.mem_mib * p.mem_slices // core_mig.MEMORY_SLICES if p is not None else 0


def advertised(
    inv: NodeInventory, unhealthy: AbstractSet[str] = frozenset()
) -> dict[str, list[AdvertisedDevice]]:
    """Device IDs per resource for ``inv``; a device is Unhealthy if the inventory says so or its
    UUID (or its parent GPU's) is in ``unhealthy``. Resources with no device are left out."""
    out: dict[str, list[AdvertisedDevice]] = {}
    for d in sorted(inv.devices, key=lambda d: d.index):
        ok = d.healthy and d.uuid not in unhealthy
        if d.mode == "mig":
            for m in d.mig:
                mid = instance_id(d, m)
                healthy = ok and mid not in unhealthy
                out.setdefault(mig_resource(m.profile), []).append(
                    AdvertisedDevice(mid, mid, healthy, d.numa)
                )
                # The same instance as milli-GPUs, for a share the scheduler placed on it.
                ids = out.setdefault(RESOURCE_MILLI, [])
                for k in range(mig_milli(d, m)):
                    ids.append(AdvertisedDevice(f"{mid}{REPLICA_SEP}{k}", mid, healthy, d.numa))
            continue
        out.setdefault(RESOURCE_GPU, []).append(AdvertisedDevice(d.uuid, d.uuid, ok, d.numa))
        if d.mode in SHARED_MODES:
            ids = out.setdefault(RESOURCE_MILLI, [])
            for k in range(milli_capacity(d.mode, d.oversubscription)):
                ids.append(AdvertisedDevice(f"{d.uuid}{REPLICA_SEP}{k}", d.uuid, ok, d.numa))
    return out


def physical(device_id: str) -> str:
    """The GPU (or MIG instance) a device ID stands for: the ID without its ``::<k>`` unit
    number (``GPU-x::7`` -> ``GPU-x``, ``MIG-y::7`` -> ``MIG-y``, ``GPU-x::mig4`` stays)."""
    head, sep, tail = device_id.rpartition(REPLICA_SEP)
    return head if sep and tail.isdigit() else device_id


def request_footprint(ids: Sequence[str]) -> Counter[str]:
    """UUID -> units asked: one per ID (a whole GPU, a MIG instance, or one milli-GPU)."""
    return Counter(physical(i) for i in ids)


def _mig_instance(inv: NodeInventory, dev: RecordDevice) -> tuple[Device, MigDevice] | None:
    """The node's MIG instance a record device names (GPU UUID + profile + start), or None."""
    if dev.mig is None:
        return None
    for d in inv.devices:
        if d.uuid == dev.uuid:
            for m in d.mig:
                if m.start == dev.mig.start and m.profile == dev.mig.profile:
                    return d, m
    return None


def _mig_uuid(inv: NodeInventory, dev: RecordDevice) -> str:
    """The ID of the MIG instance ``dev`` names; a key no advertised ID has when the node lacks
    the instance (so nothing matches it and Allocate says which instance is missing)."""
    found = _mig_instance(inv, dev)
    if found is not None:
        return instance_id(*found)
    mig = dev.mig
    return f"{dev.uuid}@{mig.profile}@{mig.start}" if mig else dev.uuid


def _key(inv: NodeInventory, dev: RecordDevice) -> str:
    """What a record device is, as advertised IDs name it (``physical``)."""
    return _mig_uuid(inv, dev) if dev.mig is not None else dev.uuid


def missing_mig(record: DeviceRecord, inv: NodeInventory) -> list[str]:
    """The MIG instances ``record`` names that the node does not have, described."""
    return [
        f"MIG instance {d.mig.profile} at start {d.mig.start} of GPU {d.index} ({d.uuid})"
        for d in record.devices
        if d.mig is not None and _mig_instance(inv, d) is None
    ]


def record_devices(
    resource: str, record: DeviceRecord, *, share: bool = False
) -> list[RecordDevice]:
    """The devices of ``record`` that the kubelet counts under ``resource``. ``share``: the pod
    asks ``kallot.io/gpu-milli``, so a MIG device in its record is a share on that instance and
    counts under the milli resource, not under ``nvidia.com/mig-<profile>`` (for a pod asking
    ``nvidia.com/mig-<profile>``, the other way round)."""
    if resource == RESOURCE_GPU:
        return [d for d in record.devices if d.mode == "exclusive" and d.mig is None]
    if resource == RESOURCE_MILLI:
        return [
            d for d in record.devices if d.mode in SHARED_MODES or (share and d.mig is not None)
        ]
    if resource.startswith(RESOURCE_MIG_PREFIX) and not share:
        profile = resource.removeprefix(RESOURCE_MIG_PREFIX)
        return [d for d in record.devices if d.mig is not None and d.mig.profile == profile]
    return []


def record_footprint(
    resource: str, record: DeviceRecord, inv: NodeInventory, *, share_milli: int = 0
) -> Counter[str]:
    """UUID (GPU or MIG instance) -> units the record charges under ``resource`` (the IDs
    Allocate should see). ``share_milli``: the pod's ``kallot.io/gpu-milli`` request (0: none).

    A share on a MIG instance is charged the instance's compute (3g: 428 milli) but the kubelet
    asks the pod's request (say 100): under ``kallot.io/gpu-milli`` the instance's footprint is
    the smaller of the two, on the instance's own IDs ``<MIG UUID>::<k>``.
    """
    out: Counter[str] = Counter()
    for d in record_devices(resource, record, share=share_milli > 0):
        if resource == RESOURCE_MILLI:
            if d.mig is not None:
                out[_mig_uuid(inv, d)] += min(d.milli, share_milli)
            else:
                out[d.uuid] += d.milli
        elif resource.startswith(RESOURCE_MIG_PREFIX):
            out[_mig_uuid(inv, d)] += 1
        else:
            out[d.uuid] += 1
    return out


def pod_footprint(resource: str, pod: PodRecord, inv: NodeInventory) -> Counter[str]:
    """``record_footprint`` of a pod's record (empty without one)."""
    if pod.record is None:
        return Counter()
    return record_footprint(resource, pod.record, inv, share_milli=pod.milli)


def _fmt(fp: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(fp.items())) + "}"


def find_record(
    resource: str,
    ids: Sequence[str],
    pods: Sequence[PodRecord],
    *,
    node: str,
    inv: NodeInventory,
) -> PodRecord:
    """The pod whose device record asks exactly ``ids`` of ``resource``; AllocationError otherwise.

    Among the pods still waiting for their devices (``allocated`` False): footprint equality
    first, then containment (the kubelet allocates per container, so each container of a
    multi-container pod asks a part of the pod's record). A pod whose devices were already
    handed out matches only by equality, and only while no pod waits for this resource (a
    re-admission, e.g. after a restart). When several pods match they must have identical
    records (then the oldest is taken: the response is the same). A record written for another
    node is refused, as is a request no record explains.
    """
    want = request_footprint(ids)
    asked = f"{len(ids)} x {resource} {_fmt(want)}"
    unreadable = [p for p in pods if p.record is None and p.error]
    prints = {p.key: pod_footprint(resource, p, inv) for p in pods if p.record is not None}
    waiting = [p for p in pods if p.key in prints and prints[p.key] and not p.allocated]
    matches = [p for p in waiting if prints[p.key] == want]
    if not matches and want:
        matches = [p for p in waiting if all(prints[p.key][u] >= n for u, n in want.items())]
    if not matches and not waiting:
        matches = [p for p in pods if p.allocated and p.key in prints and prints[p.key] == want]
    if not matches:
        missing = [
            (p.key, m)
            for p in waiting
            if p.record is not None and p.record.node == node
            for m in missing_mig(p.record, inv)
        ]
        if missing:
            have = [f"{m.profile}@{m.start} of GPU {d.index}" for d in inv.devices for m in d.mig]
            raise AllocationError(
                f"{asked}: the device record of pod {missing[0][0]} names {missing[0][1]}, "
                f"which node {node} does not have (its MIG instances: "
                f"{', '.join(have) if have else 'none'}); refusing"
            )
        seen = [f"{p.key} {_fmt(prints[p.key])}" for p in pods if prints.get(p.key)]
        found = "; ".join(seen) if seen else "no pod on this node has a device record for it"
        extra = "".join(f"; {p.key}: unreadable record ({p.error})" for p in unreadable)
        raise AllocationError(
            f"no device record on node {node} asks {asked} (found: {found}{extra}); "
            "kallot hands out only devices the scheduler recorded"
        )
    wrong_node = [p for p in matches if p.record is not None and p.record.node != node]
    if wrong_node:
        p = wrong_node[0]
        assert p.record is not None
        raise AllocationError(
            f"pod {p.key} matches {asked} but its device record is for node {p.record.node!r}, "
            f"this is node {node!r}; refusing"
        )
    records = {p.record.to_json() for p in matches if p.record is not None}
    if len(records) > 1:
        raise AllocationError(
            f"{asked} matches the device records of several pods with different devices "
            f"({', '.join(p.key for p in matches)}); refusing to guess"
        )
    matches.sort(key=lambda p: (p.allocated, p.bind_time, p.key))
    chosen = matches[0]
    clash = held_elsewhere(chosen, pods, inv)
    if clash:
        raise AllocationError(
            f"{asked}: the device record of pod {chosen.key} names {clash}; a device is handed "
            "out once, whichever resource name asks it; refusing"
        )
    return chosen


def _held(pod: PodRecord, inv: NodeInventory) -> dict[str, bool]:
    """Device (GPU UUID or MIG instance ID) -> held exclusively, for every device of the
    pod's record: a whole GPU or a MIG instance is one pod's; an MPS or time-sliced share
    leaves the GPU to other shares."""
    assert pod.record is not None
    out: dict[str, bool] = {}
    for d in pod.record.devices:
        key = _key(inv, d)
        out[key] = out.get(key, False) or d.mig is not None or d.mode not in SHARED_MODES
    return out


def held_elsewhere(pod: PodRecord, pods: Sequence[PodRecord], inv: NodeInventory) -> str:
    """A device of ``pod``'s record that another pod already holds ("" when none), described.

    The kubelet counts ``nvidia.com/gpu``, ``kallot.io/gpu-milli`` and ``nvidia.com/mig-*``
    independently, so it would admit two pods on one GPU through two names; the agent does not
    (docs/security.md). Held: the record of another pod on this node whose devices were handed
    out; a clash is a device either of them holds exclusively.
    """
    if pod.record is None:
        return ""
    mine = _held(pod, inv)
    for other in pods:
        if other.uid == pod.uid or not other.allocated or other.record is None:
            continue
        if other.record.node != pod.record.node:
            continue
        for key, exclusive in _held(other, inv).items():
            if key in mine and (exclusive or mine[key]):
                return f"device {key}, which pod {other.key} holds"
    return ""


def grant(
    resource: str,
    pod: PodRecord,
    ids: Sequence[str],
    inv: NodeInventory,
    *,
    cdi_kind: str = wire.CDI_KIND_GPU,
    mps_pipe_dir: str = "",
) -> Grant:
    """The container's devices: exactly the record's devices for ``resource`` (restricted to
    the UUIDs asked), with MPS limits for MPS shares."""
    assert pod.record is not None
    want = request_footprint(ids)
    devices = [
        d for d in record_devices(resource, pod.record, share=pod.milli > 0) if _key(inv, d) in want
    ]
    # A MIG device is always handed out as its instance (MIG UUID), never the parent GPU.
    visible = [_key(inv, d) for d in devices]
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(visible)}
    mounts: list[tuple[str, str, bool]] = []
    mps = [d for d in devices if d.mode == "mps"]
    if mps:
        # Percent of the GPU's threads (CUDA MPS docs: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
        # one share per pod, so the pod's share sets it.
        pct = max(1, math.ceil(max(d.milli for d in mps) / 10))
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, pct))
        # Device ordinals as the container sees them: its visible devices, in order.
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{visible.index(d.uuid)}={d.mem_mib}M" for d in mps
        )
        if mps_pipe_dir:
            envs["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
            mounts.append((mps_pipe_dir, mps_pipe_dir, False))
    return Grant(
        envs=envs,
        # No kind: the runtime gets the environment only (node.cdi, ``--cdi-devices=none``).
        cdi_devices=tuple(f"{cdi_kind}={u}" for u in visible) if cdi_kind else (),
        mounts=tuple(mounts),
        annotations={wire.CDI_ANN_POD: pod.key},
    )


def preferred(
    resource: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    pods: Sequence[PodRecord],
    *,
    node: str,
    inv: NodeInventory,
) -> list[str]:
    """The IDs to suggest to the kubelet for an allocation of ``size``.

    1. A pod waiting for its devices (record not yet allocated) whose record needs exactly
       ``size`` units that are available: its devices (the scheduler's choice); then a waiting
       pod whose record needs more (one container of a multi-container pod).
    2. Otherwise, for whole GPUs, the best-connected set by the core's topology ranking; for
       milli-GPUs, the IDs of the GPU with the most units available (one share = one GPU).
    """
    avail = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    by_uuid: dict[str, list[str]] = {}
    for i in avail:
        by_uuid.setdefault(physical(i), []).append(i)
    candidates = sorted(
        (p for p in pods if p.record is not None and p.record.node == node and not p.allocated),
        key=lambda p: (p.bind_time, p.key),
    )
    prints = [(p, pod_footprint(resource, p, inv)) for p in candidates]
    # Pods whose record needs exactly ``size`` first, then larger ones (multi-container pods).
    for exact in (True, False):
        for _p, fp in prints:
            total = sum(fp.values())
            if not fp or (total != size if exact else total < size):
                continue
            chosen: list[str] = []
            taken: Counter[str] = Counter()
            for u in dict.fromkeys([physical(m) for m in must] + sorted(fp)):
                ids = by_uuid.get(u, [])
                first = [i for i in ids if i in must] + [i for i in ids if i not in must]
                n = max(0, min(fp[u] - taken[u], size - len(chosen)))
                chosen.extend(first[:n])
                taken[u] += n
            if len(chosen) == size and set(must) <= set(chosen):
                return chosen
    if resource == RESOURCE_GPU:
        index = {d.uuid: d.index for d in inv.devices}
        link = inv.to_link(where="inventory")
        slots = [index[u] for u in by_uuid if u in index]
        must_slots = [index[physical(m)] for m in must if physical(m) in index]
        if link is not None and slots:
            ranked = topology.rank_gpu_sets(
                np.asarray(link, dtype=np.int8), slots, size, must_include=must_slots, limit=1
            )
            if ranked:
                uuid_of = {d.index: d.uuid for d in inv.devices}
                return [uuid_of[s] for s in ranked[0].slots]
    if resource == RESOURCE_MILLI:
        order = sorted(by_uuid, key=lambda u: (-len(by_uuid[u]), u))
        for u in order:
            if len(by_uuid[u]) >= size and all(physical(m) == u for m in must):
                ids = by_uuid[u]
                return ([i for i in ids if i in must] + [i for i in ids if i not in must])[:size]
    rest = [i for i in avail if i not in must]
    return (must + rest)[:size]
