"""The kubelet DRA plugin of driver ``gpu.kallot.io``: registration, prepare/unprepare, health.

Where it sits: the node agent's DRA side, next to the device plugin (``deviceplugin``). The
kubelet finds the plugin through ``plugins_registry/gpu.kallot.io-reg.sock``
(``pluginregistration.Registration``: GetInfo answers type ``DRAPlugin``, the endpoint
``plugins/gpu.kallot.io/dra.sock`` and ``v1.DRAPlugin``) and calls, on that endpoint:

- ``NodePrepareResources`` before a pod's containers start: per claim, read the ResourceClaim
  from the API (``ClaimSource``), check that its allocation names devices of this node's pool
  that the driver publishes (``dra.dra_devices``), validate the opaque config, prepare each
  device (a dynamic MIG placement is created through ``MigManager``), write a CDI spec under
  the CDI directory whose device names are the returned CDI IDs, and answer the IDs;
- ``NodeUnprepareResources`` after they stop: destroy what prepare created, remove the spec;
- ``DRAResourceHealth.NodeWatchResources``: every device's health, then each change; served
  under both of the kubelet's package names, ``v1alpha1`` (the kubelets 1.34-1.36 call) and
  ``v1`` (1.37 on), with the same stream.

Errors are per claim (the response's ``error``): one bad claim never fails the others. Both
calls are idempotent and survive a restart of the agent: what was prepared is in a checkpoint
file (written before a MIG instance is created, so a crash in between still unprepares it).

Long module: prepare, unprepare, the checkpoint and the health stream share the claim state
and its lock; a split would have to pass that state across modules on every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from grpc import aio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kallot.config.errors import config_error
from kallot.config.inventory import NodeInventory
from kallot.core.errors import ConfigError, KallotError
from kallot.node import cdi, dra
from kallot.node.dra import DraDevice, DraOptions
from kallot.node.proto import dra_health_v1_pb2 as hpb
from kallot.node.proto import dra_health_v1_pb2_grpc as hpb_grpc
from kallot.node.proto import dra_health_v1alpha1_pb2 as hpb_alpha
from kallot.node.proto import dra_health_v1alpha1_pb2_grpc as hpb_alpha_grpc
from kallot.node.proto import dra_v1_pb2 as pb
from kallot.node.proto import dra_v1_pb2_grpc as pb_grpc
from kallot.node.proto import pluginregistration_v1_pb2 as rpb
from kallot.node.proto import pluginregistration_v1_pb2_grpc as rpb_grpc

log = logging.getLogger(__name__)

REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
CDI_DIR = Path("/var/run/cdi")
CDI_VENDOR = "k8s.gpu.kallot.io"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
CDI_VERSION = "0.6.0"
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
CONFIG_API_VERSION = "gpu.kallot.io/v1alpha1"
# Device nodes every CUDA container needs besides its GPUs' (the NVIDIA container toolkit's).


class PrepareError(KallotError):
    """One claim cannot be prepared (or unprepared); the message goes to the kubelet."""


class ClaimSource(Protocol):
    """Where prepare reads ResourceClaims (the API server: ``k8s.ApiClaimSource``)."""

    async def claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class MigManager(Protocol):
    """Creates and destroys MIG instances (GPU + compute instance) at a placement. The fake
    backend keeps them in memory; ``nvml_mig.NvmlMig`` calls NVML. Blocking: called from a
    worker thread."""

    def create_mig(self, gpu_index: int, profile: str, start: int) -> str:
        """Create ``profile`` at memory slice ``start``; returns the MIG device UUID."""
        ...

    def destroy_mig(self, gpu_index: int, start: int) -> None:
        """Destroy the instance at ``start``; nothing to do when there is none."""
        ...


# -- opaque per-claim configuration -----------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MpsConfig(_Strict):
    default_active_thread_percentage: int | None = Field(
        default=None, ge=1, le=100, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | None = Field(
        default=None,
        alias="defaultPinnedDeviceMemoryLimit",
        pattern=r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
    )


class SharingConfig(_Strict):
    strategy: Literal["MPS", "TimeSlicing"]
    mps_config: MpsConfig | None = Field(default=None, alias="mpsConfig")


class GpuConfig(_Strict):
    """``devices.config[].opaque.parameters`` for driver gpu.kallot.io (NVIDIA's GpuConfig
    shape under kallot's group)."""

    api_version: Literal["gpu.kallot.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: SharingConfig | None = None


def parse_config(params: Any, where: str) -> GpuConfig:
    """Validate one opaque config; raises PrepareError naming the field, value and expectation."""
    try:
        return GpuConfig.model_validate(params)
    except ValidationError as exc:
        err = config_error(exc)
        raise PrepareError(
            f"{where}.{err.field}: got {err.value}, expected {err.expected}"
        ) from None


_UNITS = {
    "": Decimal(1),
    "K": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity's value ('20Gi' -> 21474836480, '50' -> 50, '500m' -> 0.5)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|K|M|G|T)?", text.strip())
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    try:
        value = Decimal(m.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise ValueError(text) from exc
    unit = m.group(2) or ""
    return value / 1000 if unit == "m" else value * _UNITS[unit]


class Health(NamedTuple):
    """A device's health as NodeWatchResources sends it: ``status`` (HEALTHY / UNHEALTHY, the
    same numbers in both API versions) and ``message`` (why, for people; empty when healthy)."""

    status: int
    message: str


# -- checkpoint ------------------------------------------------------------------------------


@dataclass
class PreparedDevice:
    request: str
    device: str
    cdi_id: str
    share_id: str = ""
    mig_created: tuple[int, int] | None = None  # (gpu index, start) created by this claim


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    state: Literal["preparing", "prepared"]
    devices: list[PreparedDevice] = field(default_factory=list)
    cdi_file: str = ""


class Checkpoint:
    """Prepared claims by UID, in a JSON file rewritten atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = {}
        if path.is_file():
            try:
                self._load(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                raise ConfigError(
                    str(path), type(exc).__name__, "a kallot DRA checkpoint (JSON, version 1)"
                ) from None

    def _load(self, doc: dict[str, Any]) -> None:
        for uid, c in (doc.get("claims") or {}).items():
            devices = [
                PreparedDevice(
                    request=d["request"],
                    device=d["device"],
                    cdi_id=d["cdiId"],
                    share_id=d.get("shareId", ""),
                    mig_created=(int(d["migCreated"][0]), int(d["migCreated"][1]))
                    if d.get("migCreated")
                    else None,
                )
                for d in c.get("devices") or []
            ]
            self.claims[uid] = PreparedClaim(
                c["namespace"], c["name"], c["state"], devices, c.get("cdiFile", "")
            )

    def save(self) -> None:
        doc = {
            "version": 1,
            "claims": {
                uid: {
                    "namespace": c.namespace,
                    "name": c.name,
                    "state": c.state,
                    "cdiFile": c.cdi_file,
                    "devices": [
                        {
                            "request": d.request,
                            "device": d.device,
                            "cdiId": d.cdi_id,
                            "shareId": d.share_id,
                            "migCreated": list(d.mig_created) if d.mig_created else None,
                        }
                        for d in c.devices
                    ],
                }
                for uid, c in sorted(self.claims.items())
            },
        }
        _atomic_write(self.path, json.dumps(doc, indent=1))

    def owned_mig(self) -> set[tuple[int, int]]:
        return {d.mig_created for c in self.claims.values() for d in c.devices if d.mig_created}


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- the driver ------------------------------------------------------------------------------


@dataclass
class DraConfig:
    node: str
    registry_dir: Path = REGISTRY_DIR
    plugins_dir: Path = PLUGINS_DIR
    cdi_dir: Path = CDI_DIR
    mig: dra.MigMode = "dynamic"
    mps_pipe_dir: str = ""
    gpus: frozenset[int] | None = None  # GPU indices served by DRA (None: all)
    sysfs: str = ""  # where to read pcieRoot from ('/sys' on a GPU node; '' = not at all)
    dev_root: Path = cdi.DEV  # where the device nodes are on the host (CDI hostPath; node.cdi)

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / dra.DRIVER

    @property
    def endpoint(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{dra.DRIVER}-reg.sock"


class SlicePublisher(Protocol):
    async def publish(self, slices: list[dict[str, Any]]) -> bool: ...


class DraDriver:
    """State and logic of the plugin; the gRPC servicers below only translate messages."""

    def __init__(
        self,
        config: DraConfig,
        inventory: NodeInventory,
        claims: ClaimSource,
        mig: MigManager | None = None,
        *,
        publisher: SlicePublisher | None = None,
        pcie_roots: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.inventory = inventory
        self.claims = claims
        self.mig = mig
        self.publisher = publisher
        self.pcie_roots = dict(pcie_roots or {})
        self.unhealthy: frozenset[str] = frozenset()
        self.reasons: dict[str, str] = {}
        self.checkpoint = Checkpoint(config.plugin_dir / "checkpoint.json")
        self.registrations: list[rpb.RegistrationStatus] = []
        self._lock = asyncio.Lock()
        self._watchers: list[asyncio.Queue[list[tuple[str, Health]]]] = []
        self._health: dict[str, Health] = self._device_health()
        self._servers: list[aio.Server] = []

    # -- what is published -----------------------------------------------------------------

    def options(self) -> DraOptions:
        return DraOptions(
            node=self.config.node,
            mig=self.config.mig,
            unhealthy=self.unhealthy,
            owned_mig=frozenset(self.checkpoint.owned_mig()),
            pcie_roots=self.pcie_roots,
            gpus=self.config.gpus,
        )

    def devices(self) -> dict[str, DraDevice]:
        return {d.name: d for d in dra.dra_devices(self.inventory, self.options())}

    def slices(self) -> list[dict[str, Any]]:
        return dra.resource_slices(self.inventory, self.options())

    async def publish(self) -> bool:
        if self.publisher is None:
            return False
        return await self.publisher.publish(self.slices())

    async def update(
        self,
        *,
        inventory: NodeInventory | None = None,
        unhealthy: AbstractSet[str] | None = None,
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        """A new inventory or health: publish the slices again and tell the health watchers.
        ``reasons``: why each unhealthy UUID is unhealthy, for the health stream's messages."""
        if inventory is not None:
            self.inventory = inventory
        if unhealthy is not None:
            self.unhealthy = frozenset(unhealthy)
            self.reasons = dict(reasons or {})
        health = self._device_health()
        changed = [(n, h) for n, h in health.items() if self._health.get(n) != h]
        self._health = health
        if changed:
            for q in self._watchers:
                q.put_nowait(changed)
        try:
            await self.publish()
        except Exception as exc:  # the API may be away; the next refresh publishes again
            log.warning("publishing ResourceSlices failed: %s", exc)

    def _device_health(self) -> dict[str, Health]:
        out: dict[str, Health] = {}
        for d in dra.dra_devices(self.inventory, self.options()):
            if dra.unhealthy(d, self.unhealthy):
                what, uuid = f"GPU {d.gpu.uuid}", d.gpu.uuid
                if d.mig_uuid and d.mig_uuid in self.unhealthy:
                    what, uuid = f"MIG instance {d.mig_uuid} of {what}", d.mig_uuid
                why = self.reasons.get(uuid) or "the Node's GPUUnhealthy Event says why"
                out[d.name] = Health(
                    hpb.UNHEALTHY,
                    f"{what} is unhealthy ({why}); it is healthy again after a spell "
                    "without fatal XIDs",
                )
            else:
                out[d.name] = Health(hpb.HEALTHY, "")
        return out

    async def watch_health(self) -> AsyncIterator[list[tuple[str, Health]]]:
        """All devices' health first, then every change, until the caller stops."""
        q: asyncio.Queue[list[tuple[str, Health]]] = asyncio.Queue()
        self._watchers.append(q)
        try:
            yield sorted(self._health.items())
            while True:
                yield await q.get()
        finally:
            self._watchers.remove(q)

    # -- prepare ---------------------------------------------------------------------------

    async def prepare(
        self, claims: Sequence[pb.Claim]
    ) -> dict[str, pb.NodePrepareResourceResponse]:
        out = {}
        for c in claims:
            try:
                async with self._lock:
                    devices = await self._prepare_one(c)
                out[c.uid] = pb.NodePrepareResourceResponse(devices=devices)
            except PrepareError as exc:
                log.warning("prepare %s/%s: %s", c.namespace, c.name, exc)
                out[c.uid] = pb.NodePrepareResourceResponse(error=str(exc))
            except Exception as exc:  # never let one claim fail the others
                log.exception("prepare %s/%s", c.namespace, c.name)
                out[c.uid] = pb.NodePrepareResourceResponse(error=f"{type(exc).__name__}: {exc}")
        return out

    def _answer(self, p: PreparedClaim) -> list[pb.Device]:
        out = []
        for d in p.devices:
            dev = pb.Device(
                request_names=[d.request],
                pool_name=self.config.node,
                device_name=d.device,
                cdi_device_ids=[d.cdi_id],
            )
            if d.share_id:
                dev.share_id = d.share_id
            out.append(dev)
        return out

    async def _prepare_one(self, c: pb.Claim) -> list[pb.Device]:
        where = f"claim {c.namespace}/{c.name}"
        done = self.checkpoint.claims.get(c.uid)
        if done is not None and done.state == "prepared":
            return self._answer(done)
        if done is not None:  # a prepare that did not finish (agent killed): start over
            await self._release(c.uid, done)
        try:
            obj = await self.claims.claim(c.namespace, c.name)
        except KallotError as exc:
            raise PrepareError(f"{where}: reading it from the API failed: {exc}") from None
        uid = (obj.get("metadata") or {}).get("uid", "")
        if uid != c.uid:
            raise PrepareError(f"{where}: has uid {uid!r}, the kubelet asked for {c.uid!r}")
        alloc = (obj.get("status") or {}).get("allocation")
        if not alloc:
            raise PrepareError(f"{where}: not allocated")
        results = [
            r
            for r in ((alloc.get("devices") or {}).get("results") or [])
            if r.get("driver") == dra.DRIVER
        ]
        known = self.devices()
        for k, r in enumerate(results):
            if r.get("pool") != self.config.node:
                raise PrepareError(
                    f"{where}: status.allocation.devices.results[{k}] is device "
                    f"{r.get('device')!r} of pool {r.get('pool')!r}, expected pool "
                    f"{self.config.node!r} (this node)"
                )
            if r.get("device") not in known:
                raise PrepareError(
                    f"{where}: status.allocation.devices.results[{k}].device: got "
                    f"{r.get('device')!r}, expected a device this node publishes"
                )
        configs = self._configs(alloc, where)
        prepared = PreparedClaim(c.namespace, c.name, "preparing")
        plans = []
        for r in results:
            d = known[r["device"]]
            # A subrequest ("gpu/h100") takes its own config, else its request's, else the
            # config for every request.
            req = str(r.get("request", ""))
            cfg = configs.get(req) or configs.get(req.partition("/")[0]) or configs.get("")
            self._check_config(d, cfg, where)
            share = str(r.get("shareID") or "")
            name = f"{c.uid}-{d.name}" + (f"-{share[:8]}" if share else "")
            pd = PreparedDevice(
                request=str(r.get("request", "")),
                device=d.name,
                cdi_id=f"{CDI_KIND}={name}",
                share_id=share,
                mig_created=(d.gpu.index, d.start) if d.kind == "mig-dynamic" else None,
            )
            prepared.devices.append(pd)
            plans.append((pd, d, cfg, r, name))
        # The checkpoint first: an agent killed while creating MIG instances still finds
        # (and destroys) them at unprepare.
        self.checkpoint.claims[c.uid] = prepared
        self.checkpoint.save()
        try:
            cdi_devices = []
            for pd, d, cfg, r, name in plans:
                edits = await self._prepare_device(pd, d, cfg, r, where)
                cdi_devices.append({"name": name, "containerEdits": edits})
            path = self._write_cdi(c.uid, cdi_devices, where)
        except BaseException:
            await self._release(c.uid, prepared)
            raise
        prepared.cdi_file = str(path)
        prepared.state = "prepared"
        self.checkpoint.save()
        return self._answer(prepared)

    def _configs(self, alloc: Mapping[str, Any], where: str) -> dict[str, GpuConfig]:
        """Opaque configs of this driver by request name ('' = every request); a claim's
        config overrides its class's."""
        out: dict[str, GpuConfig] = {}
        entries = (alloc.get("devices") or {}).get("config") or []
        ordered = sorted(enumerate(entries), key=lambda e: e[1].get("source") == "FromClaim")
        for k, entry in ordered:
            opaque = entry.get("opaque") or {}
            if opaque.get("driver") != dra.DRIVER:
                continue
            cfg = parse_config(
                opaque.get("parameters"),
                f"{where}: status.allocation.devices.config[{k}].opaque.parameters",
            )
            for req in entry.get("requests") or [""]:
                out[req] = cfg
        return out

    @staticmethod
    def _check_config(d: DraDevice, cfg: GpuConfig | None, where: str) -> None:
        if cfg is None or cfg.sharing is None:
            return
        mode = {"MPS": "mps", "TimeSlicing": "time-slicing"}[cfg.sharing.strategy]
        if d.kind == "share" and d.gpu.mode != mode:
            raise PrepareError(
                f"{where}: config sharing.strategy: got {cfg.sharing.strategy!r}, but device "
                f"{d.name} is shared by {d.gpu.mode}"
            )
        if d.type == "mig" and mode == "time-slicing":
            raise PrepareError(
                f"{where}: config sharing.strategy: got 'TimeSlicing', expected MPS or none "
                f"for MIG device {d.name}"
            )

    async def _prepare_device(
        self,
        pd: PreparedDevice,
        d: DraDevice,
        cfg: GpuConfig | None,
        result: Mapping[str, Any],
        where: str,
    ) -> dict[str, Any]:
        gpu = d.gpu
        visible = gpu.uuid
        if d.kind == "mig":
            visible = d.mig_uuid
        elif d.kind == "mig-dynamic":
            if self.mig is None:
                raise PrepareError(f"{where}: device {d.name} is dynamic MIG; no MIG manager")
            try:
                visible = await asyncio.to_thread(
                    self.mig.create_mig, gpu.index, d.profile, d.start
                )
            except KallotError as exc:
                raise PrepareError(
                    f"{where}: creating {d.profile}@{d.start} on GPU {gpu.index}: {exc}"
                ) from None
        env = {"NVIDIA_VISIBLE_DEVICES": visible, "KALLOT_DRA_DEVICE": d.name}
        mounts: list[dict[str, Any]] = []
        consumed = result.get("consumedCapacity") or {}
        mps = (d.kind == "share" and gpu.mode == "mps") or (
            cfg is not None and cfg.sharing is not None and cfg.sharing.strategy == "MPS"
        )
        if mps:
            mcfg = cfg.sharing.mps_config if cfg and cfg.sharing else None
            pct = mcfg.default_active_thread_percentage if mcfg else None
            if pct is None and consumed.get("compute"):
                pct = int(quantity(str(consumed["compute"])))
            if pct:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, max(1, pct)))
            limit = mcfg.default_pinned_device_memory_limit if mcfg else None
            limit = limit or consumed.get("memory")
            if limit:
                mib = int(quantity(str(limit)) / (1 << 20))
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
            if self.config.mps_pipe_dir:
                env["CUDA_MPS_PIPE_DIRECTORY"] = self.config.mps_pipe_dir
                mounts.append(
                    {
                        "hostPath": self.config.mps_pipe_dir,
                        "containerPath": self.config.mps_pipe_dir,
                        "options": ["rbind", "rw"],
                    }
                )
        if d.kind == "share" and gpu.mode == "time-slicing":
            env["KALLOT_TIME_SLICE_REPLICAS"] = str(gpu.replicas)
        if pd.share_id:
            env["KALLOT_SHARE_ID"] = pd.share_id
        edits: dict[str, Any] = {
            "env": [f"{k}={v}" for k, v in env.items()],
            "deviceNodes": cdi.device_nodes(gpu.index, self.config.dev_root),
        }
        if mounts:
            edits["mounts"] = mounts
        return edits

    def _cdi_path(self, uid: str) -> Path:
        return self.config.cdi_dir / f"{CDI_VENDOR}-{CDI_CLASS}_{uid}.json"

    def _write_cdi(self, uid: str, devices: list[dict[str, Any]], where: str) -> Path:
        spec = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
        path = self._cdi_path(uid)
        try:
            _atomic_write(path, json.dumps(spec, indent=1))
        except OSError as exc:
            raise PrepareError(
                f"{where}: writing the CDI spec {path} failed ({exc.strerror or exc}); "
                f"expected a writable CDI directory (--cdi-dir)"
            ) from None
        return path

    # -- unprepare -------------------------------------------------------------------------

    async def unprepare(
        self, claims: Sequence[pb.Claim]
    ) -> dict[str, pb.NodeUnprepareResourceResponse]:
        out = {}
        for c in claims:
            try:
                async with self._lock:
                    p = self.checkpoint.claims.get(c.uid)
                    if p is not None:
                        await self._release(c.uid, p)
                out[c.uid] = pb.NodeUnprepareResourceResponse()
            except Exception as exc:
                log.warning("unprepare %s/%s: %s", c.namespace, c.name, exc)
                out[c.uid] = pb.NodeUnprepareResourceResponse(error=str(exc))
        return out

    async def _release(self, uid: str, p: PreparedClaim) -> None:
        """Undo what prepare did (all of it is idempotent), then forget the claim. A placement
        another claim holds is left alone: this claim's create failed there, or never ran."""
        others = {
            d.mig_created
            for other, c in self.checkpoint.claims.items()
            if other != uid
            for d in c.devices
            if d.mig_created
        }
        for d in p.devices:
            if d.mig_created is not None and d.mig_created not in others and self.mig is not None:
                gpu, start = d.mig_created
                await asyncio.to_thread(self.mig.destroy_mig, gpu, start)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            self._cdi_path(uid).unlink()
        self.checkpoint.claims.pop(uid, None)
        self.checkpoint.save()

    # -- gRPC servers ----------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the DRA plugin (and health) on the endpoint, then registration."""
        for sock in (self.config.endpoint, self.config.registration_socket):
            sock.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
        plugin = aio.server()
        pb_grpc.add_DRAPluginServicer_to_server(_DraPlugin(self), plugin)  # type: ignore[no-untyped-call]
        # One stream under both package names: the kubelet asks for the one it knows.
        hpb_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, hpb), plugin)  # type: ignore[no-untyped-call]
        hpb_alpha_grpc.add_DRAResourceHealthServicer_to_server(_Health(self, hpb_alpha), plugin)  # type: ignore[no-untyped-call]
        plugin.add_insecure_port(f"unix://{self.config.endpoint}")
        await plugin.start()
        reg = aio.server()
        rpb_grpc.add_RegistrationServicer_to_server(_Registration(self), reg)  # type: ignore[no-untyped-call]
        reg.add_insecure_port(f"unix://{self.config.registration_socket}")
        await reg.start()
        self._servers = [plugin, reg]

    async def stop(self) -> None:
        for s in self._servers:
            await s.stop(grace=0)
        self._servers = []
        for sock in (self.config.endpoint, self.config.registration_socket):
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()


