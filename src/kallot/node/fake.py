"""The fake backend: a node described in an inventory file, for machines without a GPU.

The file (YAML or JSON) states what NVML would report, in NVML's own terms, and goes through the
same ``discovery.build_inventory`` translation as the NVML backend::

    driverVersion: "570.124.06"
    cudaDriverVersion: 12080            # NVML's integer, 12.8
    sharing: {mode: mps}                # exclusive | time-slicing | mps; replicas, perGpu
    gpus:
      - uuid: GPU-...
        name: NVIDIA H100 80GB HBM3
        memoryMiB: 81559
        computeCapability: "9.0"
        pciBusId: "00000000:18:00.0"
        numa: 0
        migEnabled: false
        mig: [{name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb", start: 0, uuid: MIG-...}]
        metrics: {utilization: 35, memoryUsedMiB: 20480, temperature: 41, power: 310}
    topology:
      levels: [[0, 50], [50, 0]]        # nvmlDeviceGetTopologyCommonAncestor per pair
      nvlinks: [[0, 18], [18, 0]]       # active NVLinks per pair
    processes: [{uuid: GPU-..., pid: 4242, usedMemoryMiB: 10240, smUtil: 30,
                 timeline: [[0, 10240, 30], [60, 14336, 55]]}]

A process's ``timeline`` scripts its use: ``[seconds since the backend started, usedMemoryMiB,
smUtil]`` points, each holding until the next (the last holds for ever); before the first point
the static values apply. ``play(fn)`` replaces the processes by a generator of the elapsed
seconds. Tests can change metric values and inject XID events at run time (``set_metrics``,
``inject_xid``); the agent sees them as it would see NVML's.
"""

from __future__ import annotations

import difflib
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kallot.config.errors import config_error
from kallot.config.files import read_text
from kallot.core import mig as core_mig
from kallot.core.errors import ConfigError, KallotError
from kallot.core.resources import canonical_model
from kallot.node.discovery import (
    MIB,
    GpuMetrics,
    GpuProcess,
    RawGpu,
    RawMig,
    RawNode,
    Sharing,
    XidEvent,
    build_inventory,
    mig_profile,
)

