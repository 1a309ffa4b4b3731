"""Strict checks of a discovered node inventory, before the agent advertises or publishes it.

``discovery.build_inventory`` calls ``check_inventory`` on every inventory it builds (from NVML
or from an inventory file), so nonsense never reaches the kubelet or the scheduler: duplicate
UUIDs (advertised twice), MIG layouts the core's geometry (``core.mig``) rejects (overlaps,
invalid starts, more than the GPU holds, profiles the model lacks, MIG on a model without
MIG), UUIDs containing the device-ID separator, more device IDs per resource than a
ListAndWatch message can carry, and an inventory annotation larger than the API server takes.
Each failure is one ``ConfigError`` naming the GPU and the field.

The ID cap (``MAX_IDS_PER_RESOURCE``) keeps every ListAndWatch message well under gRPC's 4 MB
default that the kubelet's client uses: a device ID is at most ~70 bytes on the wire (a 40-byte
UUID, ``::`` and a 5-digit unit, health, NUMA topology, framing), so 32,768 IDs are at most
~2.3 MB. It only binds time-slicing oversubscription: an 8-GPU node advertises 8,000 milli IDs
with MPS, 7,952 with every GPU cut into seven 1g instances, and 8,000 x the oversubscription
when time-sliced (at most x4.096 on 8 GPUs). The arithmetic is in docs/node-agent.md.
"""

from __future__ import annotations

from collections import Counter

from kallot.config.inventory import ANNOTATION, NodeInventory
from kallot.core import mig as core_mig
from kallot.core.errors import ConfigError
from kallot.node.allocate import (
    REPLICA_SEP,
    RESOURCE_GPU,
    RESOURCE_MILLI,
    SHARED_MODES,
    mig_milli,
    mig_resource,
    milli_capacity,
)

MAX_IDS_PER_RESOURCE = 32_768
# The API server refuses an object whose annotations together exceed 256 KiB
# (apimachinery's TotalAnnotationSizeLimitB); the inventory leaves room for the others.
MAX_ANNOTATION_BYTES = 256 * 1024 - 16 * 1024


def ids_per_resource(inv: NodeInventory) -> Counter[str]:
    """How many device IDs each resource advertises (``allocate.advertised`` without the list)."""
    out: Counter[str] = Counter()
    for d in inv.devices:
        if d.mode == "mig":
            for m in d.mig:
                out[mig_resource(m.profile)] += 1
                out[RESOURCE_MILLI] += mig_milli(d, m)
            continue
        out[RESOURCE_GPU] += 1
        if d.mode in SHARED_MODES:
            out[RESOURCE_MILLI] += milli_capacity(d.mode, d.oversubscription)
    return out


def check_inventory(inv: NodeInventory, *, strict_mig: bool = True) -> None:
    """Raise ConfigError (``gpus[i].<field>: got ..., expected ...``) for the first fault.
    Without ``strict_mig`` a MIG GPU of a model the core has no profile table for (NVML on an
    A30, say) is not checked against a geometry kallot does not know."""
    seen: dict[str, str] = {}
    for d in inv.devices:
        where = f"gpus[{d.index}]"
        for uuid, field in [(d.uuid, "uuid")] + [
            (m.uuid, f"mig[{k}].uuid") for k, m in enumerate(d.mig) if m.uuid
        ]:
            if REPLICA_SEP in uuid:
                raise ConfigError(
                    f"{where}.{field}", uuid, f"no {REPLICA_SEP!r} (it separates device-ID parts)"
                )
            if uuid in seen:
                raise ConfigError(
                    f"{where}.{field}", uuid, f"a UUID not already used by {seen[uuid]}"
                )
            seen[uuid] = f"{where}.{field}"
        if d.mode != "mig":
            if d.mig:
                raise ConfigError(
                    f"{where}.mig", f"{len(d.mig)} instances", "none on a GPU not in MIG mode"
                )
            continue
        table = core_mig.PROFILES.get(d.model)
        if table is None and not strict_mig:
            continue
        if table is None:
            # The model is what is wrong for MIG (or unknown), not the migEnabled switch.
            raise ConfigError(
                f"{where}.name",
                d.model,
                f"a MIG-capable model for migEnabled: true ({', '.join(sorted(core_mig.PROFILES))})",
            )
        names = [p.name for p in table]
        for k, m in enumerate(d.mig):
            if m.profile not in names:
                raise ConfigError(
                    f"{where}.mig[{k}].name", m.profile, f"a {d.model} profile ({', '.join(names)})"
                )
            p = core_mig.profile(d.model, m.profile)
            assert p is not None
            if m.start not in p.starts:
                raise ConfigError(
                    f"{where}.mig[{k}].start",
                    m.start,
                    f"a valid start of {m.profile} {list(p.starts)}",
                )
        broken = core_mig.valid_layout(d.model, [(m.profile, m.start) for m in d.mig])
        if broken:
            layout = " ".join(f"{m.profile}@{m.start}" for m in d.mig)
            raise ConfigError(f"{where}.mig", layout, f"a valid {d.model} MIG layout ({broken})")
    for resource, n in sorted(ids_per_resource(inv).items()):
        if n > MAX_IDS_PER_RESOURCE:
            raise ConfigError(
                f"sharing ({resource})",
                f"{n} device IDs",
                f"at most {MAX_IDS_PER_RESOURCE} per resource so ListAndWatch stays under 4 MB "
                "(lower the time-slicing oversubscription; docs/node-agent.md)",
            )
    size = len(inv.to_json().encode())
    if size > MAX_ANNOTATION_BYTES:
        raise ConfigError(
            ANNOTATION,
            f"{size} bytes for {len(inv.devices)} GPUs",
            f"at most {MAX_ANNOTATION_BYTES} bytes (the API server's 256 KiB annotation limit)",
        )
