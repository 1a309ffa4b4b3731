"""The node's GPUs as DRA ResourceSlices (``resource.k8s.io/v1``), driver ``gpu.kallot.io``.

Where it sits: the node agent's DRA side. ``dra_devices`` turns the inventory (the same
``NodeInventory`` discovery builds for the device plugin) into the devices the driver offers;
``resource_slices`` packs them into the slices of one pool (one pool per node, named after the
node). Pure: no API calls, no gRPC; ``kallot agent inventory --dra --json`` prints the result for
any inventory file, ``dra_publish.SlicePublisher`` applies it, ``draplugin`` prepares what the
scheduler allocated from it (docs/dra.md, docs/design/008-dra-driver.md).

What is published, per physical GPU (device names are DNS labels, NVIDIA's scheme):

- not in MIG mode, ``exclusive``: one device ``gpu-<i>`` (type ``gpu``) with ``memory``;
- not in MIG mode, ``mps`` / ``time-slicing``: one device ``gpu-<i>`` with
  ``allowMultipleAllocations`` (consumable capacity): ``memory`` with a request policy (MPS: a
  claim that states no memory gets the whole GPU's; time-slicing: one replica's), MPS also
  ``compute`` (percent of the SMs, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), time-slicing also
  ``replicas`` (each claim takes one);
- in MIG mode: its existing instances ``gpu-<i>-mig-<profile>-<start>`` (static) and, with
  dynamic MIG, every profile x placement that still fits next to them (``core.mig`` geometry),
  each consuming counters of the GPU's counter set ``gpu-<i>-counters`` (one counter per free
  memory slice, ``compute-slices``, ``media-engines``), so the scheduler never allocates two
  overlapping placements or more compute than the GPU has.

Attributes carry NVIDIA's names (``type``, ``uuid``, ``productName``, ``architecture``,
``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion``,
``resource.kubernetes.io/pciBusID``/``pcieRoot``; MIG: ``parentUUID``, ``profile``), so a
``gpu.nvidia.com`` selector works with the domain swapped; kallot adds ``nvlinkIsland``,
``numaNode``, ``sharing``, ``model``. An unhealthy GPU's devices carry the taint
``gpu.kallot.io/unhealthy`` (NoSchedule) until it recovers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

from kallot.config.inventory import Device, NodeInventory
from kallot.core import mig as core_mig
from kallot.node.discovery import _bus

DRIVER = "gpu.kallot.io"
API_VERSION = "resource.k8s.io/v1"
STANDARD_DOMAIN = "resource.kubernetes.io"
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
MAX_DEVICES = 128  # per slice
MAX_DEVICES_WITH_COUNTERS = 64  # per slice when a device has taints or consumesCounters
MAX_COUNTER_SETS = 8  # per slice
COMPUTE_PERCENT = 100
CLASS_GPU = "gpu.kallot.io"
CLASS_MIG = "mig.kallot.io"
CLASS_SHARE = "gpu-share.kallot.io"

Kind = Literal["gpu", "share", "mig", "mig-dynamic"]
MigMode = Literal["dynamic", "static"]


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One published device and what it stands for (prepare reads this, not the slice)."""

    name: str
    kind: Kind
    gpu: Device
    profile: str = ""  # MIG profile
    start: int = -1  # MIG placement start (memory slice)
    mig_uuid: str = ""  # an existing MIG instance's UUID
    gi_id: int = -1  # GPU-instance profile id (dynamic MIG creates with it)

    @property
    def type(self) -> str:
        return "mig" if self.kind in ("mig", "mig-dynamic") else "gpu"


@dataclass(frozen=True, slots=True)
class DraOptions:
    """Node settings of the slices. ``owned_mig``: MIG instances this driver created for claims
    (by ``(gpu index, start)``): they are placements in use, not static devices, and their
    memory slices stay counters (the allocation that made them holds them)."""

    node: str
    mig: MigMode = "dynamic"
    unhealthy: AbstractSet[str] = frozenset()  # GPU UUIDs
    owned_mig: AbstractSet[tuple[int, int]] = frozenset()
    pcie_roots: Mapping[str, str] = field(default_factory=dict)  # PCI bus id -> pci<dom>:<bus>
    gpus: AbstractSet[int] | None = None  # GPU indices the driver serves (None: all)

    def serves(self, gpu: Device) -> bool:
        return self.gpus is None or gpu.index in self.gpus


