"""The device record of a pod (``kallot.io/devices``, ``config.device_record``) in the kube shell:
read from a bound pod, written by the binding with its companions, and mapped back to slots
on the node's current GPUs.

Where it sits: beside ``translate.pod``; the store (``kube.state.store``) reads a bound pod's
record (what it holds), the binder writes ``record_annotations``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kallot.config import device_record, wire
from kallot.core.decision import DeviceAssignment


def pod_record(pod: Mapping[str, Any]) -> device_record.DeviceRecord | None:
    """The device record of a bound pod, or None; ConfigError if it is malformed."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    text = ann.get(wire.ANN_DEVICES)
    if not text:
        return None
    return device_record.DeviceRecord.from_json(text)


def record_annotations(record: device_record.DeviceRecord, now_ns: int) -> dict[str, str]:
    """The annotations the binding writes: the record, ``bind-phase: allocating`` and the
    bind time (unix nanoseconds) the node agent uses to match the pod it admits."""
    return {
        wire.ANN_DEVICES: record.to_json(),
        wire.ANN_BIND_PHASE: "allocating",
        wire.ANN_BIND_TIME: str(now_ns),
    }


def record_to_assignments(
    record: device_record.DeviceRecord, node_uuids: Sequence[str]
) -> tuple[DeviceAssignment, ...]:
    """The record's devices, with slots re-derived from the node's GPU UUIDs (a record names
    GPUs by UUID; the index is a hint). Devices the node no longer has are dropped."""
    by_uuid = {u: i for i, u in enumerate(node_uuids)}
    out = []
    for d in record.assignments():
        slot = by_uuid.get(d.uuid)
        if slot is None:
            continue
        out.append(
            DeviceAssignment(
                slot=slot, uuid=d.uuid, milli=d.milli, mem_mib=d.mem_mib, mode=d.mode, mig=d.mig
            )
        )
    return tuple(out)
