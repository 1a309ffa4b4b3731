"""The NVML backend (``nvidia-ml-py``, module ``pynvml``): reads, never writes.

Kept thin on purpose: each method asks NVML for raw values and hands them to the pure
translation in ``discovery`` (``build_inventory``, ``nvlink_counts``), which the tests cover
with tables. ``pynvml`` is imported inside, so this module imports on a machine without a GPU
or driver. Nothing here changes a GPU setting: no MIG changes, resets, clocks or power limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kallot.core.errors import KallotError
from kallot.node.discovery import (
    GpuMetrics,
    GpuProcess,
    RawGpu,
    RawMig,
    RawNode,
    XidEvent,
    nvlink_counts,
)


class NvmlUnavailable(KallotError):
    """NVML could not be loaded or initialised (no NVIDIA driver on this machine)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """``discovery.Backend`` on NVML."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML could not start ({exc}); is the NVIDIA driver installed? "
                "Use --inventory-file FILE on a machine without GPUs."
            ) from None
        self._nv: Any = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        self._uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._events: Any = None
        self._util_seen: dict[str, int] = {}  # per GPU: NVML timestamp of the last sample read

    # -- discovery ------------------------------------------------------------------------------

    def raw(self) -> RawNode:
        nv = self._nv
        gpus = tuple(self._gpu(i, h) for i, h in enumerate(self._handles))
        n = len(self._handles)
        levels = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                lvl = int(
                    nv.nvmlDeviceGetTopologyCommonAncestor(self._handles[i], self._handles[j])
                )
                levels[i][j] = levels[j][i] = lvl
        remote: list[list[str]] = []
        for h in self._handles:
            links = []
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    links.append(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
                except nv.NVMLError:
                    break  # no (more) NVLinks on this GPU
            remote.append(links)
        p2p = [
            [i != j and _p2p_nvlink(nv, self._handles[i], self._handles[j]) for j in range(n)]
            for i in range(n)
        ]
        nvl = nvlink_counts([g.pci_bus_id for g in gpus], remote, p2p)
        return RawNode(
            driver_version=_text(nv.nvmlSystemGetDriverVersion()),
            cuda_driver_version=int(nv.nvmlSystemGetCudaDriverVersion()),
            gpus=gpus,
            levels=tuple(tuple(r) for r in levels) if n > 1 else (),
            nvlinks=tuple(tuple(r) for r in nvl) if n > 1 else (),
        )

    def _gpu(self, index: int, h: Any) -> RawGpu:
        nv = self._nv
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
            mig_capable, mig_enabled = True, current == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError:
            mig_capable, mig_enabled = False, False
        try:
            numa = int(nv.nvmlDeviceGetNumaNodeId(h))
        except nv.NVMLError:
            numa = -1
        mig: list[RawMig] = []
        if mig_enabled:
            for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nv.NVMLError:
                    continue  # an empty slot
                gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
                mig.append(
                    RawMig(
                        name=_text(nv.nvmlDeviceGetName(m)),
                        start=int(nv.nvmlGpuInstanceGetInfo(gi).placement.start),
                        uuid=_text(nv.nvmlDeviceGetUUID(m)),
                        memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(m).total),
                    )
                )
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        return RawGpu(
            index=index,
            uuid=self._uuids[index],
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
            compute_capability=(int(major), int(minor)),
            pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
            numa=numa,
            mig_enabled=mig_enabled,
            mig_capable=mig_capable,
            mig=tuple(mig),
        )

    # -- metrics --------------------------------------------------------------------------------

    def metrics(self) -> list[GpuMetrics]:
        nv = self._nv
        out = []
        nan = float("nan")
        for uuid, h in zip(self._uuids, self._handles, strict=True):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            # Utilization is NotSupported on a GPU in MIG mode; a value NVML cannot give is NaN.
            rates = _read(nv, nv.nvmlDeviceGetUtilizationRates, h)
            util = nan if rates is None else float(rates.gpu)
            t = _read(nv, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            temp = nan if t is None else float(t)
            mw = _read(nv, nv.nvmlDeviceGetPowerUsage, h)
            power = nan if mw is None else float(mw) / 1000.0
            out.append(
                GpuMetrics(
                    uuid=uuid,
                    utilization_pct=util,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    temperature_c=temp,
                    power_w=power,
                )
            )
        return out

    def processes(self) -> list[GpuProcess]:
        """The compute processes of every GPU; on a GPU in MIG mode, of every MIG instance,
        under the instance's UUID (the one device records name), without SM samples (NVML
        keeps none per process inside MIG instances)."""
        out: list[GpuProcess] = []
        for uuid, h in zip(self._uuids, self._handles, strict=True):
            instances = self._mig_instances(h)
            if instances:
                for mig_uuid, m in instances:
                    out += self._running(mig_uuid, m, None)
            else:
                out += self._running(uuid, h, self._sm_util(uuid, h))
        return out

    def _running(self, uuid: str, h: Any, sm: dict[int, float] | None) -> list[GpuProcess]:
        nv = self._nv
        try:
            running = nv.nvmlDeviceGetComputeRunningProcesses(h)
        except nv.NVMLError:
            return []
        out = []
        for p in running:
            used = p.usedGpuMemory if p.usedGpuMemory is not None else 0
            pid = int(p.pid)
            out.append(
                GpuProcess(
                    uuid=uuid,
                    pid=pid,
                    used_memory_bytes=int(used),
                    sm_util_pct=None if sm is None else sm.get(pid, 0.0),
                )
            )
        return out

    def _mig_instances(self, h: Any) -> list[tuple[str, Any]]:
        """(MIG UUID, handle) of the GPU's instances; [] for a GPU not in MIG mode."""
        nv = self._nv
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError:
            return []
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except nv.NVMLError:
                continue  # an empty slot
            out.append((_text(nv.nvmlDeviceGetUUID(m)), m))
        return out

    def _sm_util(self, uuid: str, h: Any) -> dict[int, float] | None:
        """Mean SM utilization (%) per pid over the samples since the last call; {} when NVML
        has none since then (every process idle); None when the GPU keeps no per-process
        samples (MIG mode, older GPUs)."""
        nv = self._nv
        seen = self._util_seen.get(uuid, 0)
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, seen)
        except nv.NVMLError as exc:
            not_found = getattr(nv, "NVML_ERROR_NOT_FOUND", 6)
            return {} if getattr(exc, "value", None) == not_found else None
        sums: dict[int, tuple[float, int]] = {}
        for smp in samples:
            total, n = sums.get(int(smp.pid), (0.0, 0))
            sums[int(smp.pid)] = (total + float(smp.smUtil), n + 1)
            seen = max(seen, int(smp.timeStamp))
        self._util_seen[uuid] = seen
        return {pid: total / n for pid, (total, n) in sums.items()}

    # -- health ---------------------------------------------------------------------------------

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        nv = self._nv
        if self._events is None:
            self._events = nv.nvmlEventSetCreate()
            for h in self._handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
                except nv.NVMLError:
                    continue  # this GPU cannot report XIDs (e.g. some MIG setups)
        try:
            data = nv.nvmlEventSetWait(self._events, int(timeout_s * 1000))
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return []
            raise
        uuid = _text(nv.nvmlDeviceGetUUID(data.device))
        return [XidEvent(uuid=uuid, xid=int(data.eventData))]

    def close(self) -> None:
        nv = self._nv
        if self._events is not None:
            nv.nvmlEventSetFree(self._events)
            self._events = None
        nv.nvmlShutdown()


def _read(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when NVML cannot answer (NotSupported on this GPU, ...)."""
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _p2p_nvlink(nv: Any, a: Any, b: Any) -> bool:
    try:
        status = nv.nvmlDeviceGetP2PStatus(a, b, nv.NVML_P2P_CAPS_INDEX_NVLINK)
    except nv.NVMLError:
        return False
    return bool(status == nv.NVML_P2P_STATUS_OK)