def mig_device_name(index: int, profile: str, start: int) -> str:
    """``gpu-0-mig-1g10gb-6``: a DNS label (no dots or '+': ``1g.10gb+me`` -> ``1g10gbme``)."""
    return f"gpu-{index}-mig-{re.sub(r'[^a-z0-9]', '', profile.lower())}-{start}"


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-counters"


def semver(text: str) -> str:
    """A version attribute's value: three numeric parts, no leading zeros ('570.124.06' ->
    '570.124.6', '9.0' -> '9.0.0'); '' when ``text`` has no number."""
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    if not parts:
        return ""
    parts += [0] * (3 - len(parts))
    return ".".join(str(p) for p in parts)


_ARCH = {1: "Tesla", 2: "Fermi", 3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta"}
_ARCH.update({8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"})


def architecture(compute_capability: str) -> str:
    """NVML's architecture name for a compute capability (7.5 Turing, 8.9 Ada Lovelace)."""
    if not compute_capability:
        return ""
    major, _, minor = compute_capability.partition(".")
    special = {("7", "5"): "Turing", ("8", "9"): "Ada Lovelace"}
    return special.get((major, minor), _ARCH.get(int(major), ""))


def _gpu_mig_layout(gpu: Device, opts: DraOptions) -> tuple[list[core_mig.Instance], bool]:
    """The existing instances that are static devices, and whether placements are offered."""
    static = [(m.profile, m.start) for m in gpu.mig if (gpu.index, m.start) not in opts.owned_mig]
    table = core_mig.PROFILES.get(gpu.model)
    dynamic = opts.mig == "dynamic" and table is not None
    return static, dynamic and not core_mig.valid_layout(gpu.model, static)


def dra_devices(inv: NodeInventory, opts: DraOptions) -> list[DraDevice]:
    """Every device the driver offers on this node, in GPU index order."""
    out: list[DraDevice] = []
    for gpu in sorted(inv.devices, key=lambda d: d.index):
        if not opts.serves(gpu):
            continue
        if gpu.mode != "mig":
            kind: Kind = "gpu" if gpu.mode == "exclusive" else "share"
            out.append(DraDevice(f"gpu-{gpu.index}", kind, gpu))
            continue
        static, dynamic = _gpu_mig_layout(gpu, opts)
        for m in gpu.mig:
            if (gpu.index, m.start) in opts.owned_mig:
                continue
            p = core_mig.profile(gpu.model, m.profile)
            out.append(
                DraDevice(
                    mig_device_name(gpu.index, m.profile, m.start),
                    "mig",
                    gpu,
                    profile=m.profile,
                    start=m.start,
                    mig_uuid=m.uuid,
                    gi_id=p.gi_id if p else -1,
                )
            )
        if not dynamic:
            continue
        for p in core_mig.PROFILES[gpu.model]:
            for start in core_mig.placements(gpu.model, static, p.name):
                out.append(
                    DraDevice(
                        mig_device_name(gpu.index, p.name, start),
                        "mig-dynamic",
                        gpu,
                        profile=p.name,
                        start=start,
                        gi_id=p.gi_id,
                    )
                )
    return out


def _mib(mib: int) -> str:
    return f"{mib}Mi"


def _attrs(inv: NodeInventory, d: DraDevice, opts: DraOptions) -> dict[str, dict[str, Any]]:
    gpu = d.gpu
    attrs: dict[str, dict[str, Any]] = {
        "type": {"string": d.type},
        "productName": {"string": gpu.product or gpu.model},
        "model": {"string": gpu.model},
    }
    uuid = d.mig_uuid if d.type == "mig" else gpu.uuid
    if uuid:
        attrs["uuid"] = {"string": uuid}
    arch = architecture(gpu.compute_capability)
    if arch:
        attrs["architecture"] = {"string": arch}
    for name, text in (
        ("cudaComputeCapability", gpu.compute_capability),
        ("driverVersion", inv.driver_version),
        ("cudaDriverVersion", inv.cuda_version),
    ):
        version = semver(text)
        if version:
            attrs[name] = {"version": version}
    if gpu.pci_bus_id:
        bus = _bus(gpu.pci_bus_id)
        attrs[f"{STANDARD_DOMAIN}/pciBusID"] = {"string": bus}
        root = opts.pcie_roots.get(bus)
        if root:
            attrs[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": root}
    if gpu.numa >= 0:
        attrs["numaNode"] = {"int": gpu.numa}
    if gpu.island >= 0:
        attrs["nvlinkIsland"] = {"int": gpu.island}
    if d.type == "mig":
        attrs["parentUUID"] = {"string": gpu.uuid}
        attrs["profile"] = {"string": d.profile}
        attrs["placementStart"] = {"int": d.start}
        attrs["dynamic"] = {"bool": d.kind == "mig-dynamic"}
    else:
        attrs["sharing"] = {"string": gpu.mode}
    return attrs


def _capacity(d: DraDevice) -> dict[str, dict[str, Any]]:
    gpu = d.gpu
    if d.type == "mig":
        p = core_mig.profile(gpu.model, d.profile)
        mib = p.mem_mib if p else 0
        return {
            "memory": {"value": _mib(mib)},
            "computeSlices": {"value": str(p.compute if p else 0)},
        }
    if d.kind == "gpu":
        return {"memory": {"value": _mib(gpu.mem_mib)}}
    if gpu.mode == "mps":
        return {
            # A claim that states no memory takes the whole GPU's (the safe default); a share
            # states what it needs, in MiB steps.
            "memory": {
                "value": _mib(gpu.mem_mib),
                "requestPolicy": {
                    "default": _mib(gpu.mem_mib),
                    "validRange": {"min": "1Mi", "step": "1Mi"},
                },
            },
            # Percent of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). Unstated: 0, no
            # guaranteed share of the SMs (best effort, no thread limit).
            "compute": {
                "value": str(COMPUTE_PERCENT),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(COMPUTE_PERCENT), "step": "1"},
                },
            },
        }
    # time-slicing: each claim is one of ``replicas`` time slices; memory is not isolated, a
    # claim's default is one replica's part of the (oversubscribed) memory.
    total = int(gpu.mem_mib * gpu.oversubscription)
    return {
        "memory": {
            "value": _mib(total),
            "requestPolicy": {
                "default": _mib(max(1, total // gpu.replicas)),
                "validRange": {"min": "1Mi", "step": "1Mi"},
            },
        },
        "replicas": {
            "value": str(gpu.replicas),
            "requestPolicy": {"default": "1", "validValues": ["1"]},
        },
    }


def _consumes(d: DraDevice) -> list[dict[str, Any]]:
    if d.kind != "mig-dynamic":
        return []
    p = core_mig.profile(d.gpu.model, d.profile)
    assert p is not None
    counters: dict[str, dict[str, str]] = {
        f"memory-slice-{s}": {"value": "1"} for s in range(d.start, d.start + p.mem_slices)
    }
    counters["compute-slices"] = {"value": str(p.compute)}
    if p.media:
        counters["media-engines"] = {"value": "1"}
    return [{"counterSet": counter_set_name(d.gpu.index), "counters": counters}]


def counter_sets(inv: NodeInventory, opts: DraOptions) -> list[dict[str, Any]]:
    """One counter set per MIG GPU with dynamic placements: what is free next to its static
    instances (memory slices, compute slices, the one set of media engines)."""
    out = []
    for gpu in sorted(inv.devices, key=lambda d: d.index):
        if gpu.mode != "mig" or not opts.serves(gpu):
            continue
        static, dynamic = _gpu_mig_layout(gpu, opts)
        if not dynamic:
            continue
        used = 0
        compute = media = 0
        for name, start in static:
            p = core_mig.profile(gpu.model, name)
            assert p is not None
            used |= p.mask(start)
            compute += p.compute
            media += p.media
        counters = {
            f"memory-slice-{s}": {"value": "1"}
            for s in range(core_mig.MEMORY_SLICES)
            if not used & (1 << s)
        }
        counters["compute-slices"] = {"value": str(core_mig.COMPUTE_SLICES - compute)}
        counters["media-engines"] = {"value": str(1 - media)}
        out.append({"name": counter_set_name(gpu.index), "counters": counters})
    return out


def device_body(inv: NodeInventory, d: DraDevice, opts: DraOptions) -> dict[str, Any]:
    """One ``devices[]`` entry of a ResourceSlice."""
    body: dict[str, Any] = {
        "name": d.name,
        "attributes": _attrs(inv, d, opts),
        "capacity": _capacity(d),
    }
    consumes = _consumes(d)
    if consumes:
        body["consumesCounters"] = consumes
    if d.kind == "share":
        body["allowMultipleAllocations"] = True
    if unhealthy(d, opts.unhealthy):
        body["taints"] = [
            {"key": TAINT_UNHEALTHY, "value": "xid", "effect": "NoSchedule"},
        ]
    return body


def unhealthy(d: DraDevice, sick: AbstractSet[str]) -> bool:
    """The device's GPU (or, for an existing MIG instance, the instance) is unhealthy."""
    return d.gpu.uuid in sick or not d.gpu.healthy or bool(d.mig_uuid and d.mig_uuid in sick)


def slice_name(node: str, k: int) -> str:
    return f"{node}-{DRIVER}-{k}"


def _chunks(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Devices in slices: at most 128 per slice, 64 once one has taints or counters."""
    out: list[list[dict[str, Any]]] = []
    cur: list[dict[str, Any]] = []
    limited = False
    for dev in devices:
        heavy = "taints" in dev or "consumesCounters" in dev
        limit = MAX_DEVICES_WITH_COUNTERS if (limited or heavy) else MAX_DEVICES
        if len(cur) >= limit:
            out.append(cur)
            cur, limited = [], False
        cur.append(dev)
        limited = limited or heavy
    if cur:
        out.append(cur)
    return out


def resource_slices(
    inv: NodeInventory, opts: DraOptions, *, generation: int = 1
) -> list[dict[str, Any]]:
    """The ResourceSlices of this node's pool, complete: counter sets first (their own slices,
    at most 8 sets each), then the devices. Every slice names the same generation and the
    pool's slice count. A node without GPUs publishes no slice."""
    devices = [device_body(inv, d, opts) for d in dra_devices(inv, opts)]
    sets = counter_sets(inv, opts)
    specs: list[dict[str, Any]] = []
    for k in range(0, len(sets), MAX_COUNTER_SETS):
        specs.append({"sharedCounters": sets[k : k + MAX_COUNTER_SETS]})
    specs.extend({"devices": chunk} for chunk in _chunks(devices))
    pool = {"name": opts.node, "generation": generation, "resourceSliceCount": len(specs)}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(opts.node, k),
                "labels": {"app.kubernetes.io/managed-by": "kallot-agent"},
            },
            "spec": {"driver": DRIVER, "pool": dict(pool), "nodeName": opts.node, **spec},
        }
        for k, spec in enumerate(specs)
    ]


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the chart ships, one per kind (charts/kallot/templates/dra-deviceclasses
    has the same selectors): ``gpu.kallot.io`` whole exclusive GPUs, ``mig.kallot.io`` MIG
    devices (static or dynamic), ``gpu-share.kallot.io`` shares of MPS / time-sliced GPUs."""
    attrs = f"device.attributes['{DRIVER}']"
    base = f"device.driver == '{DRIVER}'"
    selectors = {
        CLASS_GPU: f"{base} && {attrs}.type == 'gpu' && {attrs}.sharing == 'exclusive'",
        CLASS_MIG: f"{base} && {attrs}.type == 'mig'",
        CLASS_SHARE: f"{base} && {attrs}.type == 'gpu' && {attrs}.sharing != 'exclusive'",
    }
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        for name, expr in selectors.items()
    ]


def pcie_root(bus_id: str, sysfs: str = "/sys") -> str:
    """The standard ``pcieRoot`` of a PCI device (``pci0000:00``): the root complex its sysfs
    path starts with, as k8s.io/dynamic-resource-allocation/deviceattribute reads it; '' when
    sysfs does not know the device (the fake backend, a container without /sys)."""
    try:
        path = os.path.realpath(os.path.join(sysfs, "bus/pci/devices", _bus(bus_id)))
    except OSError:
        return ""
    for part in path.split(os.sep):
        if part.startswith("pci") and ":" in part:
            return part
    return ""


def pcie_roots(inv: NodeInventory, sysfs: str = "/sys") -> dict[str, str]:
    """``pcie_root`` of every GPU that has one, by normalized bus id."""
    out = {}
    for gpu in inv.devices:
        if gpu.pci_bus_id:
            root = pcie_root(gpu.pci_bus_id, sysfs)
            if root:
                out[_bus(gpu.pci_bus_id)] = root
    return out