SharedMode = Literal["exclusive", "time-slicing", "mps"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FileMig(_Strict):
    name: str = Field(min_length=1, description="MIG device name or profile, e.g. '3g.40gb'")
    start: int = Field(ge=0, le=7)
    uuid: str = Field(min_length=1)


class FileMetrics(_Strict):
    utilization: float = Field(default=0.0, ge=0, le=100)
    memory_used_mib: int = Field(default=0, ge=0, alias="memoryUsedMiB")
    temperature: float = 35.0
    power: float = Field(default=60.0, ge=0)


class FileGpu(_Strict):
    uuid: str = Field(min_length=1, max_length=60)
    name: str = Field(min_length=1)
    memory_mib: int = Field(gt=0, alias="memoryMiB")
    compute_capability: str = Field(default="", alias="computeCapability", pattern=r"^(\d+\.\d+)?$")
    pci_bus_id: str = Field(default="", alias="pciBusId")
    numa: int = Field(default=-1, ge=-1)
    mig_enabled: bool = Field(default=False, alias="migEnabled")
    mig_capable: bool = Field(default=False, alias="migCapable")
    mig: tuple[FileMig, ...] = ()
    metrics: FileMetrics = FileMetrics()

    def raw_mig(self) -> tuple[RawMig, ...]:
        return tuple(RawMig(name=m.name, start=m.start, uuid=m.uuid) for m in self.mig)


class FileSharing(_Strict):
    mode: SharedMode = "mps"
    replicas: int = Field(default=1, ge=1)
    oversubscription: float = Field(default=1.0, ge=1.0, le=16.0)
    per_gpu: dict[int, SharedMode] = Field(default_factory=dict, alias="perGpu")


class FileTopology(_Strict):
    levels: tuple[tuple[int, ...], ...] = ()
    nvlinks: tuple[tuple[int, ...], ...] = ()


class FileProcess(_Strict):
    uuid: str
    pid: int = Field(gt=0)
    used_memory_mib: int = Field(ge=0, alias="usedMemoryMiB")
    sm_util: float | None = Field(default=None, ge=0, le=100, alias="smUtil")
    # [seconds since start, usedMemoryMiB, smUtil] points, in time order
    timeline: tuple[tuple[float, int, float], ...] = ()

    @field_validator("timeline")
    @classmethod
    def _ordered(
        cls, v: tuple[tuple[float, int, float], ...]
    ) -> tuple[tuple[float, int, float], ...]:
        for i, (t, mib, sm) in enumerate(v):
            if t < 0 or mib < 0 or not 0 <= sm <= 100:
                raise ValueError(f"point {i}: expected t >= 0, MiB >= 0, smUtil 0..100")
            if i and t < v[i - 1][0]:
                raise ValueError(f"point {i}: times must not decrease")
        return v


class InventoryFile(_Strict):
    driver_version: str = Field(default="", alias="driverVersion")
    cuda_driver_version: int = Field(default=0, ge=0, alias="cudaDriverVersion")
    sharing: FileSharing = FileSharing()
    gpus: tuple[FileGpu, ...]
    topology: FileTopology = FileTopology()
    processes: tuple[FileProcess, ...] = ()

    def raw(self) -> RawNode:
        return RawNode(
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            gpus=tuple(
                RawGpu(
                    index=i,
                    uuid=g.uuid,
                    name=g.name,
                    memory_bytes=g.memory_mib * MIB,
                    compute_capability=_cc(g.compute_capability),
                    pci_bus_id=g.pci_bus_id,
                    numa=g.numa,
                    mig_enabled=g.mig_enabled,
                    mig_capable=g.mig_capable or g.mig_enabled,
                    mig=g.raw_mig(),
                )
                for i, g in enumerate(self.gpus)
            ),
            levels=self.topology.levels,
            nvlinks=self.topology.nvlinks,
        )

    def sharing_setting(self) -> Sharing:
        s = self.sharing
        return Sharing(
            mode=s.mode,
            replicas=s.replicas,
            oversubscription=s.oversubscription,
            per_gpu=dict(s.per_gpu),
        )


def _cc(text: str) -> tuple[int, int]:
    if not text:
        return (0, 0)
    major, _, minor = text.partition(".")
    return (int(major), int(minor))


def load_inventory_file(path: Path) -> InventoryFile:
    """Read and validate an inventory file; raises ConfigError naming the file and the field."""
    where = str(path)
    text = read_text(path, where, "a readable inventory file")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(where, text[:40], f"valid YAML/JSON ({exc})") from None
    try:
        spec = InventoryFile.model_validate(data)
    except ValidationError as exc:
        unknown = [e for e in exc.errors() if e.get("type") == "extra_forbidden"]
        if unknown:  # name the unknown key, not a missing one it was meant to be
            loc = [str(p) for p in unknown[0].get("loc", ())]
            hint = difflib.get_close_matches(loc[-1], _known_keys(), n=1)
            expected = f"a known key (did you mean {hint[0]!r}?)" if hint else "a known key"
            raise ConfigError(f"{where}: {'.'.join(loc)}", "unknown key", expected) from None
        err = config_error(exc)
        raise ConfigError(f"{where}: {err.field}", err.value, err.expected) from None
    for i, g in enumerate(spec.gpus):
        if g.metrics.memory_used_mib > g.memory_mib:
            raise ConfigError(
                f"{where}: gpus.{i}.metrics.memoryUsedMiB",
                g.metrics.memory_used_mib,
                f"at most the GPU's memoryMiB {g.memory_mib}",
            )
    try:  # what discovery and validate.check_inventory will refuse, refused here with the file
        build_inventory(spec.raw(), spec.sharing_setting(), strict_mig=True)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.field}", exc.value, exc.expected) from None
    return spec


def _known_keys() -> list[str]:
    models: tuple[type[BaseModel], ...] = (
        InventoryFile,
        FileGpu,
        FileMig,
        FileMetrics,
        FileSharing,
        FileTopology,
        FileProcess,
    )
    return sorted({f.alias or n for m in models for n, f in m.model_fields.items()})


