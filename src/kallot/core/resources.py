"""Units and GPU device models shared by every layer.

All capacities are integers so capacity checks never drift: milli-GPU (1000 = one whole GPU of
compute), MiB of GPU and host memory, milli-CPU. ``GPU_MODELS`` is the documented table of GPU
memory per model (docs/gpu-models.md), used when a node publishes a model but not its memory.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MILLI = 1000  # milli-GPU in one whole GPU (and milli-CPU in one core)


class SharingMode(enum.IntEnum):
    """How one GPU is shared (per GPU, not per node: mixed modes on one node are normal).

    EXCLUSIVE: one task owns the whole GPU.
    TIMESLICE: up to ``replicas`` tasks take turns; no memory isolation, compute oversubscribed.
    MPS: tasks get an active-thread percentage and a pinned-memory limit (memory-limited,
        but a fatal fault in one client can take down the others).
    MIG: the GPU is split into hardware-isolated instances (see core.mig).
    """

    EXCLUSIVE = 0
    TIMESLICE = 1
    MPS = 2
    MIG = 3

    @property
    def label(self) -> str:
        return _MODE_LABELS[self]

    @staticmethod
    def parse(text: str) -> SharingMode:
        """Parse 'exclusive' / 'time-slicing' / 'mps' / 'mig' (and a few common spellings)."""
        key = text.strip().lower().replace("_", "-")
        for mode, names in _MODE_NAMES.items():
            if key in names:
                return mode
        raise ValueError(
            f"unknown sharing mode {text!r}, expected one of {sorted(_MODE_LABELS.values())}"
        )


_MODE_LABELS = {
    SharingMode.EXCLUSIVE: "exclusive",
    SharingMode.TIMESLICE: "time-slicing",
    SharingMode.MPS: "mps",
    SharingMode.MIG: "mig",
}
_MODE_NAMES = {
    SharingMode.EXCLUSIVE: {"exclusive", "none", "whole"},
    SharingMode.TIMESLICE: {
        "time-slicing",
        "timeslicing",
        "time-slice",
        "timeslice",
        "time-sliced",
    },
    SharingMode.MPS: {"mps"},
    SharingMode.MIG: {"mig"},
}

ALL_MODES = frozenset(SharingMode)


class Isolation(enum.IntEnum):
    """What a task needs from its neighbours on a shared GPU.

    NONE: any sharing mode. MEMORY: memory must be limited per client (not time-sliced).
    UNTRUSTED: hardware isolation only (MIG or a whole exclusive GPU).
    """

    NONE = 0
    MEMORY = 1
    UNTRUSTED = 2

    def allows(self, mode: SharingMode) -> bool:
        if self is Isolation.UNTRUSTED:
            return mode in (SharingMode.EXCLUSIVE, SharingMode.MIG)
        if self is Isolation.MEMORY:
            return mode is not SharingMode.TIMESLICE
        return True

    @staticmethod
    def parse(text: str) -> Isolation:
        key = text.strip().lower()
        table = {
            "none": Isolation.NONE,
            "": Isolation.NONE,
            "memory-isolated": Isolation.MEMORY,
            "memory": Isolation.MEMORY,
            "untrusted": Isolation.UNTRUSTED,
        }
        if key not in table:
            raise ValueError(
                f"unknown isolation {text!r}, expected one of none, memory-isolated, untrusted"
            )
        return table[key]


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Facts about one GPU model. ``memory_mib`` is what NVML reports as total memory."""

    name: str
    memory_mib: int
    mig_capable: bool = False
    note: str = ""


# Memory per model. Sources: NVML totals as reported by nvidia-smi on the named SKU where known,
# otherwise the marketed size in GiB. G2/G3 are undisclosed Alibaba codes in the openb trace: the
# trace carries no GPU memory and openb pods ask compute only, so their memory only ever counts in
# proportion to compute (see DeviceRequest.memory_for); the values below are assumptions.
GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("P100", 16384, note="Tesla P100 16 GB (openb)"),
        GpuModel("T4", 15360, note="Tesla T4 16 GB, NVML reports 15360 MiB (openb)"),
        GpuModel("V100M16", 16384, note="V100 16 GB (openb)"),
        GpuModel("V100M32", 32768, note="V100 32 GB (openb)"),
        GpuModel("A10", 23028, note="A10 24 GB, NVML reports 23028 MiB (openb)"),
        GpuModel("G2", 32768, note="undisclosed (openb); assumed 32 GiB"),
        GpuModel("G3", 32768, note="undisclosed (openb); assumed 32 GiB"),
        GpuModel("A100-40GB", 40960, mig_capable=True, note="A100-SXM4-40GB"),
        GpuModel("A100-80GB", 81920, mig_capable=True, note="A100-SXM4-80GB"),
        GpuModel("H100-80GB", 81559, mig_capable=True, note="H100 80GB HBM3 (SXM)"),
        GpuModel("H200-141GB", 143771, mig_capable=True, note="H200 141GB HBM3e"),
        GpuModel("L4", 23034, note="L4 24 GB"),
        GpuModel("L40S", 46068, note="L40S 48 GB"),
    )
}

# NVML product names -> table names, so the node agent and the scheduler agree on one name.
PRODUCT_ALIASES: dict[str, str] = {
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "NVIDIA H100 80GB HBM3": "H100-80GB",
    "NVIDIA H100 PCIe": "H100-80GB",
    "NVIDIA H200": "H200-141GB",
    "NVIDIA H200 NVL": "H200-141GB",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "Tesla T4": "T4",
    "NVIDIA A10": "A10",
    "Tesla P100-PCIE-16GB": "P100",
    "Tesla V100-SXM2-16GB": "V100M16",
    "Tesla V100-SXM2-32GB": "V100M32",
}


def canonical_model(name: str) -> str:
    """Map an NVML product name or GFD label value to the table's model name (identity if unknown)."""
    if name in GPU_MODELS:
        return name
    if name in PRODUCT_ALIASES:
        return PRODUCT_ALIASES[name]
    dashed = name.replace(" ", "-")
    for product, model in PRODUCT_ALIASES.items():
        if product.replace(" ", "-") == dashed:
            return model
    return name


def model_memory_mib(name: str) -> int:
    """GPU memory of a model from the table; raises KeyError for an unknown model."""
    return GPU_MODELS[canonical_model(name)].memory_mib
