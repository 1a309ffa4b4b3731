"""The node inventory: what the node agent publishes about a node's GPUs, and what the scheduler
reads to build its Snapshot without talking to the node (docs/node-inventory.md).

Published as JSON in the Node annotation ``kallot.io/gpu-inventory`` (plus GFD-named labels for
coarse facts). ``NodeInventory.to_gpu_specs()`` converts it to core GpuSpecs.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from kallot.config import wire
from kallot.config.errors import config_error
from kallot.core import topology
from kallot.core.errors import ConfigError
from kallot.core.resources import SharingMode, canonical_model
from kallot.core.snapshot import GpuSpec

ANNOTATION = wire.ANN_GPU_INVENTORY
SCHEMA_VERSION = 1

ModeName = Literal["exclusive", "time-slicing", "mps", "mig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MigDevice(_Strict):
    """One existing MIG instance on a GPU."""

    profile: str = Field(description="MIG profile, e.g. '3g.40gb'")
    start: int = Field(ge=0, le=7, description="first memory slice of the placement")
    uuid: str = ""


class Device(_Strict):
    """One physical GPU."""

    index: int = Field(ge=0, description="NVML device index on the node")
    uuid: str = Field(min_length=1)
    model: str = Field(min_length=1, description="kallot model name, e.g. 'H100-80GB'")
    product: str = Field(default="", description="NVML product name")
    mem_mib: int = Field(alias="memMiB", gt=0)
    mode: ModeName = "mps"
    replicas: int = Field(default=1, ge=1, description="time-slicing replicas")
    oversubscription: float = Field(default=1.0, ge=1.0, le=16.0)
    healthy: bool = True
    numa: int = -1
    island: int = Field(default=-1, description="NVLink island id within the node")
    pci_bus_id: str = Field(default="", alias="pciBusId")
    compute_capability: str = Field(default="", alias="computeCapability")
    mig: tuple[MigDevice, ...] = ()
    # The agent applies MIG re-layouts the scheduler plans on this GPU (kallot.io/mig-plan,
    # docs/node-agent.md): the scheduler may then destroy idle instances and create others.
    mig_reconfigurable: bool = Field(default=False, alias="migReconfigurable")
    # Served by the agent's DRA driver (its gpu.kallot.io ResourceSlices), not by the device
    # plugin: the DRA pool's alone, never handed to an extended-resource request.
    dra: bool = False

    @model_serializer(mode="wrap")
    def _omit_off(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written only when on: the inventories of nodes without it stay byte for byte as they
        # were (the annotation's size matters: docs/node-agent.md, "Inventory validation").
        out: dict[str, Any] = handler(self)
        if not self.mig_reconfigurable:
            out.pop("migReconfigurable", None)
            out.pop("mig_reconfigurable", None)
        if not self.dra:
            out.pop("dra", None)
        return out

    @field_validator("model")
    @classmethod
    def _canonical(cls, v: str) -> str:
        return canonical_model(v)

    def to_gpu_spec(self) -> GpuSpec:
        return GpuSpec(
            model=self.model,
            mem_mib=self.mem_mib,
            uuid=self.uuid,
            mode=SharingMode.parse(self.mode),
            replicas=self.replicas,
            oversubscription=self.oversubscription,
            # A GPU DRA serves is, for the extended-resource path, as good as absent (the slot
            # keeps its index: device records and topology are by index).
            healthy=self.healthy and not self.dra,
            numa=self.numa,
            island=self.island,
            mig_dynamic=self.mig_reconfigurable,
        )


class Topology(_Strict):
    """GPU-to-GPU links: NVML common-ancestor levels (0 same board, 10 single PCIe switch,
    20 multiple switches, 30 host bridge, 40 same NUMA node, 50 across sockets) and NVLink
    link counts, both [G][G] in device-index order."""

    levels: tuple[tuple[int, ...], ...] = ()
    nvlinks: tuple[tuple[int, ...], ...] = ()


class NodeInventory(_Strict):
    """Everything the scheduler needs to know about one node's GPUs."""

    version: int = Field(default=SCHEMA_VERSION, alias="v")
    driver_version: str = Field(default="", alias="driverVersion")
    cuda_version: str = Field(default="", alias="cudaVersion")
    devices: tuple[Device, ...] = ()
    topology: Topology = Topology()

    @model_validator(mode="after")
    def _consistent(self) -> NodeInventory:
        indices = [d.index for d in self.devices]
        if sorted(indices) != list(range(len(indices))):
            raise ValueError(f"devices[].index must be 0..{len(indices) - 1}, got {indices}")
        n = len(self.devices)
        for name, matrix in (("levels", self.topology.levels), ("nvlinks", self.topology.nvlinks)):
            if matrix and (len(matrix) != n or any(len(row) != n for row in matrix)):
                raise ValueError(f"topology.{name} must be {n}x{n}")
        return self

    def to_link(self, *, where: str = ANNOTATION) -> list[list[int]] | None:
        """The [G][G] link codes for ``NodeSpec.link`` (core.topology.link_matrix), or None when
        the node publishes no topology; raises ConfigError naming the bad entry."""
        if not self.topology.levels:
            return None
        try:
            codes = topology.link_matrix(self.topology.levels, self.topology.nvlinks or None)
        except ValueError as exc:
            raise ConfigError(f"{where}.topology", "levels/nvlinks", str(exc)) from None
        return [[int(c) for c in row] for row in codes]

    def to_gpu_specs(self) -> list[GpuSpec]:
        return [d.to_gpu_spec() for d in sorted(self.devices, key=lambda d: d.index)]

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=False)

    @staticmethod
    def from_json(text: str, *, where: str = ANNOTATION) -> NodeInventory:
        """Parse the annotation; raises ConfigError naming the bad field."""
        try:
            return NodeInventory.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigError(where, text[:80], f"JSON ({exc.msg} at {exc.pos})") from exc
        except ValidationError as exc:
            raise config_error(exc, prefix=where) from exc
