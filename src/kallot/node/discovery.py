"""Discovery: what GPUs this node has, behind one interface with two backends.

A backend (``nvml.NvmlBackend`` on a GPU machine, ``fake.FakeBackend`` reading an inventory file
elsewhere) reports *raw* facts the way NVML does: product names, byte counts, compute capability
as two integers, the CUDA driver version as NVML's integer (12080), common-ancestor levels and
NVLink counts per GPU pair, MIG devices by name. ``build_inventory`` turns them into the
``NodeInventory`` the scheduler reads (docs/node-inventory.md); it is pure and the same for both
backends, so the fake backend exercises the exact translation NVML output goes through.

``gfd_labels`` computes the node labels with gpu-feature-discovery's names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from kallot.config import wire
from kallot.config.inventory import Device, MigDevice, ModeName, NodeInventory, Topology
from kallot.core import topology
from kallot.core.errors import ConfigError
from kallot.core.resources import canonical_model
from kallot.node.validate import check_inventory

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class RawMig:
    """One MIG device as NVML names it: ``name`` is the MIG device's product name
    (``NVIDIA A100-SXM4-80GB MIG 3g.40gb``) or a bare profile; ``start`` the GPU instance's
    placement start (memory slice)."""

    name: str
    start: int
    uuid: str
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class RawGpu:
    """One physical GPU as NVML reports it."""

    index: int
    uuid: str
    name: str  # nvmlDeviceGetName
    memory_bytes: int  # nvmlDeviceGetMemoryInfo().total
    compute_capability: tuple[int, int] = (0, 0)  # nvmlDeviceGetCudaComputeCapability
    pci_bus_id: str = ""  # nvmlDeviceGetPciInfo().busId
    numa: int = -1  # nvmlDeviceGetNumaNodeId (-1 when NVML does not know)
    mig_enabled: bool = False  # nvmlDeviceGetMigMode() current == 1
    mig_capable: bool = False  # nvmlDeviceGetMigMode() does not raise NotSupported
    mig: tuple[RawMig, ...] = ()


@dataclass(frozen=True, slots=True)
class RawNode:
    """Everything discovery reads from NVML for one node."""

    driver_version: str  # nvmlSystemGetDriverVersion, "570.124.06"
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, 12080 = 12.8
    gpus: tuple[RawGpu, ...]
    levels: tuple[tuple[int, ...], ...] = ()  # nvmlDeviceGetTopologyCommonAncestor per pair
    nvlinks: tuple[tuple[int, ...], ...] = ()  # active NVLinks per pair


@dataclass(frozen=True, slots=True)
class Sharing:
    """How the agent shares the GPUs that are not in MIG mode (a node setting, flags or the
    fake file): one mode for all, optionally overridden per GPU index."""

    mode: Literal["exclusive", "time-slicing", "mps"] = "mps"
    replicas: int = 1
    oversubscription: float = 1.0
    per_gpu: Mapping[int, Literal["exclusive", "time-slicing", "mps"]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """One sample of one GPU (the exporter's per-GPU series)."""

    uuid: str
    utilization_pct: float  # nvmlDeviceGetUtilizationRates().gpu
    memory_used_bytes: int  # nvmlDeviceGetMemoryInfo().used
    memory_total_bytes: int
    temperature_c: float  # nvmlDeviceGetTemperature(GPU)
    power_w: float  # nvmlDeviceGetPowerUsage / 1000


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process using a GPU (nvmlDeviceGetComputeRunningProcesses), with its SM utilization
    (% of the GPU, nvmlDeviceGetProcessUtilization) when NVML has a sample for it (None: no
    sample, e.g. a process in a MIG instance, where NVML keeps no per-process samples)."""

    uuid: str
    pid: int
    used_memory_bytes: int
    sm_util_pct: float | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID error NVML reported (nvmlEventSetWait with nvmlEventTypeXidCriticalError)."""

    uuid: str
    xid: int


class Backend(Protocol):
    """What the agent needs from a GPU backend. NVML calls block, so the agent calls these
    from a worker thread."""

    def raw(self) -> RawNode:
        """The node's GPUs as NVML reports them."""
        ...

    def metrics(self) -> list[GpuMetrics]:
        """One sample per GPU."""
        ...

    def processes(self) -> list[GpuProcess]:
        """Compute processes per GPU."""
        ...

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        """XID events that arrived within ``timeout_s`` (may return early, possibly empty)."""
        ...

    def close(self) -> None:
        """Release the backend (nvmlShutdown)."""
        ...


_MIG_NAME = re.compile(r"(?:^|\s)(\d+g\.\d+gb(?:\+me)?)$")


def mig_profile(name: str) -> str:
    """The MIG profile from a MIG device name: ``NVIDIA A100-SXM4-80GB MIG 3g.40gb`` -> ``3g.40gb``.
    A bare profile is returned as it is; raises ValueError for anything else."""
    m = _MIG_NAME.search(name.strip())
    if m is None:
        raise ValueError(f"MIG device name {name!r} does not end in a profile like '3g.40gb'")
    return m.group(1)


def cuda_version(driver: int) -> str:
    """NVML's integer CUDA driver version as 'major.minor': 12080 -> '12.8'."""
    if driver <= 0:
        return ""
    return f"{driver // 1000}.{(driver % 1000) // 10}"


def islands(levels: Sequence[Sequence[int]], nvlinks: Sequence[Sequence[int]]) -> list[int]:
    """NVLink island per GPU (connected components of the NVLink graph; the core's rule)."""
    if not levels:
        return []
    codes = topology.link_matrix(levels, nvlinks or None)
    return [int(i) for i in topology.islands_from_links(codes)]


def build_inventory(
    raw: RawNode, sharing: Sharing = Sharing(), *, strict_mig: bool = False
) -> NodeInventory:
    """The published inventory for ``raw``. Raises ConfigError when NVML's answers do not fit
    together (matrix sizes, unknown levels, a MIG name without a profile) or the inventory fails
    ``validate.check_inventory`` (``strict_mig``: also MIG on a model the core has no MIG table
    for, an error in an inventory file; NVML's MIG on such a model is taken as it is)."""
    n = len(raw.gpus)
    for name, matrix in (("levels", raw.levels), ("nvlinks", raw.nvlinks)):
        if matrix and (len(matrix) != n or any(len(row) != n for row in matrix)):
            raise ConfigError(f"topology.{name}", f"{len(matrix)} rows", f"a {n}x{n} matrix")
    try:
        island = islands(raw.levels, raw.nvlinks) if raw.levels else [-1] * n
    except ValueError as exc:
        raise ConfigError("topology", "levels/nvlinks", str(exc)) from None
    devices = []
    for pos, g in enumerate(sorted(raw.gpus, key=lambda g: g.index)):
        if g.index != pos:
            raise ConfigError(f"gpus[{pos}].index", g.index, f"indices 0..{n - 1}")
        mode: ModeName = "mig" if g.mig_enabled else sharing.per_gpu.get(g.index, sharing.mode)
        mig = []
        for k, m in enumerate(g.mig):
            try:
                profile = mig_profile(m.name)
            except ValueError as exc:
                raise ConfigError(f"gpus[{pos}].mig[{k}].name", m.name, str(exc)) from None
            mig.append(MigDevice(profile=profile, start=m.start, uuid=m.uuid))
        devices.append(
            Device(
                index=g.index,
                uuid=g.uuid,
                model=canonical_model(g.name),
                product=g.name,
                mem_mib=max(1, g.memory_bytes // MIB),
                mode=mode,
                replicas=sharing.replicas if mode == "time-slicing" else 1,
                oversubscription=sharing.oversubscription if mode == "time-slicing" else 1.0,
                numa=g.numa,
                island=island[pos],
                pci_bus_id=g.pci_bus_id,
                compute_capability=f"{g.compute_capability[0]}.{g.compute_capability[1]}"
                if g.compute_capability != (0, 0)
                else "",
                mig=tuple(sorted(mig, key=lambda m: m.start)),
            )
        )
    inv = NodeInventory(
        driver_version=raw.driver_version,
        cuda_version=cuda_version(raw.cuda_driver_version),
        devices=tuple(devices),
        topology=Topology(levels=raw.levels, nvlinks=raw.nvlinks),
    )
    check_inventory(inv, strict_mig=strict_mig)
    return inv


# gpu-feature-discovery: compute capability -> family (k8s-device-plugin internal/lm/resource.go
# getArchFamily): the minor splits 7 (volta < 7.5 <= turing) and 8 (ampere < 8.9 <= ada-lovelace).
_FAMILIES = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    9: "hopper",
    10: "blackwell",  # B200, GB200 (10.0)
    12: "blackwell",  # RTX PRO 6000 Blackwell (12.0)
}
_SPLIT = {7: (5, "volta", "turing"), 8: (9, "ampere", "ada-lovelace")}


LABEL_PREFIX = wire.LABEL_GFD_PREFIX


def gpu_family(compute_capability: str) -> str:
    """GFD's family name for a compute capability ('8.9', L4 and L40S, is ada-lovelace)."""
    if not compute_capability:
        return "undefined"
    major_text, _, minor_text = compute_capability.partition(".")
    major, minor = int(major_text), int(minor_text or 0)
    if major in _SPLIT:
        at, below, above = _SPLIT[major]
        return below if minor < at else above
    return _FAMILIES.get(major, "undefined")


def gfd_labels(inv: NodeInventory, *, mig_capable: bool | None = None) -> dict[str, str]:
    """Node labels as gpu-feature-discovery names them (docs/node-inventory.md, "Labels").

    Describes the node's first GPU model (GFD does the same: it labels the first device);
    ``nvidia.com/gpu.count`` counts every GPU. ``mig_capable`` defaults to "some GPU is a model
    the core's table marks MIG-capable, or is in MIG mode". An empty node gets no labels.
    """
    from kallot.core.resources import GPU_MODELS

    if not inv.devices:
        return {}
    first = min(inv.devices, key=lambda d: d.index)
    modes = {d.mode for d in inv.devices}
    if mig_capable is None:
        mig_capable = any(
            d.mode == "mig" or (d.model in GPU_MODELS and GPU_MODELS[d.model].mig_capable)
            for d in inv.devices
        )
    product = (first.product or first.model).replace(" ", "-")
    # GFD has one strategy per node: the mode of the first GPU that is not in MIG mode.
    plain = [d for d in sorted(inv.devices, key=lambda d: d.index) if d.mode != "mig"]
    sharing_strategy = (
        plain[0].mode if plain and plain[0].mode in ("time-slicing", "mps") else "none"
    )
    # gpu.replicas describes the same GPU as the strategy (not the most replicas of any GPU).
    replicas = plain[0].replicas if plain and plain[0].mode == "time-slicing" else 1
    if first.mode == "time-slicing" and first.replicas > 1:
        product += "-SHARED"
    labels = {
        "gpu.product": product,
        "gpu.count": str(len(inv.devices)),
        "gpu.memory": str(first.mem_mib),
        "gpu.family": gpu_family(first.compute_capability),
        "gpu.replicas": str(replicas),
        "gpu.sharing-strategy": sharing_strategy,
        "mig.capable": "true" if mig_capable else "false",
        "mig.strategy": "mixed" if "mig" in modes else "none",
        "mps.capable": "true" if "mps" in modes else "false",
    }
    if first.compute_capability:
        major, _, minor = first.compute_capability.partition(".")
        labels["gpu.compute.major"] = major
        labels["gpu.compute.minor"] = minor
    if inv.driver_version:
        parts = [*inv.driver_version.split("."), "", ""]
        labels["cuda.driver-version.full"] = inv.driver_version
        labels["cuda.driver-version.major"] = parts[0]
        labels["cuda.driver-version.minor"] = parts[1]
        if parts[2]:
            labels["cuda.driver-version.revision"] = parts[2]
    if inv.cuda_version:
        cmaj, _, cmin = inv.cuda_version.partition(".")
        labels["cuda.runtime-version.full"] = inv.cuda_version
        labels["cuda.runtime-version.major"] = cmaj
        labels["cuda.runtime-version.minor"] = cmin
    # MIG mixed strategy: one count per profile present on the node.
    counts: dict[str, int] = {}
    for d in inv.devices:
        for m in d.mig:
            counts[m.profile] = counts.get(m.profile, 0) + 1
    for profile, count in sorted(counts.items()):
        labels[f"mig-{profile.replace('+', '-')}.count"] = str(count)
    return {LABEL_PREFIX + k: v for k, v in labels.items()}


def link_codes(inv: NodeInventory) -> np.ndarray | None:
    """The core's ``[G, G]`` link codes for this inventory (None without topology)."""
    link = inv.to_link(where="inventory")
    return None if link is None else np.asarray(link, dtype=np.int8)


def _bus(bus_id: str) -> str:
    """A PCI bus id in one spelling: NVML writes the domain with 4 or 8 hex digits."""
    text = bus_id.strip().lower()
    domain, _, rest = text.rpartition(":")[0].partition(":")
    if not rest:
        return text
    return f"{int(domain, 16):04x}:{rest}:{text.rpartition(':')[2]}"


def nvlink_counts(
    bus_ids: Sequence[str], remote: Sequence[Sequence[str]], p2p_nvlink: Sequence[Sequence[bool]]
) -> list[list[int]]:
    """Active NVLinks per GPU pair, as nvidia-smi's ``NV#``.

    ``remote[i]`` lists the remote PCI bus id of each active NVLink of GPU i
    (nvmlDeviceGetNvLinkRemotePciInfo); ``p2p_nvlink[i][j]`` is nvmlDeviceGetP2PStatus(i, j,
    NVLINK) == OK. A link whose remote end is GPU j counts for the pair directly. A link to
    anything else is an NVSwitch port: two GPUs that can talk over NVLink through switches get
    ``min(switch links of i, switch links of j)`` (18 on an HGX H100, where every port goes to a
    switch).
    """
    n = len(bus_ids)
    index = {_bus(b): i for i, b in enumerate(bus_ids)}
    direct = [[0] * n for _ in range(n)]
    switch = [0] * n
    for i, links in enumerate(remote):
        for r in links:
            j = index.get(_bus(r))
            if j is None:
                switch[i] += 1
            elif j != i:
                direct[i][j] += 1
    out = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            count = max(direct[i][j], direct[j][i])
            if count == 0 and p2p_nvlink[i][j] and switch[i] and switch[j]:
                count = min(switch[i], switch[j])
            out[i][j] = count
    return out