class FakeBackend:
    """``discovery.Backend`` over an inventory file. Thread-safe: the agent reads it from worker
    threads while a test injects events from the event loop."""

    def __init__(self, spec: InventoryFile, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._metrics = {g.uuid: g.metrics for g in spec.gpus}
        self._processes = [
            GpuProcess(
                uuid=p.uuid,
                pid=p.pid,
                used_memory_bytes=p.used_memory_mib * MIB,
                sm_util_pct=p.sm_util,
            )
            for p in spec.processes
        ]
        self._timelines = {(p.uuid, p.pid): p.timeline for p in spec.processes if p.timeline}
        self._clock = clock
        self._start = clock()
        self._play: Callable[[float], list[GpuProcess]] | None = None
        self._xids: queue.Queue[XidEvent] = queue.Queue()
        # The MIG instances of each GPU as NVML would list them now: the file's at start, then
        # what ``create_mig`` / ``destroy_mig`` changed (any idle instance can be destroyed).
        self._mig: dict[int, list[RawMig]] = {i: list(g.raw_mig()) for i, g in enumerate(spec.gpus)}
        self._mig_serial = 0
        self.mig_calls: list[tuple[str, int, str, int]] = []  # (op, gpu, profile, start)

    @staticmethod
    def from_file(path: Path) -> FakeBackend:
        return FakeBackend(load_inventory_file(path))

    def sharing(self) -> Sharing:
        return self.spec.sharing_setting()

    def raw(self) -> RawNode:
        raw = self.spec.raw()
        with self._lock:
            gpus = tuple(replace(g, mig=tuple(self._mig.get(g.index, ()))) for g in raw.gpus)
        return replace(raw, gpus=gpus)

    # -- dynamic MIG (draplugin.MigManager, migapply.MigReconfigurer) --------------------------

    def _gpu(self, gpu_index: int) -> FileGpu:
        if not 0 <= gpu_index < len(self.spec.gpus):
            raise KallotError(f"NVML_ERROR_INVALID_ARGUMENT: no GPU {gpu_index}")
        g = self.spec.gpus[gpu_index]
        if not g.mig_enabled:
            raise KallotError(f"NVML_ERROR_NOT_SUPPORTED: GPU {gpu_index} is not in MIG mode")
        return g

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        """Create a MIG instance as NVML would, refusing what NVML refuses: a GPU not in MIG
        mode, a profile the model lacks, a placement that breaks the layout (core.mig rules:
        valid starts, disjoint memory slices, compute, instance counts, one +me)."""
        with self._lock:
            g = self._gpu(gpu_index)
            model = canonical_model(g.name)
            if core_mig.profile(model, profile) is None:
                raise KallotError(f"NVML_ERROR_INVALID_ARGUMENT: {model} has no profile {profile}")
            layout = [(mig_profile(m.name), m.start) for m in self._mig[gpu_index]]
            broken = core_mig.valid_layout(model, [*layout, (profile, start)])
            if broken:
                raise KallotError(f"NVML_ERROR_INSUFFICIENT_RESOURCES: {broken}")
            self._mig_serial += 1
            uuid = f"MIG-{g.uuid.removeprefix('GPU-')[:24]}-{start}{self._mig_serial:04d}"
            self._mig[gpu_index].append(RawMig(name=profile, start=start, uuid=uuid))
            self.mig_calls.append(("create", gpu_index, profile, start))
            return uuid

    def destroy_mig(self, gpu_index: int, start: int) -> None:
        """Destroy the instance placed at ``start`` (from the file or created), as
        ``nvml_mig.NvmlMig`` does: nothing when there is none (destroying is idempotent),
        NVML's IN_USE while a process runs on it."""
        busy = {p.uuid for p in self.processes()}
        with self._lock:
            self._gpu(gpu_index)
            found = [m for m in self._mig[gpu_index] if m.start == start]
            if not found:
                return
            if found[0].uuid in busy:
                raise KallotError(f"NVML_ERROR_IN_USE: processes run on {found[0].uuid}")
            self._mig[gpu_index] = [m for m in self._mig[gpu_index] if m.start != start]
            self.mig_calls.append(("destroy", gpu_index, "", start))

    def mig_layout(self, gpu_index: int) -> list[tuple[str, int]]:
        """The instances of one GPU now, as (profile, start)."""
        with self._lock:
            return [(mig_profile(m.name), m.start) for m in self._mig.get(gpu_index, [])]

    def metrics(self) -> list[GpuMetrics]:
        with self._lock:
            return [
                GpuMetrics(
                    uuid=g.uuid,
                    utilization_pct=self._metrics[g.uuid].utilization,
                    memory_used_bytes=self._metrics[g.uuid].memory_used_mib * MIB,
                    memory_total_bytes=g.memory_mib * MIB,
                    temperature_c=self._metrics[g.uuid].temperature,
                    power_w=self._metrics[g.uuid].power,
                )
                for g in self.spec.gpus
            ]

    def processes(self) -> list[GpuProcess]:
        with self._lock:
            elapsed = self._clock() - self._start
            if self._play is not None:
                return list(self._play(elapsed))
            return [self._at(p, elapsed) for p in self._processes]

    def _at(self, p: GpuProcess, elapsed: float) -> GpuProcess:
        points = self._timelines.get((p.uuid, p.pid), ())
        now = [pt for pt in points if pt[0] <= elapsed]
        if not now:
            return p
        _, mib, sm = now[-1]
        return GpuProcess(uuid=p.uuid, pid=p.pid, used_memory_bytes=mib * MIB, sm_util_pct=sm)

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        events: list[XidEvent] = []
        try:
            events.append(self._xids.get(timeout=timeout_s))
        except queue.Empty:
            return events
        while True:
            try:
                events.append(self._xids.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        return None

    # -- test hooks -----------------------------------------------------------------------------

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Deliver an XID event as NVML's event set would."""
        self._xids.put(XidEvent(uuid=uuid, xid=xid))

    def set_metrics(self, uuid: str, **values: float) -> None:
        """Change one GPU's sample (field names as in the file: utilization, memoryUsedMiB, ...)."""
        with self._lock:
            current = self._metrics[uuid].model_dump(by_alias=True)
            current.update(values)
            self._metrics[uuid] = FileMetrics.model_validate(current)

    def set_processes(self, processes: list[GpuProcess]) -> None:
        with self._lock:
            self._processes = list(processes)

    def play(self, generator: Callable[[float], list[GpuProcess]]) -> None:
        """From now on, the processes are ``generator(seconds since the backend started)``."""
        with self._lock:
            self._play = generator