class _Registration(rpb_grpc.RegistrationServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def GetInfo(  # noqa: N802 - the gRPC method name
        self, request: rpb.InfoRequest, context: Any
    ) -> rpb.PluginInfo:
        return rpb.PluginInfo(
            type=PLUGIN_TYPE,
            name=dra.DRIVER,
            endpoint=str(self.driver.config.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(  # noqa: N802 - the gRPC method name
        self, request: rpb.RegistrationStatus, context: Any
    ) -> rpb.RegistrationStatusResponse:
        self.driver.registrations.append(request)
        if not request.plugin_registered:
            log.error("the kubelet refused the DRA plugin: %s", request.error)
        return rpb.RegistrationStatusResponse()


class _DraPlugin(pb_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(  # noqa: N802 - the gRPC method name
        self, request: pb.NodePrepareResourcesRequest, context: Any
    ) -> pb.NodePrepareResourcesResponse:
        return pb.NodePrepareResourcesResponse(claims=await self.driver.prepare(request.claims))

    async def NodeUnprepareResources(  # noqa: N802 - the gRPC method name
        self, request: pb.NodeUnprepareResourcesRequest, context: Any
    ) -> pb.NodeUnprepareResourcesResponse:
        return pb.NodeUnprepareResourcesResponse(claims=await self.driver.unprepare(request.claims))


class _Health:
    """``NodeWatchResources`` in the messages of ``api`` (``dra_health_v1_pb2`` or
    ``dra_health_v1alpha1_pb2``: the same fields and enum numbers under two package names)."""

    def __init__(self, driver: DraDriver, api: Any) -> None:
        self.driver = driver
        self.api = api

    async def NodeWatchResources(  # noqa: N802 - the gRPC method name
        self, request: Any, context: Any
    ) -> AsyncIterator[Any]:
        api, pool = self.api, self.driver.config.node
        async for batch in self.driver.watch_health():
            now = int(time.time())
            yield api.NodeWatchResourcesResponse(
                devices=[
                    api.DeviceHealth(
                        device=api.DeviceIdentifier(pool_name=pool, device_name=name),
                        health=h.status,
                        last_updated_time=now,
                        message=h.message,
                    )
                    for name, h in batch
                ]
            )
